package rolestest

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/admin"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/migrations"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// A cursor relay connected as the relay role, with
// migrations/roles.example.sql then migrations/cursor/roles.example.sql
// applied: it creates the lanes' positions, delivers the writer's events,
// moves a poison one to the parked table and requeues it, deletes delivered
// rows past Retention, and still cannot delete a row that waits nor insert
// an event that was not parked.
func TestCursorRolesScript(t *testing.T) {
	t.Parallel()
	r := newRoles(t)
	ctx := context.Background()
	mig := r.pool(t, r.migrator)
	tbl := r.schema(t, mig)
	if err := migrations.Cursor.Up(ctx, mig, tbl); err != nil {
		t.Fatalf("Cursor.Up as the migration role: %v", err)
	}
	if err := r.apply(t, tbl, readScript(t)); err != nil {
		t.Fatalf("%s: %v", scriptFile, err)
	}
	b, err := fs.ReadFile(migrations.Cursor.FS(), "roles.example.sql")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.apply(t, tbl, string(b)); err != nil {
		t.Fatalf("cursor/roles.example.sql as the migration role: %v", err)
	}
	writer, relayDB := r.pool(t, r.writer), r.pool(t, r.relay)
	uow, err := unitofwork.New(writer, &unitofwork.Config{Service: "svc", Table: tbl})
	if err != nil {
		t.Fatal(err)
	}
	brokers := testenv.Brokers(t)
	topic := testenv.Topic(t, brokers, 2)
	write := func(topic string) uuid.UUID {
		t.Helper()
		id := uuid.Must(uuid.NewV7())
		err := uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
			return tx.Add(ctx, outbox.Event{ID: id, AggregateType: "order", AggregateID: "o-1", Type: "order.placed.v1", Topic: topic})
		})
		if err != nil {
			t.Fatalf("writer: %v", err)
		}
		return id
	}
	write(topic)
	// A row the writer's checks would refuse, written by hand.
	poison := uuid.Must(uuid.NewV7())
	if _, err := r.admin.Exec(ctx, "INSERT INTO "+sqlname.Ident(tbl)+" (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key)"+
		" VALUES ($1, 'order', 'o-1', 'order.placed.v1', '{}', 'not a topic!', 'o-1')", poison); err != nil {
		t.Fatal(err)
	}
	write(topic)
	pub, err := relay.NewSaramaPublisher(brokers, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	rl, err := relay.New(relayDB, pub, &relay.Config{Table: tbl, Progress: relay.ProgressCursor, Retention: time.Millisecond, CleanupInterval: 20 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := rl.Start(ctx); err != nil {
		t.Fatalf("Start as the relay role: %v", err)
	}
	defer func() { _ = rl.Stop(ctx) }()
	count := func(where string) int {
		t.Helper()
		var n int
		if err := r.admin.QueryRow(ctx, "SELECT count(*) FROM "+sqlname.Ident(tbl)+" WHERE "+where).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	parked := func() int {
		t.Helper()
		var n int
		if err := r.admin.QueryRow(ctx, "SELECT count(*) FROM "+sqlname.Ident(sqlname.Parked(tbl))+" WHERE event_id = $1", poison).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// The poison event moves to the parked table (a copy, then a delete of
	// its row, which the relay's policy allows for a row with its copy).
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		left, moved := count("true"), parked()
		return left == 0 && moved == 1, fmt.Sprintf("as the relay role: %d rows left in the table, %d parked; want the delivered ones deleted and the poison moved to the parked table", left, moved)
	})
	// Requeued as the relay role (as outboxctl connects): written back
	// into the table (its policy lets the relay insert a parked event).
	if n, err := admin.Requeue(ctx, relayDB, tbl, admin.Filter{EventIDs: []uuid.UUID{poison}}, nil); err != nil || n != 1 {
		t.Fatalf("Requeue as the relay role: %d, %v", n, err)
	}
	if count("event_id = '"+poison.String()+"'") != 1 || parked() != 0 {
		t.Errorf("after the requeue as the relay role: %d rows of the event in the table, %d parked; want 1 and 0", count("event_id = '"+poison.String()+"'"), parked())
	}
	// Nor may it insert an event that is not parked.
	if _, err := relayDB.Exec(ctx, "INSERT INTO "+sqlname.Ident(tbl)+" (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key)"+
		" VALUES ($1, 'order', 'o-1', 'order.placed.v1', '{}', 'x', 'o-1')", uuid.Must(uuid.NewV7())); err == nil {
		t.Errorf("the relay role inserted an event that was not parked")
	}
	// A waiting row is not the relay's to delete.
	_ = rl.Stop(ctx)
	waiting := write(topic)
	tag, err := relayDB.Exec(ctx, "DELETE FROM "+sqlname.Ident(tbl)+" WHERE event_id = $1", waiting)
	if err != nil || tag.RowsAffected() != 0 {
		t.Errorf("the relay role deleted a waiting row: %v rows, %v", tag.RowsAffected(), err)
	}
}
