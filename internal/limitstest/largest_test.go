package limitstest

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/fxoutbox"
	"github.com/fxoutbox/outbox/internal/record"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// largestPayload returns the largest payload of the form {"blob": "xxx"}
// that Prepare accepts for e with the default limits, found by bisection
// over Prepare itself. The form is jsonb's own output, so the payload the
// relay reads back is byte for byte the one written.
func largestPayload(t *testing.T, e outbox.Event, trace map[string]string) []byte {
	t.Helper()
	return largestPayloadWithin(t, e, trace, outbox.Limits{})
}

// largestPayloadWithin is largestPayload under limits (with their defaults).
func largestPayloadWithin(t *testing.T, e outbox.Event, trace map[string]string, limits outbox.Limits) []byte {
	t.Helper()
	payload := func(n int) []byte { return []byte(`{"blob": "` + strings.Repeat("x", n) + `"}`) }
	fits := func(n int) bool {
		e.Payload = payload(n)
		_, err := record.Prepare(e, "svc", nil, record.LimitsWithDefaults(limits), trace)
		if err != nil && !errors.Is(err, outbox.ErrInvalidEvent) {
			t.Fatal(err)
		}
		return err == nil
	}
	lo, hi := 0, 2<<20 // fits(lo), !fits(hi)
	if !fits(lo) || fits(hi) {
		t.Fatal("bisection bounds do not hold")
	}
	for hi-lo > 1 {
		if mid := (lo + hi) / 2; fits(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return payload(lo)
}

// tracing installs an SDK tracer provider as the global one, so the relay
// (with its defaults) starts real publish spans and sends a traceparent, as
// in production, and returns a context inside a request span.
func tracing(t *testing.T) context.Context {
	t.Helper()
	tp := sdktrace.NewTracerProvider()
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	ctx, span := tp.Tracer("test").Start(context.Background(), "request")
	t.Cleanup(func() {
		span.End()
		otel.SetTracerProvider(prev)
		_ = tp.Shutdown(context.Background())
	})
	return ctx
}

// The largest event Add accepts with the default limits is published by a
// relay with relay.New's defaults and sarama's default producer settings,
// and read back from Kafka with the payload byte for byte; one byte more is
// refused at Add with ErrInvalidEvent. Before, Add accepted payloads up to
// 1,032,192 bytes while the relay refused (parked) records over 1,000,000.
// Run it on kfake and on Apache Kafka, whose topics keep the broker's
// default max.message.bytes.
func TestLargestEventReachesKafka(t *testing.T) {
	ctx := tracing(t)
	pool := testenv.Pool(t)
	tbl := testenv.Table(t, pool)
	brokers := testenv.Brokers(t)
	topic := testenv.Topic(t, brokers, 1)
	cons := testenv.Consume(t, brokers, topic)

	uow, err := unitofwork.New(pool, &unitofwork.Config{Table: tbl}) // default limits
	if err != nil {
		t.Fatal(err)
	}
	e := outbox.Event{AggregateType: "order", AggregateID: "o-largest", Type: "order.placed.v1", Topic: topic,
		Headers: map[string]string{"tenant": "acme"}}
	payload := largestPayload(t, e, traceHeaders(ctx))
	t.Logf("largest payload accepted: %d bytes", len(payload))
	if len(payload) < 1_000_000 {
		t.Fatalf("largest payload is %d bytes: the limits leave far less than a megabyte", len(payload))
	}

	more := append(bytes.Clone(payload[:len(payload)-2]), `x"}`...)
	e.Payload = more
	err = uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error { return tx.Add(ctx, e) })
	requireRefused(t, "one byte more", err, "Payload")

	e.Payload = payload
	if err := uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error { return tx.Add(ctx, e) }); err != nil {
		t.Fatal(err)
	}
	pub, err := relay.NewSaramaPublisher(brokers, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	r, err := relay.New(pool, pub, &relay.Config{Table: tbl}) // every other setting at its default
	if err != nil {
		t.Fatal(err)
	}
	if r.Config().MaxMessageBytes != outbox.DefaultMaxRecordBytes {
		t.Errorf("relay MaxMessageBytes default = %d, want outbox.DefaultMaxRecordBytes", r.Config().MaxMessageBytes)
	}
	if _, err := r.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	requirePublished(t, pool, tbl)
	requireConsumed(t, cons, payload)
}

// The same through the fxoutbox module with its defaults: the writer and
// the relay it builds share the one size setting.
func TestLargestEventReachesKafkaThroughFx(t *testing.T) {
	ctx := tracing(t)
	pool := testenv.Pool(t)
	tbl := testenv.Table(t, pool)
	brokers := testenv.Brokers(t)
	topic := testenv.Topic(t, brokers, 1)
	cons := testenv.Consume(t, brokers, topic)

	var uow *unitofwork.UnitOfWork
	app := fxtest.New(t, fx.NopLogger,
		fx.Supply(pool, fxoutbox.Config{Table: tbl, Brokers: brokers, DisableListen: true, DisableNotify: true, Writer: unitofwork.Config{Service: "svc"}}),
		fxoutbox.Module, fx.Populate(&uow))
	app.RequireStart()
	defer app.RequireStop()

	e := outbox.Event{AggregateType: "order", AggregateID: "o-largest", Type: "order.placed.v1", Topic: topic}
	payload := largestPayload(t, e, traceHeaders(ctx))
	e.Payload = append(bytes.Clone(payload[:len(payload)-2]), `x"}`...)
	err := uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error { return tx.Add(ctx, e) })
	requireRefused(t, "one byte more", err, "Payload")
	e.Payload = payload
	if err := uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error { return tx.Add(ctx, e) }); err != nil {
		t.Fatal(err)
	}
	requireConsumed(t, cons, payload)
	requirePublished(t, pool, tbl)
}

// traceHeaders returns the trace context the unit of work stores for ctx,
// with its default propagator.
func traceHeaders(ctx context.Context) map[string]string {
	c := propagation.MapCarrier{}
	propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}).Inject(ctx, c)
	return c
}

func requireConsumed(t *testing.T, cons *testenv.Consumer, payload []byte) {
	t.Helper()
	msgs := cons.WaitFor(1, 60*time.Second)
	if !bytes.Equal(msgs[0].Value, payload) {
		t.Fatalf("consumed a value of %d bytes, want the %d-byte payload byte for byte", len(msgs[0].Value), len(payload))
	}
	if string(msgs[0].Key) != "o-largest" || testenv.Header(msgs[0], "traceparent") == "" {
		t.Errorf("consumed key %q, traceparent %q", msgs[0].Key, testenv.Header(msgs[0], "traceparent"))
	}
}

func requirePublished(t *testing.T, pool *pgxpool.Pool, tbl outbox.Table) {
	t.Helper()
	testenv.Eventually(t, time.Minute, func() (bool, string) {
		var published, parked int
		err := pool.QueryRow(context.Background(), "SELECT count(published_at), count(parked_at) FROM "+sqlname.Ident(tbl)).Scan(&published, &parked)
		if err != nil {
			t.Fatal(err)
		}
		if parked > 0 {
			var reason string
			_ = pool.QueryRow(context.Background(), "SELECT last_error FROM "+sqlname.Ident(tbl)+" WHERE parked_at IS NOT NULL").Scan(&reason)
			t.Fatalf("the relay parked the event: %s", reason)
		}
		return published == 1, "the event is not marked published"
	})
}
