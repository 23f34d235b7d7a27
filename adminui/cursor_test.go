package adminui_test

import (
	"encoding/json"
	"net/url"
	"testing"

	"github.com/google/uuid"

	"github.com/fxoutbox/outbox/adminui"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/migrations"
)

// On a table in cursor mode (relay.ProgressCursor) the overview counts what
// the lanes' positions have yet to deliver, and an event the positions
// passed reads as published although its published_at is NULL.
func TestCursorTable(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	if err := migrations.Cursor.Up(s.ctx, s.pool, s.table); err != nil {
		t.Fatal(err)
	}
	cur := sqlname.Ident(sqlname.Cursor(s.table))
	// Every lane delivered up to now: the rows already there are behind.
	s.exec(t, "INSERT INTO "+cur+" (lane, lanes, done, base) SELECT g, 4, pg_current_snapshot(), 0 FROM generate_series(0, 3) g")
	delivered := uuid.Must(uuid.NewV7())
	s.exec(t, "INSERT INTO "+sqlname.Ident(s.table)+" (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key)"+
		" VALUES ($1, 'order', 'o', 'order.created.v1', '{}', 'orders', 'k')", delivered)
	s.exec(t, "UPDATE "+cur+" SET done = pg_current_snapshot()")
	for range 2 { // waiting
		s.exec(t, "INSERT INTO "+sqlname.Ident(s.table)+" (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key)"+
			" VALUES (gen_random_uuid(), 'order', 'o', 'order.created.v1', '{}', 'orders', 'k')")
	}
	code, b, _ := s.do(t, "GET", "api/overview", operateToken, nil)
	if code != 200 {
		t.Fatalf("api/overview: %d %s", code, b)
	}
	var o adminui.Overview
	if err := json.Unmarshal(b, &o); err != nil {
		t.Fatal(err)
	}
	if len(o.Tables) != 1 || o.Tables[0].Status.Backlog != 2 {
		t.Errorf("overview of a cursor table: %+v; want a backlog of 2", o.Tables)
	}
	code, b, _ = s.do(t, "GET", "api/event?table="+url.QueryEscape(s.table.String())+"&id="+delivered.String(), operateToken, nil)
	if code != 200 {
		t.Fatalf("api/event: %d %s", code, b)
	}
	var e struct {
		Event adminui.Event `json:"event"`
	}
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatal(err)
	}
	if e.Event.State != "published" {
		t.Errorf("an event the lanes delivered reads as %q, want published (%s)", e.Event.State, b)
	}
}
