package relay_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/admin"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/migrations"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// moveToPartitioned is docs/partitions.md's "An existing table", steps 3
// and 4, as its SQL says: the lanes' delivered rows marked and their
// positions dropped (outboxctl cursor rebase), then one transaction that
// locks the table, copies its rows into the partitioned table made beside
// it (ids and order kept), moves the identity past them, and swaps the
// names. It returns the rows copied.
func moveToPartitioned(ctx context.Context, t *testing.T, pool interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}, tbl, next outbox.Table) int64 {
	t.Helper()
	if _, err := admin.RebaseCursor(ctx, pool, tbl); err != nil {
		t.Fatalf("step 3, outboxctl cursor rebase: %v", err)
	}
	old, nw := sqlname.Ident(tbl), sqlname.Ident(next)
	q := func(name string) string { return pgx.Identifier{tbl.Schema, name}.Sanitize() }
	base, nbase := tbl.WithDefaults().Name, next.WithDefaults().Name
	const cols = "id, event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, headers, created_at, published_at, attempts, last_error, parked_at, first_failed_at"
	var copied int64
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "LOCK TABLE "+old+" IN ACCESS EXCLUSIVE MODE"); err != nil {
			return err
		}
		var stuck int64
		if err := tx.QueryRow(ctx, "SELECT count(*) FROM "+old+" WHERE substr(event_id::text, 15, 1) <> '7' AND published_at IS NULL").Scan(&stuck); err != nil || stuck > 0 {
			return fmt.Errorf("%d rows to deliver have ids that are not v7 (%v)", stuck, err)
		}
		tag, err := tx.Exec(ctx, "INSERT INTO "+nw+" ("+cols+") OVERRIDING SYSTEM VALUE SELECT "+cols+" FROM "+old+
			" WHERE substr(event_id::text, 15, 1) = '7' ORDER BY id")
		if err != nil {
			return err
		}
		copied = tag.RowsAffected()
		for _, s := range []string{
			"SELECT setval(pg_get_serial_sequence(" + literal(nw) + ", 'id'), max(id)) FROM " + old + " HAVING max(id) IS NOT NULL",
			"ALTER TABLE " + old + " RENAME TO " + pgx.Identifier{base + "_unpartitioned"}.Sanitize(),
			"ALTER SEQUENCE " + q(base+"_id_seq") + " RENAME TO " + pgx.Identifier{base + "_unpartitioned_id_seq"}.Sanitize(),
			"ALTER TABLE " + nw + " RENAME TO " + pgx.Identifier{base}.Sanitize(),
			"ALTER SEQUENCE " + q(nbase+"_id_seq") + " RENAME TO " + pgx.Identifier{base + "_id_seq"}.Sanitize(),
			"DELETE FROM " + q(base+"_cursor"),
			"DROP TABLE " + q(nbase+"_cursor") + ", " + q(nbase+"_parked") + ", " + q(nbase+"_migrations"),
		} {
			if _, err := tx.Exec(ctx, s); err != nil {
				return fmt.Errorf("%s: %w", s, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("step 3, the move: %v", err)
	}
	return copied
}

func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// A filled cursor table delivered by a running relay moves to a partitioned
// one by docs/partitions.md's steps while writers go on: no write fails
// (they wait on the table's lock and then write into the partitioned
// table), every event is delivered, each key in order, none twice (the
// rows the lanes had delivered move marked), an event whose transaction was
// open while the relay passed it is delivered too, and the relay then keeps
// the new table's partitions.
func TestMoveToPartitionedTable(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	s.cursor(t)
	brokers := s.kafka(t)
	topic := testenv.Topic(t, brokers, 4)
	cons := testenv.Consume(t, brokers, topic)
	const keys = 6
	// Writers: one per key, seq 0, 1, ... per key, until stopped.
	wctx, stopWriters := context.WithCancel(s.ctx)
	var wg sync.WaitGroup
	var written atomic.Int64
	errs := make(chan error, keys)
	for k := range keys {
		wg.Go(func() {
			for seq := 0; wctx.Err() == nil; seq++ {
				err := s.uow.Do(s.ctx, func(ctx context.Context, tx unitofwork.Tx) error {
					return tx.Add(ctx, outbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("k%d", k), Type: "order.updated.v1",
						Topic: topic, Payload: map[string]int{"seq": seq}})
				})
				if err != nil {
					errs <- fmt.Errorf("writer k%d, seq %d: %w", k, seq, err)
					return
				}
				written.Add(1)
				time.Sleep(2 * time.Millisecond)
			}
		})
	}
	defer func() { stopWriters(); wg.Wait() }()
	// A transaction that stays open while the relay delivers the events
	// after it, and commits once the relay stopped: its event is among the
	// rows the lanes' positions hold as running, which the move must not
	// lose.
	held, err := s.pool.Begin(s.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = held.Rollback(context.Background()) }()
	if _, err := held.Exec(s.ctx, "INSERT INTO "+sqlname.Ident(s.table)+" (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key)"+
		" VALUES ($1, 'order', 'held', 'order.updated.v1', '{\"seq\": 0}', $2, 'held')", uuid.Must(uuid.NewV7()), topic); err != nil {
		t.Fatal(err)
	}
	cfg := relay.Config{Progress: relay.ProgressCursor, PollInterval: 20 * time.Millisecond, BatchSize: 20}
	r := s.relay(t, s.publisher(t), cfg)
	if err := r.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	// A filled table, partly delivered.
	cons.WaitForDistinct(300, 60*time.Second)

	// Step 1: the partitioned table beside it.
	next := outbox.Table{Schema: s.table.Schema, Name: "outbox_event_new"}
	if err := migrations.Partitioned.WithInterval(time.Hour).Up(s.ctx, s.pool, next); err != nil {
		t.Fatal(err)
	}
	// Step 2: the relays stopped; the writers go on.
	if err := r.Stop(s.ctx); err != nil {
		t.Fatal(err)
	}
	if err := held.Commit(s.ctx); err != nil {
		t.Fatal(err)
	}
	written.Add(1)
	before := written.Load()
	copied := moveToPartitioned(s.ctx, t, s.pool, s.table, next)
	if copied < before {
		t.Errorf("copied %d rows, but %d events were written before the move", copied, before)
	}
	var partitioned bool
	if err := s.pool.QueryRow(s.ctx, "SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass($1)", sqlname.Ident(s.table)).Scan(&partitioned); err != nil || !partitioned {
		t.Fatalf("after the move, %s is not partitioned (%v)", s.table, err)
	}
	// Step 4: the relays start again, on the partitioned table.
	r2 := s.relay(t, s.publisher(t), cfg)
	if err := r2.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r2.Stop(context.Background()) }()
	waitUntil(t, 30*time.Second, "writes after the move", func() bool { return written.Load() > before+100 })
	stopWriters()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("a write failed: %v", err)
	}
	n := int(written.Load())
	cons.WaitForDistinct(n, 60*time.Second)
	if err := r2.Stop(s.ctx); err != nil {
		t.Fatal(err)
	}
	// Both relays stopped: every record they sent is read, a late
	// duplicate too.
	distinct, dups := checkOrder(t, consumeAll(t, cons, brokers, topic))
	t.Logf("%d events written, %d before the move; %d rows moved", n, before, copied)
	if distinct != n || dups != 0 {
		t.Errorf("got %d distinct events and %d duplicates, want %d and 0", distinct, dups, n)
	}
	var rows int
	if err := s.pool.QueryRow(s.ctx, "SELECT count(*) FROM "+sqlname.Ident(s.table)).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != n {
		t.Errorf("the partitioned table holds %d rows, want every event written: %d", rows, n)
	}
	// Its upkeep runs on it under its new name.
	if _, err := r2.MaintainPartitions(s.ctx); err != nil {
		t.Errorf("the upkeep after the move: %v", err)
	}
}
