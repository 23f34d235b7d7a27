package inbox_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/inbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/unitofwork"
)

// The process span continues the producer's trace (traceparent header) with
// the messaging attributes; an event the handler adds carries the same
// trace; a record without traceparent is applied on a trace of its own.
// The metrics count what happened.
func TestTraceAndMetrics(t *testing.T) {
	t.Parallel()
	modes(t, 1, func(t *testing.T, e *env) {
		const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
		// Under BatchSize: one worker, and a slow first record, so that the
		// two below are applied in a batch (with it or after it), each on
		// its own trace.
		var lead []ev
		if e.batch > 1 {
			lead = e.produce(ev{Key: "slow"})
		}
		recs := e.produce(
			ev{Key: "a", Traceparent: "00-" + traceID + "-" + parentID + "-01"},
			ev{Key: "b"},
		)
		e.produce(recs[0]) // a duplicate

		spans := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
		reader := sdkmetric.NewManualReader()
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		t.Cleanup(func() { _ = tp.Shutdown(context.Background()); _ = mp.Shutdown(context.Background()) })

		effect := e.effect("t")
		g := group()
		cfg := e.config(g, func(ctx context.Context, tx unitofwork.Tx, m *inbox.Message) error {
			if string(m.Key) == "slow" {
				time.Sleep(300 * time.Millisecond)
			}
			if err := effect(ctx, tx, m); err != nil {
				return err
			}
			return tx.Add(ctx, outbox.Event{Topic: "billing.invoice.created", AggregateType: "invoice", AggregateID: string(m.Key),
				Type: "invoice.created.v1", Payload: map[string]string{"for": m.ID}})
		})
		cfg.TracerProvider, cfg.MeterProvider = tp, mp
		if e.batch > 1 {
			cfg.Concurrency = 1
		}
		e.start(cfg)
		eventually(t, 60*time.Second, "every record committed", func() bool { return e.committed(g, 1)[0] == int64(3+len(lead)) })
		e.checkOnce(append(lead, recs...))

		var withParent, root sdktrace.ReadOnlySpan
		for _, s := range spans.Ended() {
			if s.Name() != "process "+e.topic {
				continue
			}
			if s.SpanKind() != trace.SpanKindConsumer {
				t.Errorf("span kind %v, want consumer", s.SpanKind())
			}
			attrs := map[attribute.Key]attribute.Value{}
			for _, a := range s.Attributes() {
				attrs[a.Key] = a.Value
			}
			for k, want := range map[attribute.Key]string{
				"messaging.system": "kafka", "messaging.destination.name": e.topic, "messaging.consumer.group.name": g,
				"messaging.destination.partition.id": "0", "messaging.operation.type": "process",
			} {
				if attrs[k].AsString() != want {
					t.Errorf("span attribute %s = %q, want %q", k, attrs[k].AsString(), want)
				}
			}
			if _, ok := attrs["messaging.kafka.offset"]; !ok {
				t.Errorf("span has no messaging.kafka.offset")
			}
			switch {
			case attrs["messaging.message.id"].AsString() == recs[0].ID && attrs["outbox.inbox.outcome"].AsString() == "applied":
				withParent = s
			case attrs["messaging.message.id"].AsString() == recs[1].ID:
				root = s
			}
		}
		if withParent == nil || root == nil {
			t.Fatalf("missing process spans among %d", len(spans.Ended()))
		}
		if got := withParent.Parent(); got.TraceID().String() != traceID || got.SpanID().String() != parentID || !got.IsRemote() {
			t.Errorf("process span's parent %v, want the record's traceparent", got)
		}
		if root.Parent().IsValid() {
			t.Errorf("a record without traceparent got parent %v", root.Parent())
		}
		if e.batch > 1 {
			for _, sp := range []sdktrace.ReadOnlySpan{withParent, root} {
				var n int64
				for _, a := range sp.Attributes() {
					if a.Key == "outbox.inbox.batch_size" {
						n = a.Value.AsInt64()
					}
				}
				if n < 2 {
					t.Errorf("span of %s: outbox.inbox.batch_size %d, want it applied in a batch with the other", sp.SpanContext().SpanID(), n)
				}
			}
		}

		// The event the handler added continues the trace.
		var headers []byte
		err := e.pool.QueryRow(context.Background(), `SELECT headers FROM `+sqlname.Ident(e.table)+` WHERE aggregate_id = 'a'`).Scan(&headers)
		if err != nil {
			t.Fatal(err)
		}
		var hs map[string]string
		_ = json.Unmarshal(headers, &hs)
		if !strings.Contains(hs["traceparent"], traceID) || !strings.Contains(hs["traceparent"], withParent.SpanContext().SpanID().String()) {
			t.Errorf("the added event's traceparent %q is not the process span's (trace %s)", hs["traceparent"], traceID)
		}

		var rm metricdata.ResourceMetrics
		if err := reader.Collect(context.Background(), &rm); err != nil {
			t.Fatal(err)
		}
		outcomes := map[string]int64{}
		names := map[string]bool{}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				names[m.Name] = true
				if m.Name != inbox.MetricProcessed {
					continue
				}
				for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
					o, _ := dp.Attributes.Value("outbox.inbox.outcome")
					outcomes[o.AsString()] += dp.Value
				}
			}
		}
		if outcomes["applied"] != int64(2+len(lead)) || outcomes["duplicate"] != 1 {
			t.Errorf("processed by outcome %v, want %d applied and 1 duplicate", outcomes, 2+len(lead))
		}
		for _, n := range []string{inbox.MetricConsumedMessages, inbox.MetricProcessDuration, inbox.MetricAge, inbox.MetricLag, inbox.MetricParked} {
			if !names[n] {
				t.Errorf("metric %s not reported (have %v)", n, names)
			}
		}
	})
}
