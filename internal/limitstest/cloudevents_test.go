package limitstest

import (
	"bytes"
	"context"
	"testing"

	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/fxoutbox"
	"github.com/fxoutbox/outbox/internal/record"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// With CloudEvents binary mode, the writer counts the relay's ce_ headers:
// the largest event Add accepts is published by a relay in that mode with
// the default MaxMessageBytes (not parked, not refused by the broker's
// default limit) and read back byte for byte, its record exactly as large
// as Add counted it but for the ce_time the writer counts at its widest;
// one byte more is refused at Add.
func TestLargestCloudEventReachesKafka(t *testing.T) {
	ctx := tracing(t)
	pool := testenv.Pool(t)
	tbl := testenv.Table(t, pool)
	brokers := testenv.Brokers(t)
	topic := testenv.Topic(t, brokers, 1)
	cons := testenv.Consume(t, brokers, topic)

	ce := outbox.CloudEvents{Mode: outbox.CloudEventsBinary, Source: "/order-service"}
	limits := outbox.Limits{CloudEvents: ce}
	uow, err := unitofwork.New(pool, &unitofwork.Config{Table: tbl, Limits: limits})
	if err != nil {
		t.Fatal(err)
	}
	e := outbox.Event{AggregateType: "order", AggregateID: "o-largest", Type: "order.placed.v1", Topic: topic,
		Headers: map[string]string{"tenant": "acme", "ce_subject": "o-largest"}}
	payload := largestPayloadWithin(t, e, traceHeaders(ctx), limits)
	t.Logf("largest payload accepted in CloudEvents binary mode: %d bytes", len(payload))

	e.Payload = append(bytes.Clone(payload[:len(payload)-2]), `x"}`...)
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
	r, err := relay.New(pool, pub, &relay.Config{Table: tbl, CloudEvents: ce}) // MaxMessageBytes at its default
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	requirePublished(t, pool, tbl)
	requireConsumed(t, cons, payload)
	requireCloudEventAtLimit(t, cons, "/order-service", outbox.DefaultMaxRecordBytes)
}

// The same through the fxoutbox module: OUTBOX_CLOUDEVENTS=binary reaches
// the writer's limits and the relay, with the source "/<service>".
func TestLargestCloudEventReachesKafkaThroughFx(t *testing.T) {
	ctx := tracing(t)
	pool := testenv.Pool(t)
	tbl := testenv.Table(t, pool)
	brokers := testenv.Brokers(t)
	topic := testenv.Topic(t, brokers, 1)
	cons := testenv.Consume(t, brokers, topic)

	var uow *unitofwork.UnitOfWork
	app := fxtest.New(t, fx.NopLogger,
		fx.Supply(pool, fxoutbox.Config{Table: tbl, Brokers: brokers, DisableListen: true, DisableNotify: true, Writer: unitofwork.Config{Service: "svc"}, Relay: relay.Config{CloudEvents: outbox.CloudEvents{Mode: outbox.CloudEventsBinary}}}),
		fxoutbox.Module, fx.Populate(&uow))
	app.RequireStart()
	defer app.RequireStop()

	e := outbox.Event{AggregateType: "order", AggregateID: "o-largest", Type: "order.placed.v1", Topic: topic}
	payload := largestPayloadWithin(t, e, traceHeaders(ctx), outbox.Limits{CloudEvents: outbox.CloudEvents{Mode: outbox.CloudEventsBinary, Source: "/svc"}})
	e.Payload = append(bytes.Clone(payload[:len(payload)-2]), `x"}`...)
	err := uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error { return tx.Add(ctx, e) })
	requireRefused(t, "one byte more", err, "Payload")
	e.Payload = payload
	if err := uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error { return tx.Add(ctx, e) }); err != nil {
		t.Fatal(err)
	}
	requireConsumed(t, cons, payload)
	requirePublished(t, pool, tbl)
	requireCloudEventAtLimit(t, cons, "/svc", outbox.DefaultMaxRecordBytes)
}

// requireCloudEventAtLimit checks the consumed record's CloudEvents headers
// and that its size, as record.Bytes counts it, is limit less the
// bytes by which its ce_time is shorter than the widest one Add counts.
func requireCloudEventAtLimit(t *testing.T, cons *testenv.Consumer, source string, limit int) {
	t.Helper()
	m := cons.Messages()[0]
	for name, want := range map[string]string{
		"ce_specversion": "1.0", "ce_id": testenv.Header(m, "x-event-id"), "ce_source": source,
		"ce_type": "order.placed.v1", "content-type": "application/json",
	} {
		if got := testenv.Header(m, name); got != want || got == "" {
			t.Errorf("header %s = %q, want %q", name, got, want)
		}
	}
	headerBytes := 0
	for _, h := range m.Headers {
		headerBytes += len(h.Key) + len(h.Value)
	}
	size := record.Bytes(len(m.Key), len(m.Value), len(m.Headers), headerBytes)
	slack := len("2006-01-02T15:04:05.999999999Z") - len(testenv.Header(m, "ce_time"))
	if size != limit-slack {
		t.Errorf("the record is %d bytes as record.Bytes counts it (%d headers), want %d: the limit %d less the %d bytes ce_time is shorter than counted",
			size, len(m.Headers), limit-slack, limit, slack)
	}
}
