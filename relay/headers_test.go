package relay_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

var reservedNames = []string{
	outbox.HeaderEventID, outbox.HeaderEventType, "traceparent", "tracestate", "baggage",
}

// Consumers deduplicate by x-event-id and route by x-event-type, so nothing
// but the outbox may set them (nor the trace context headers). An event's
// headers with a reserved name, in any case, are refused by Add; a row
// written by hand with such headers is published with the outbox's own
// values, never the stored ones. Stored headers that are not an object are
// not sent at all: the row is parked.
func TestForgedReservedHeadersNeverReachKafka(t *testing.T) {
	t.Parallel()
	s := newSetup(t)

	// Through the unit of work: refused, and nothing is stored.
	for _, name := range reservedNames {
		for _, variant := range []string{name, strings.ToUpper(name), strings.ToUpper(name[:1]) + name[1:]} {
			err := s.uow.Do(s.ctx, func(ctx context.Context, tx unitofwork.Tx) error {
				return tx.Add(ctx, outbox.Event{AggregateType: "order", AggregateID: "o-1", Type: "order.placed.v1", Topic: "h.topic",
					Headers: map[string]string{"tenant": "acme", variant: "forged"}})
			})
			var ee *outbox.EventError
			if !errors.Is(err, outbox.ErrInvalidEvent) || !errors.As(err, &ee) || ee.Field != "Headers" || !strings.Contains(err.Error(), variant) {
				t.Errorf("Add with header %q: err = %v, want an EventError on Headers naming it", variant, err)
			}
		}
	}
	if n := s.unpublished(t); n != 0 {
		t.Fatalf("refused events left %d rows", n)
	}

	// Rows written by hand, bypassing Add.
	s.write(t, "h.topic", 1, 1) // a normal event, for comparison
	storedTraceID := "4bf92f3577b34da6a3ce929d0e0e4736"
	storedParent := "00-" + storedTraceID + "-00f067aa0ba902b7-01"
	forged := s.insertWithHeaders(t, `{
		"x-event-id": "00000000-0000-0000-0000-00000000f0f0", "X-Event-ID": "forged-id", "X-EVENT-ID": "forged-id",
		"x-event-type": "forged.type", "X-Event-Type": "forged.type",
		"traceparent": "forged-traceparent", "TraceParent": "00-ffffffffffffffffffffffffffffffff-ffffffffffffffff-01",
		"tracestate": "forged=1", "TraceState": "forged=1", "Baggage": "forged=1", "BAGGAGE": "forged=1",
		"tenant": "acme"}`)
	traced := s.insertWithHeaders(t, `{"traceparent": "`+storedParent+`", "tenant": "acme"}`)
	notObject := s.insertWithHeaders(t, `"x-event-id: forged"`)

	var mu sync.Mutex
	var got []relay.Message
	pub := relay.PublisherFunc(func(_ context.Context, msgs []relay.Message) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, msgs...)
		return nil
	})
	tp := sdktrace.NewTracerProvider()
	defer func() { _ = tp.Shutdown(context.Background()) }()
	if n, err := s.relay(t, pub, relay.Config{TracerProvider: tp}).RunOnce(s.ctx); err != nil || n != 3 {
		t.Fatalf("RunOnce = %d, %v; want 3 published (and the row whose headers are not an object parked)", n, err)
	}
	if _, parked, _, _ := s.row(t, notObject); !parked {
		t.Error("the row whose headers are a JSON string was not parked")
	}
	mu.Lock()
	defer mu.Unlock()
	byID := map[uuid.UUID]relay.Message{}
	for _, m := range got {
		byID[m.EventID] = m
		counts := map[string]int{}
		for _, h := range m.Headers {
			counts[strings.ToLower(h.Key)]++
			if strings.Contains(string(h.Value), "forged") || strings.Contains(string(h.Value), "ffffffff") {
				t.Errorf("event %s: header %s carries a forged value %q", m.EventID, h.Key, h.Value)
			}
		}
		for _, name := range reservedNames {
			if counts[name] > 1 {
				t.Errorf("event %s: %d headers named %s (any case): %s", m.EventID, counts[name], name, headerList(m))
			}
		}
		if header(m, outbox.HeaderEventID) != m.EventID.String() || counts[outbox.HeaderEventID] != 1 || counts[outbox.HeaderEventType] != 1 {
			t.Errorf("event %s: x-event-id %q, headers %s", m.EventID, header(m, outbox.HeaderEventID), headerList(m))
		}
		if sc := trace.SpanContextFromContext(extract(m)); !sc.IsValid() {
			t.Errorf("event %s: no valid traceparent of the relay's publish span", m.EventID)
		}
	}
	if len(byID) != 3 || byID[forged].EventID != forged || byID[traced].EventID != traced {
		t.Fatalf("published %v, want the normal event and the two rows with object headers", got)
	}
	if m := byID[forged]; header(m, outbox.HeaderEventType) != "h.raw" || header(m, "tenant") != "acme" {
		t.Errorf("forged row: x-event-type %q (want the column's h.raw), tenant %q", header(m, outbox.HeaderEventType), header(m, "tenant"))
	}
	// A stored (lowercase) traceparent is the writer's trace context: the
	// relay continues its trace but sends its own span's id, not the value.
	m := byID[traced]
	if sc := trace.SpanContextFromContext(extract(m)); sc.TraceID().String() != storedTraceID || header(m, "traceparent") == storedParent {
		t.Errorf("traced row: traceparent %q, want trace %s with the relay's span", header(m, "traceparent"), storedTraceID)
	}
}

// insertWithHeaders writes a row the way a hand-written INSERT could, with
// headers as given (JSON), and returns its event id.
func (s *setup) insertWithHeaders(t *testing.T, headers string) uuid.UUID {
	t.Helper()
	id := uuid.Must(uuid.NewV7())
	_, err := s.pool.Exec(s.ctx, "INSERT INTO "+sqlname.Ident(s.table)+
		" (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, headers) VALUES ($1, 'a', $2, 'h.raw', '{}', 'h.topic', $2, $3::jsonb)",
		id, id.String(), headers)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func headerList(m relay.Message) string {
	var b strings.Builder
	for _, h := range m.Headers {
		b.WriteString(h.Key + "=" + string(h.Value) + " ")
	}
	return b.String()
}

func header(m relay.Message, name string) string {
	for _, h := range m.Headers {
		if h.Key == name {
			return string(h.Value)
		}
	}
	return ""
}

// extract reads the W3C trace context from m's headers.
func extract(m relay.Message) context.Context {
	carrier := propagation.MapCarrier{}
	for _, h := range m.Headers {
		carrier[h.Key] = string(h.Value)
	}
	return propagation.TraceContext{}.Extract(context.Background(), carrier)
}
