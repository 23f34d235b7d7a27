package migrations_test

import (
	"context"
	"testing"

	"github.com/google/uuid"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/tablesql"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/migrations"
)

// The cursor migrations on a mixed-case table: Cursor.Up creates the parked
// table, is idempotent, and moves the events parked in their rows once the
// table is in cursor mode (its lanes have positions), not before; Cursor.Down
// puts the parked events back in their rows (their ids kept) and drops what
// Cursor.Up added.
func TestUpDownCursorParked(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	ctx := context.Background()
	tbl := outbox.Table{Schema: testenv.Name("mc_"), Name: "Events"}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA "`+tbl.Schema+`" CASCADE`) })
	if err := migrations.Outbox.Up(ctx, pool, tbl); err != nil {
		t.Fatal(err)
	}
	exists := func(what string) bool {
		t.Helper()
		var ok bool
		if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", what).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	column := func(name string) bool {
		t.Helper()
		var ok bool
		if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_attribute WHERE attrelid = $1::regclass AND attname = $2 AND NOT attisdropped)", sqlname.Ident(tbl), name).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	parked := sqlname.Parked(tbl)
	if sqlname.Ident(parked) != `"`+tbl.Schema+`"."Events_parked"` {
		t.Fatalf("ParkedTable = %s", sqlname.Ident(parked))
	}
	// An event parked in its row (marks mode).
	ev := uuid.Must(uuid.NewV7())
	var rowID int64
	if err := pool.QueryRow(ctx, "INSERT INTO "+sqlname.Ident(tbl)+" (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, headers, attempts, last_error, parked_at)"+
		" VALUES ($1, 'order', 'o-1', 'order.placed.v1', '{\"a\":1}', 'orders', 'o-1', '{\"x-a\":\"b\"}', 5, '[kafka.message_too_large] too large', now()) RETURNING id", ev).Scan(&rowID); err != nil {
		t.Fatal(err)
	}
	inPlace := func() (n int) {
		t.Helper()
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+sqlname.Ident(tbl)+" WHERE event_id = $1 AND parked_at IS NOT NULL AND id = $2 AND attempts = 5", ev, rowID).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	moved := func() (n int) {
		t.Helper()
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+sqlname.Ident(parked)+" WHERE event_id = $1 AND id = $2 AND attempts = 5"+
			" AND reason = '[kafka.message_too_large] too large' AND payload = '{\"a\":1}' AND headers = '{\"x-a\":\"b\"}' AND topic = 'orders'", ev, rowID).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for range 2 { // idempotent
		if err := migrations.Cursor.Up(ctx, pool, tbl); err != nil {
			t.Fatal(err)
		}
	}
	if !exists(sqlname.Ident(parked)) || !column("first_failed_at") || !column("txid") {
		t.Fatalf("after Cursor.Up: parked table %v, first_failed_at %v, txid %v", exists(sqlname.Ident(parked)), column("first_failed_at"), column("txid"))
	}
	if inPlace() != 1 || moved() != 0 {
		t.Fatalf("in marks mode (no positions) the parked row must stay in place: in place %d, moved %d", inPlace(), moved())
	}
	// In cursor mode, Cursor.Up (the parked migration, applied to a table
	// that was already in cursor mode) moves it.
	if _, err := pool.Exec(ctx, "INSERT INTO "+sqlname.Ident(sqlname.Cursor(tbl))+" (lane, lanes, done, base) VALUES (0, 1, pg_current_snapshot(), 0)"); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Cursor.Up(ctx, pool, tbl); err != nil {
		t.Fatal(err)
	}
	if inPlace() != 0 || moved() != 1 {
		t.Fatalf("in cursor mode the parked row must move: in place %d, moved %d", inPlace(), moved())
	}
	if err := migrations.Cursor.Down(ctx, pool, tbl, 0); err != nil {
		t.Fatal(err)
	}
	if exists(sqlname.Ident(parked)) || exists(sqlname.Ident(sqlname.Cursor(tbl))) || column("first_failed_at") || column("txid") {
		t.Fatalf("after Cursor.Down: parked table %v, positions %v, first_failed_at %v, txid %v",
			exists(sqlname.Ident(parked)), exists(sqlname.Ident(sqlname.Cursor(tbl))), column("first_failed_at"), column("txid"))
	}
	if inPlace() != 1 {
		t.Fatalf("after Cursor.Down the parked event must be back in its row, with its id")
	}
	if err := migrations.Outbox.Check(ctx, pool, tbl); err != nil {
		t.Fatalf("after Cursor.Down: %v", err)
	}
}

// Install gives a table it creates the cursor migration, in the same
// transaction, and leaves a table that exists in its progress; pods
// starting at once all find the table with its cursor migration.
func TestInstallGivesNewTablesTheCursor(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	ctx := context.Background()
	hasCursor := func(tbl outbox.Table) bool {
		t.Helper()
		var ok bool
		if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL",
			sqlname.Ident(sqlname.Cursor(tbl)), sqlname.Ident(sqlname.Parked(tbl))).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}

	fresh := outbox.Table{Schema: testenv.Name("inst_")}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA "+fresh.Schema+" CASCADE") })
	results := make(chan bool, 4)
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			created, err := migrations.Install(ctx, pool, fresh)
			results <- created
			errs <- err
		}()
	}
	made := 0
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
		if <-results {
			made++
		}
	}
	if made != 1 {
		t.Errorf("%d of 4 concurrent Installs reported creating the table, want 1", made)
	}
	if !hasCursor(fresh) {
		t.Error("a table Install created has no cursor migration")
	}
	// Marked as cursor from the start: relays on Progress auto record cursor
	// progress on it before any relay has.
	if migrated, on, err := tablesql.ForCursor(ctx, pool, fresh); err != nil || !migrated || !on {
		t.Errorf("ForCursor on a table Install created: %v, %v, %v; want true, true", migrated, on, err)
	}
	if err := migrations.Outbox.Check(ctx, pool, fresh); err != nil {
		t.Errorf("Outbox.Check after Install: %v", err)
	}

	existing := testenv.Table(t, pool) // made by Outbox.Up: marks
	if created, err := migrations.Install(ctx, pool, existing); err != nil || created {
		t.Fatalf("Install on a table that exists: created %v, %v; want false, nil", created, err)
	}
	if hasCursor(existing) {
		t.Error("Install gave a table that existed the cursor migration: its marks relays would refuse it")
	}
	// The cursor migration applied later: auto stays on marks until a
	// cursor relay ran.
	if err := migrations.Cursor.Up(ctx, pool, existing); err != nil {
		t.Fatal(err)
	}
	if migrated, on, err := tablesql.ForCursor(ctx, pool, existing); err != nil || !migrated || on {
		t.Errorf("ForCursor on a table given the cursor migration later: %v, %v, %v; want true, false", migrated, on, err)
	}
}
