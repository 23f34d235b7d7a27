package relay_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

var cloudEventsNames = []string{
	outbox.HeaderCloudEventsSpecVersion, outbox.HeaderCloudEventsID, outbox.HeaderCloudEventsSource,
	outbox.HeaderCloudEventsType, outbox.HeaderCloudEventsTime, outbox.HeaderContentType,
}

// With CloudEvents binary mode, every record the relay sends, by polling
// and by streaming, carries the binding's headers (ce_specversion 1.0,
// ce_id = x-event-id, ce_source, ce_type = x-event-type, ce_time = the
// row's created_at, content-type application/json) once each, next to the
// outbox's own headers and the event's. A stored header of one of those
// names (a row written by hand) is replaced by the relay's; other ce_
// headers (ce_subject) are the event's and pass.
func TestCloudEventsBinaryHeaders(t *testing.T) {
	t.Parallel()
	for _, mode := range []relay.Mode{relay.Poll, relay.Stream} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			s := newSetup(t)
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
			cfg := relay.Config{TracerProvider: tp, CloudEvents: outbox.CloudEvents{Mode: outbox.CloudEventsBinary, Source: "/order-service"}}
			var r *relay.Relay
			if mode == relay.Stream {
				s.streaming(t)
				c := streamConfig()
				c.CloudEvents, c.TracerProvider = cfg.CloudEvents, tp
				r = s.streamRelay(t, pub, c)
			} else {
				r = s.relay(t, pub, cfg)
			}

			added := uuid.Must(uuid.NewV7())
			err := s.uow.Do(s.ctx, func(ctx context.Context, tx unitofwork.Tx) error {
				return tx.Add(ctx, outbox.Event{ID: added, AggregateType: "order", AggregateID: "o-1", Type: "order.placed.v1",
					Topic: "h.topic", Payload: map[string]string{"id": "o-1"}, Headers: map[string]string{"ce_subject": "o-1", "tenant": "acme"}})
			})
			if err != nil {
				t.Fatal(err)
			}
			forged := s.insertWithHeaders(t, `{"ce_id": "forged", "CE_SOURCE": "forged", "ce_type": "forged", "ce_time": "forged",
				"Content-Type": "text/forged", "ce_specversion": "0.3", "ce_subject": "raw", "tenant": "acme"}`)
			if mode == relay.Poll {
				if n, err := r.RunOnce(s.ctx); err != nil || n != 2 {
					t.Fatalf("RunOnce = %d, %v; want 2", n, err)
				}
			} else {
				waitUntil(t, 30*time.Second, "both events streamed", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) >= 2 })
			}
			mu.Lock()
			defer mu.Unlock()
			if len(got) != 2 {
				t.Fatalf("published %d messages, want 2: %v", len(got), got)
			}
			for _, m := range got {
				counts := map[string]int{}
				for _, h := range m.Headers {
					counts[strings.ToLower(h.Key)]++
					if strings.Contains(string(h.Value), "forged") {
						t.Errorf("event %s: header %s carries the stored value %q", m.EventID, h.Key, h.Value)
					}
				}
				for _, name := range cloudEventsNames {
					if counts[name] != 1 {
						t.Errorf("event %s: %d headers named %s (any case), want 1: %s", m.EventID, counts[name], name, headerList(m))
					}
				}
				var createdAt time.Time
				if err := s.pool.QueryRow(s.ctx, "SELECT created_at FROM "+sqlname.Ident(s.table)+" WHERE event_id = $1", m.EventID).Scan(&createdAt); err != nil {
					t.Fatal(err)
				}
				ceTime, err := time.Parse(time.RFC3339Nano, header(m, outbox.HeaderCloudEventsTime))
				want := map[string]string{
					outbox.HeaderCloudEventsSpecVersion: "1.0",
					outbox.HeaderCloudEventsID:          m.EventID.String(),
					outbox.HeaderEventID:                m.EventID.String(),
					outbox.HeaderCloudEventsSource:      "/order-service",
					outbox.HeaderCloudEventsType:        header(m, outbox.HeaderEventType),
					outbox.HeaderContentType:            "application/json",
					"tenant":                            "acme",
				}
				for name, v := range want {
					if header(m, name) != v {
						t.Errorf("event %s: %s = %q, want %q", m.EventID, name, header(m, name), v)
					}
				}
				if err != nil || !ceTime.Equal(createdAt) || !strings.HasSuffix(header(m, outbox.HeaderCloudEventsTime), "Z") {
					t.Errorf("event %s: ce_time %q (%v), want created_at %s in RFC 3339, UTC", m.EventID, header(m, outbox.HeaderCloudEventsTime), err, createdAt.UTC().Format(time.RFC3339Nano))
				}
				if sc := trace.SpanContextFromContext(extract(m)); !sc.IsValid() {
					t.Errorf("event %s: no traceparent next to the CloudEvents headers", m.EventID)
				}
				switch m.EventID {
				case added:
					if header(m, "ce_subject") != "o-1" || header(m, outbox.HeaderEventType) != "order.placed.v1" {
						t.Errorf("added event: ce_subject %q, x-event-type %q", header(m, "ce_subject"), header(m, outbox.HeaderEventType))
					}
				case forged:
					if header(m, "ce_subject") != "raw" || header(m, outbox.HeaderCloudEventsType) != "h.raw" {
						t.Errorf("row written by hand: ce_subject %q, ce_type %q (want the column's h.raw)", header(m, "ce_subject"), header(m, outbox.HeaderCloudEventsType))
					}
				default:
					t.Errorf("published an unknown event %s", m.EventID)
				}
			}
		})
	}
}

