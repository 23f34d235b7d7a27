package pgoutput_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"

	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay/internal/pgoutput"
)

// The reader hands over each committed transaction's inserts into the
// table, decoded, in commit order, and nothing of a transaction that rolled
// back; a position the user confirms reaches the server's slot.
func TestReadsCommittedInsertsAndConfirms(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool := testenv.Pool(t)
	table := testenv.Table(t, pool).WithDefaults()
	slot := testenv.Streaming(t, pool, table, true)

	var progress pgoutput.Progress
	conn, err := pgoutput.Connect(ctx, pgoutput.Config{Conn: &pool.Config().ConnConfig.Config, Table: table,
		Timeout: 10 * time.Second, StatusInterval: 100 * time.Millisecond, Pending: 4, Progress: &progress})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if conn.Slot() != slot {
		t.Fatalf("slot %q, want %q", conn.Slot(), slot)
	}
	if ok, lost, err := conn.SlotExists(ctx, pool); err != nil || !ok || lost {
		t.Fatalf("SlotExists = %v, lost %v, %v; want true, not lost", ok, lost, err)
	}
	if err := conn.StartReplication(ctx); err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	go conn.Read(rctx)
	defer func() { stop(); <-conn.Done() }()

	insert := "INSERT INTO " + sqlname.Ident(table) + " (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key)" +
		" VALUES ($1, 'order', $2, 'order.created', $3, 'orders', $2)"
	ids := []uuid.UUID{uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i, key := range []string{"k1", "k2"} {
		if _, err := tx.Exec(ctx, insert, ids[i], key, `{"n":1}`); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	tx, err = pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, insert, ids[2], "rolled-back", `{}`); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback(ctx)
	// As an operator's requeue writes a row back: attempts 0, its last error kept.
	requeued := "INSERT INTO " + sqlname.Ident(table) + " (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, attempts, last_error)" +
		" VALUES ($1, 'order', $2, 'order.created', $3, 'orders', $2, 0, 'topic does not exist')"
	if _, err := pool.Exec(ctx, requeued, ids[3], "k3", `{}`); err != nil {
		t.Fatal(err)
	}

	next := func() pgoutput.Tx {
		t.Helper()
		select {
		case tx, ok := <-conn.Txs():
			if !ok {
				t.Fatalf("the reader stopped: %v", conn.Err())
			}
			return tx
		case <-time.After(30 * time.Second):
			t.Fatal("no transaction within 30s")
		}
		return pgoutput.Tx{}
	}
	first, second := next(), next()
	if len(first.Rows) != 2 || len(second.Rows) != 1 {
		t.Fatalf("transactions of %d and %d rows, want 2 and 1", len(first.Rows), len(second.Rows))
	}
	for i, want := range []struct {
		id       uuid.UUID
		key      string
		requeued bool
		x        pgoutput.Row
	}{{ids[0], "k1", false, first.Rows[0]}, {ids[1], "k2", false, first.Rows[1]}, {ids[3], "k3", true, second.Rows[0]}} {
		x := want.x
		if x.Err != nil || x.ID == 0 || x.EventID != want.id || x.Key != want.key || x.Topic != "orders" ||
			x.EventType != "order.created" || x.CreatedAt.IsZero() || !json.Valid(x.Payload) || x.Requeued != want.requeued {
			t.Errorf("row %d: %+v; want event %s of key %s, decoded, requeued %v", i, x, want.id, want.key, want.requeued)
		}
	}
	if first.End == 0 || second.End <= first.End || first.Commit.IsZero() {
		t.Fatalf("positions %v then %v, commit %v: want increasing positions and a commit time", first.End, second.End, first.Commit)
	}

	conn.Confirm(first.End)
	if got := progress.Confirmed(); got < first.End {
		t.Fatalf("Confirmed() = %v after Confirm(%v)", got, first.End)
	}
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		var s string
		if err := pool.QueryRow(ctx, "SELECT coalesce(confirmed_flush_lsn::text, '0/0') FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&s); err != nil {
			t.Fatal(err)
		}
		flushed, err := pglogrepl.ParseLSN(s)
		if err != nil {
			t.Fatal(err)
		}
		return flushed >= first.End, fmt.Sprintf("the slot's confirmed_flush_lsn is %v, want at least the confirmed %v", flushed, first.End)
	})
}

// CreateSlot makes the slot, a failover slot exactly when the server is
// PostgreSQL 17 or later (read from the server itself; on older servers
// the slot has no such flag and the command is the one they accept).
func TestCreateSlotFailoverByServerVersion(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool := testenv.Pool(t)
	table := testenv.Table(t, pool).WithDefaults()
	slot := testenv.Streaming(t, pool, table, false)
	var progress pgoutput.Progress
	conn, err := pgoutput.Connect(ctx, pgoutput.Config{Conn: &pool.Config().ConnConfig.Config, Table: table,
		Timeout: 10 * time.Second, StatusInterval: 100 * time.Millisecond, Pending: 4, Progress: &progress})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var num int
	if err := pool.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&num); err != nil {
		t.Fatal(err)
	}
	if want := num >= 170000; conn.Failover() != want {
		t.Fatalf("server_version_num %d: Failover() = %v, want %v", num, conn.Failover(), want)
	}
	if created, err := conn.CreateSlot(ctx); err != nil || !created {
		t.Fatalf("CreateSlot = %v, %v; want created", created, err)
	}
	if created, err := conn.CreateSlot(ctx); err != nil || created {
		t.Fatalf("CreateSlot again = %v, %v; want not created, no error", created, err)
	}
	var plugin string
	if err := pool.QueryRow(ctx, "SELECT plugin FROM pg_replication_slots WHERE slot_name = $1 AND slot_type = 'logical'", slot).Scan(&plugin); err != nil || plugin != "pgoutput" {
		t.Fatalf("slot %s: plugin %q, %v; want a logical pgoutput slot", slot, plugin, err)
	}
	if num >= 170000 {
		var failover bool
		if err := pool.QueryRow(ctx, "SELECT failover FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&failover); err != nil || !failover {
			t.Fatalf("slot %s on PostgreSQL %d: failover %v, %v; want a failover slot", slot, num, failover, err)
		}
	}
}
