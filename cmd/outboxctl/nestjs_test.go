package main

import (
	"context"
	"testing"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/nestjs"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/migrations"
)

// On a table taken over from the NestJS relay, whose rows have no headers
// (NULL), status, parked list, parked show and replay work as on any other.
func TestNestJSRows(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	w := &world{t: t, ctx: context.Background(), pool: pool, table: outbox.Table{Schema: testenv.Name("nestjs_")}}
	nestjs.Fill(t, nestjs.Create(t, pool, w.table.Schema), 20, 4, 5, "order-service.order.confirmed")
	if err := migrations.Outbox.Up(w.ctx, pool, w.table); err != nil {
		t.Fatal(err)
	}
	var eventID string
	if err := pool.QueryRow(w.ctx, "UPDATE "+sqlname.Ident(w.table)+" SET parked_at = now(), attempts = 5, last_error = 'kafka: message too large'"+
		" WHERE id = 4 RETURNING event_id::text").Scan(&eventID); err != nil {
		t.Fatal(err)
	}
	w.want(w.run("", false, "status"), exitOK, "Backlog   14 events waiting", "Parked    1 event")
	w.want(w.run("", false, "parked", "list"), exitOK, eventID)
	r := w.run("", false, "parked", "show", eventID)
	w.want(r, exitOK, eventID, "order-3", "kafka: message too large", `"eventType": "OrderConfirmed.v1"`)
	if shown := decode[map[string]any](t, w.run("", false, "parked", "show", eventID, "--json").stdout); shown["event_id"] != eventID || shown["headers"] != nil {
		t.Fatalf("parked show --json: %v", shown)
	}
	w.want(w.run("", false, "replay", "--key", "order-0", "--yes"), exitOK, "replayed 3 published events")
	if n := w.count("published_at IS NULL AND parked_at IS NULL"); n != 17 {
		t.Fatalf("%d rows waiting after the replay, want 14 + 3", n)
	}
}