// Off by default: the records carry no CloudEvents headers but those an
// event set itself.
func TestCloudEventsOffByDefault(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	var got []relay.Message
	pub := relay.PublisherFunc(func(_ context.Context, msgs []relay.Message) error { got = append(got, msgs...); return nil })
	r := s.relay(t, pub, relay.Config{})
	if r.Config().CloudEvents.Mode != outbox.CloudEventsOff {
		t.Errorf("default CloudEvents mode = %v, want off", r.Config().CloudEvents.Mode)
	}
	s.write(t, "h.topic", 1, 1)
	if n, err := r.RunOnce(s.ctx); err != nil || n != 1 {
		t.Fatalf("RunOnce = %d, %v", n, err)
	}
	for _, name := range cloudEventsNames {
		if header(got[0], name) != "" {
			t.Errorf("header %s sent with CloudEvents off: %s", name, headerList(got[0]))
		}
	}
}

// An unknown mode, or binary mode without a usable source, is refused by
// New with a ConfigError naming the setting and its variable.
func TestCloudEventsConfigErrors(t *testing.T) {
	pub := relay.PublisherFunc(func(context.Context, []relay.Message) error { return nil })
	for _, c := range []struct {
		ce         outbox.CloudEvents
		field, say string
	}{
		{outbox.CloudEvents{Mode: 7}, "CloudEvents.Mode", "OUTBOX_CLOUDEVENTS=off or binary"},
		{outbox.CloudEvents{Mode: outbox.CloudEventsBinary}, "CloudEvents.Source", "OUTBOX_CLOUDEVENTS_SOURCE"},
		{outbox.CloudEvents{Mode: outbox.CloudEventsBinary, Source: "/order service"}, "CloudEvents.Source", "white space"},
		{outbox.CloudEvents{Mode: outbox.CloudEventsBinary, Source: "http://[::1"}, "CloudEvents.Source", "not a URI-reference"},
		{outbox.CloudEvents{Mode: outbox.CloudEventsBinary, Source: "/" + strings.Repeat("s", 1024)}, "CloudEvents.Source", "over 1024"},
	} {
		_, err := relay.New(dbFunc(nil), pub, &relay.Config{CloudEvents: c.ce})
		var ce *outbox.ConfigError
		if !errors.As(err, &ce) || ce.Field != c.field || !strings.Contains(err.Error(), c.say) {
			t.Errorf("CloudEvents %+v: err = %v, want a ConfigError on %s saying %q", c.ce, err, c.field, c.say)
		}
	}
	for _, src := range []string{"/order-service", "urn:acme:order-service", "https://acme.example/orders"} {
		if _, err := relay.New(dbFunc(nil), pub, &relay.Config{CloudEvents: outbox.CloudEvents{Mode: outbox.CloudEventsBinary, Source: src}}); err != nil {
			t.Errorf("source %q refused: %v", src, err)
		}
	}
}
