package outboxtest_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/outboxtest"
	"github.com/fxoutbox/outbox/unitofwork"
)

// recorded returns a recorder holding p-1 captured, p-1 refunded and p-2
// captured, in that order.
func recorded(t *testing.T) *outboxtest.Recorder {
	t.Helper()
	rec := newRecorder(t, payService)
	refunded := outbox.Event{AggregateType: "payment", AggregateID: "p-1", Type: "payment.refunded.v1",
		Payload: json.RawMessage(`{"id": "p-1", "cents": 500}`), Headers: map[string]string{"tenant": "t1"}}
	err := rec.Do(context.Background(), func(ctx context.Context, tx unitofwork.Tx) error {
		return tx.Add(ctx, captured("p-1"), refunded, captured("p-2"))
	})
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

func TestRequireEvent(t *testing.T) {
	rec := recorded(t)
	ft := &fakeT{}

	ev := outboxtest.RequireEvent(ft, rec, outboxtest.Want{Type: "payment.captured.v1", Key: "p-2"})
	ft.passed(t)
	if ev.AggregateID != "p-2" {
		t.Fatalf("RequireEvent returned %+v, want the event of p-2", ev)
	}
	ev = outboxtest.RequireEvent(ft, rec, outboxtest.Want{Type: "payment.refunded.v1", AggregateType: "payment", AggregateID: "p-1",
		Topic: "payment-service.payment.refunded", Key: "p-1", Headers: map[string]string{"tenant": "t1"}})
	ft.passed(t)
	if ev.Type != "payment.refunded.v1" {
		t.Fatalf("RequireEvent returned %+v", ev)
	}
	// The payload compares as JSON: key order and spacing do not matter.
	outboxtest.RequireEvent(ft, rec, outboxtest.Want{Type: "payment.refunded.v1", Payload: map[string]any{"cents": 500, "id": "p-1"}})
	ft.passed(t)
	outboxtest.RequireEvent(ft, rec, outboxtest.Want{Type: "payment.refunded.v1", Payload: json.RawMessage(`{"cents":500,"id":"p-1"}`)})
	ft.passed(t)

	outboxtest.RequireEvent(ft, rec, outboxtest.Want{Type: "payment.failed.v1"})
	ft.failed(t, "no event matches", `Type="payment.failed.v1"`, "recorded 3", `Type is "payment.captured.v1", want "payment.failed.v1"`)
	outboxtest.RequireEvent(ft, rec, outboxtest.Want{Type: "payment.captured.v1"})
	ft.failed(t, "2 events match", "exactly one")
	outboxtest.RequireEvent(ft, rec, outboxtest.Want{Type: "payment.captured.v1", Key: "p-3"})
	ft.failed(t, `Key is "p-1", want "p-3"`, `Key is "p-2", want "p-3"`)
	outboxtest.RequireEvent(ft, rec, outboxtest.Want{Type: "payment.refunded.v1", Topic: "refunds"})
	ft.failed(t, `Topic is "payment-service.payment.refunded", want "refunds"`)
	outboxtest.RequireEvent(ft, rec, outboxtest.Want{Type: "payment.refunded.v1", AggregateType: "order"})
	ft.failed(t, `AggregateType is "payment", want "order"`)
	outboxtest.RequireEvent(ft, rec, outboxtest.Want{Type: "payment.refunded.v1", AggregateID: "p-9"})
	ft.failed(t, `AggregateID is "p-1", want "p-9"`)
	outboxtest.RequireEvent(ft, rec, outboxtest.Want{Type: "payment.refunded.v1", Headers: map[string]string{"tenant": "t2"}})
	ft.failed(t, `header "tenant" is "t1", want "t2"`)
	outboxtest.RequireEvent(ft, rec, outboxtest.Want{Type: "payment.refunded.v1", Headers: map[string]string{"region": "eu"}})
	ft.failed(t, `header "region" is missing`)
	outboxtest.RequireEvent(ft, rec, outboxtest.Want{Type: "payment.refunded.v1", Payload: map[string]any{"cents": 501, "id": "p-1"}})
	ft.failed(t, `Payload is "{\"id\": \"p-1\", \"cents\": 500}", want "{\"cents\":501,\"id\":\"p-1\"}"`)
	outboxtest.RequireEvent(ft, rec, outboxtest.Want{Type: "payment.refunded.v1", Payload: json.RawMessage(`{`)})
	ft.failed(t, "Want.Payload is not valid JSON")

	outboxtest.RequireEvent(ft, newRecorder(t, payService), outboxtest.Want{Type: "payment.captured.v1"})
	ft.failed(t, "no event matches", "recorded none")
}

func TestRequireEvents(t *testing.T) {
	rec := recorded(t)
	ft := &fakeT{}
	evs := outboxtest.RequireEvents(ft, rec,
		outboxtest.Want{Type: "payment.captured.v1", Key: "p-1"},
		outboxtest.Want{Type: "payment.refunded.v1"},
		outboxtest.Want{Type: "payment.captured.v1", Key: "p-2"})
	ft.passed(t)
	if len(evs) != 3 || evs[2].Key != "p-2" {
		t.Fatalf("RequireEvents returned %+v", evs)
	}

	// Order matters.
	outboxtest.RequireEvents(ft, rec,
		outboxtest.Want{Type: "payment.captured.v1", Key: "p-2"},
		outboxtest.Want{Type: "payment.refunded.v1"},
		outboxtest.Want{Type: "payment.captured.v1", Key: "p-1"})
	ft.failed(t, "recorded 3 events, want 3", `0: {Type="payment.captured.v1"`, `Key is "p-1", want "p-2"`, `Key is "p-2", want "p-1"`)
	// So does every event: one left over fails, one missing fails.
	outboxtest.RequireEvents(ft, rec, outboxtest.Want{Type: "payment.captured.v1"}, outboxtest.Want{Type: "payment.refunded.v1"})
	ft.failed(t, "recorded 3 events, want 2", "2: ", "is not expected")
	outboxtest.RequireEvents(ft, rec, outboxtest.Want{}, outboxtest.Want{}, outboxtest.Want{}, outboxtest.Want{Type: "payment.voided.v1"})
	ft.failed(t, "recorded 3 events, want 4", `3: missing, want {Type="payment.voided.v1"}`)
}

func TestRequireNoEvents(t *testing.T) {
	ft := &fakeT{}
	outboxtest.RequireNoEvents(ft, newRecorder(t, payService))
	ft.passed(t)
	outboxtest.RequireNoEvents(ft, recorded(t))
	ft.failed(t, "recorded 3 events, want none", `Type="payment.refunded.v1"`)
}

func TestPayload(t *testing.T) {
	rec := recorded(t)
	ft := &fakeT{}
	ev := outboxtest.RequireEvent(ft, rec, outboxtest.Want{Type: "payment.refunded.v1"})
	type refunded struct {
		ID    string `json:"id"`
		Cents int    `json:"cents"`
	}
	got := outboxtest.Payload[refunded](ft, ev)
	ft.passed(t)
	if got != (refunded{ID: "p-1", Cents: 500}) {
		t.Fatalf("Payload = %+v", got)
	}
	outboxtest.Payload[[]string](ft, ev)
	ft.failed(t, "does not decode into []string", `payload "{\"id\": \"p-1\", \"cents\": 500}"`)
}

// Failure messages quote what they show and cut long values.
func TestFailureMessagesCutLongValues(t *testing.T) {
	rec := newRecorder(t, payService)
	long := strings.Repeat("x", 1000) + "\x01" // under the 1024-byte limit of AggregateID
	_ = rec.Do(context.Background(), func(ctx context.Context, tx unitofwork.Tx) error {
		return tx.Add(ctx, outbox.Event{AggregateType: "payment", AggregateID: long, Type: "payment.captured.v1"})
	})
	ft := &fakeT{}
	outboxtest.RequireNoEvents(ft, rec)
	if len(ft.fatals) != 1 || len(ft.fatals[0]) > 1000 || !strings.Contains(ft.fatals[0], "(1001 bytes)") || strings.Contains(ft.fatals[0], "\x01") {
		t.Fatalf("message not cut and quoted: %d bytes: %.300q", len(ft.fatals[0]), ft.fatals)
	}
}
