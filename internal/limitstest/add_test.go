package limitstest

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/unitofwork"
)

type writer struct {
	pool *pgxpool.Pool
	tbl  outbox.Table
	uow  *unitofwork.UnitOfWork
}

func newWriter(t *testing.T, limits outbox.Limits) *writer {
	t.Helper()
	pool := testenv.Pool(t)
	tbl := testenv.Table(t, pool)
	uow, err := unitofwork.New(pool, &unitofwork.Config{Service: "svc", Table: tbl, Limits: limits})
	if err != nil {
		t.Fatal(err)
	}
	return &writer{pool: pool, tbl: tbl, uow: uow}
}

// add records e in a transaction of its own and returns Do's error.
func (w *writer) add(e outbox.Event) error {
	return w.uow.Do(context.Background(), func(ctx context.Context, tx unitofwork.Tx) error {
		return tx.Add(ctx, e)
	})
}

func (w *writer) rows(t *testing.T) int {
	t.Helper()
	var n int
	if err := w.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+sqlname.Ident(w.tbl)).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func event(payload any) outbox.Event {
	return outbox.Event{AggregateType: "order", AggregateID: "o-1", Type: "order.placed.v1", Payload: payload}
}

// requireRefused checks that err is an *outbox.EventError on field whose
// message names the field and is short and free of control bytes.
func requireRefused(t *testing.T, name string, err error, field string) {
	t.Helper()
	var ee *outbox.EventError
	if !errors.Is(err, outbox.ErrInvalidEvent) || !errors.As(err, &ee) {
		t.Errorf("%s: Do = %v, want an *outbox.EventError matching ErrInvalidEvent", name, err)
		return
	}
	msg := err.Error()
	if ee.Field != field || !strings.Contains(msg, field) {
		t.Errorf("%s: error on field %q (%s), want %s", name, ee.Field, msg, field)
	}
	if len(msg) > 600 || strings.IndexFunc(msg, unicode.IsControl) >= 0 {
		t.Errorf("%s: message of %d bytes, or with control characters: %q", name, len(msg), msg[:min(len(msg), 600)])
	}
}

// A payload whose numbers jsonb prints in full: 74 KB as given, about 1 GB
// once stored. Before, Add took it, the row was stored and every claim that
// read it failed with "out of memory" (SQLSTATE 54000). A 10-byte
// [1e131071] is 131 KB as stored: the payload limit applies to that.
func TestAddRefusesPayloadsThatExpandWhenStored(t *testing.T) {
	w := newWriter(t, outbox.Limits{})
	bomb := "[" + strings.Repeat("1e131071,", 8199) + "1e131071]"
	requireRefused(t, "74 KB of 1e131071", w.add(event(json.RawMessage(bomb))), "Payload")

	small := newWriter(t, outbox.Limits{MaxPayloadBytes: 100_000})
	requireRefused(t, "[1e131071] under a 100 KB payload limit", small.add(event(json.RawMessage("[1e131071]"))), "Payload")
	// Large numbers as such are fine while they fit.
	if err := small.add(event(json.RawMessage("[1e90000]"))); err != nil {
		t.Errorf("[1e90000] (90 KB stored): %v", err)
	}
	if n := w.rows(t) + small.rows(t); n != 1 {
		t.Errorf("%d rows stored, want only the one that fits", n)
	}
}

// Payloads that PostgreSQL's jsonb refuses fail at Add with
// ErrInvalidEvent. Before, Add took them and Do failed at commit with
// SQLSTATE 22P05, 22021 or 22P02, which handlers cannot tell from an
// outage.
func TestAddRefusesPayloadsPostgresRefuses(t *testing.T) {
	w := newWriter(t, outbox.Limits{})
	for _, c := range []struct {
		name    string
		payload any
	}{
		{"NUL escape in raw JSON", json.RawMessage(`{"name":"a\u0000b"}`)},
		{"NUL in a Go string", map[string]string{"name": "a\x00b"}},
		{"NUL in a Go map key", map[string]int{"k\x00": 1}},
		{"invalid UTF-8 in raw JSON", json.RawMessage("{\"name\":\"\xff\xfe\"}")},
		{"lone high surrogate", json.RawMessage(`{"name":"\ud800"}`)},
		{"lone low surrogate", json.RawMessage(`["\udc00"]`)},
		{"two high surrogates", json.RawMessage(`"\ud800\ud800"`)},
		{"number over numeric's range", json.RawMessage(`{"n":1e131072}`)},
		{"number with too many decimals", json.RawMessage(`{"n":1e-16384}`)},
		{"exponent over numeric's range", json.Number("1e1073741823")},
	} {
		requireRefused(t, c.name, w.add(event(c.payload)), "Payload")
	}
	if n := w.rows(t); n != 0 {
		t.Errorf("%d rows stored, want none", n)
	}
}

// Type, AggregateType, AggregateID and Key have limits; a refusal names the
// field and never echoes the value raw: a Type of 2 MB with a NUL in it
// appears quoted and cut in the message. Before, 2 MB values were stored and
// parked later, with the whole event_type in the relay's log line, and
// EventError printed the Type as it was.
func TestAddRefusesLongTextFields(t *testing.T) {
	w := newWriter(t, outbox.Limits{})
	long := "order.\x00" + strings.Repeat("x", 2<<20)
	for _, c := range []struct {
		field string
		edit  func(*outbox.Event)
	}{
		{"Type", func(e *outbox.Event) { e.Type = long }},
		{"Type", func(e *outbox.Event) { e.Type = strings.Repeat("t", 256) }},
		{"AggregateType", func(e *outbox.Event) { e.AggregateType = strings.Repeat("a", 2<<20) }},
		{"AggregateID", func(e *outbox.Event) { e.AggregateID = strings.Repeat("i", 2<<20) }},
		{"AggregateID", func(e *outbox.Event) { e.AggregateID = strings.Repeat("i", 1025) }},
		{"Key", func(e *outbox.Event) { e.Key = strings.Repeat("k", 2<<20) }},
	} {
		e := event(map[string]int{"n": 1})
		c.edit(&e)
		requireRefused(t, c.field, w.add(e), c.field)
	}
	// At the limits, the event is stored.
	e := event(map[string]int{"n": 1})
	e.Type, e.AggregateType, e.AggregateID, e.Key = strings.Repeat("t", 255), strings.Repeat("a", 255), strings.Repeat("i", 1024), strings.Repeat("k", 1024)
	e.Topic = "limits"
	if err := w.add(e); err != nil {
		t.Errorf("fields at their limits: %v", err)
	}
	if n := w.rows(t); n != 1 {
		t.Errorf("%d rows stored, want 1", n)
	}
}
