package relay

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
)

// growSetup is a table with rows events over keys keys (key i is "k<i>"),
// the hot key's rows (if any) written first, and a relay on it that never
// publishes.
func growSetup(t *testing.T, hot, rows, keys int) (*pgxpool.Pool, outbox.Table, *Relay) {
	t.Helper()
	pool := testenv.Pool(t)
	tbl := testenv.Table(t, pool)
	ctx := context.Background()
	ins := "INSERT INTO " + sqlname.Ident(tbl) + " (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key)" +
		" SELECT gen_random_uuid(), 'a', k, 'a.b', '{}', 't', k FROM (SELECT g, $1 || (g % $2) AS k FROM generate_series(1, $3) g ORDER BY g) s"
	if hot > 0 {
		if _, err := pool.Exec(ctx, ins, "hot", 1, hot); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, ins, "k", keys, rows); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE "+sqlname.Ident(tbl)); err != nil {
		t.Fatal(err)
	}
	r, err := New(pool, PublisherFunc(func(context.Context, []Message) error { return nil }),
		&Config{Table: tbl, PollInterval: time.Minute, Progress: ProgressMarks})
	if err != nil {
		t.Fatal(err)
	}
	return pool, tbl, r
}

// holdLanes holds lanes in the relay's lock namespace, as another
// relay's batch would, until the test ends.
func holdLanes(t *testing.T, pool *pgxpool.Pool, r *Relay, lanes []int32) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1, l) FROM unnest($2::int[]) l", r.q.ns, lanes); err != nil {
		t.Fatal(err)
	}
}

// claimReads runs lockLanes for a batch of n in a new transaction and
// returns the ids it locked and how many of the table's rows it read.
func claimReads(t *testing.T, pool *pgxpool.Pool, tbl outbox.Table, r *Relay, n int) (ids []int64, read int64) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	before := rowsRead(t, tx, tbl)
	ids, _, err = r.marks.LockLanes(ctx, tx, n, nil, 0, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return ids, rowsRead(t, tx, tbl) - before
}

// rowsRead is how many of tbl's rows tx's statements have read so far (the
// backend's counts not yet flushed to the statistics: they do not change
// within a transaction except by its own statements).
func rowsRead(t *testing.T, tx pgx.Tx, tbl outbox.Table) int64 {
	t.Helper()
	var c int64
	if err := tx.QueryRow(context.Background(), "SELECT coalesce(idx_tup_fetch, 0) + coalesce(seq_tup_read, 0) FROM pg_stat_xact_user_tables WHERE relid = $1::regclass",
		sqlname.Ident(tbl)).Scan(&c); err != nil {
		t.Fatal(err)
	}
	return c
}

func laneRange(from, to int32) []int32 {
	var out []int32
	for l := from; l < to; l++ {
		out = append(out, l)
	}
	return out
}

// With several replicas draining a backlog spread over every lane, a claim
// that finds the lanes of its window held by other relays must not read ever
// larger windows (up to 21 times the batch) of rows it cannot take: once it
// has tried every lane, a larger window only shows more rows of held lanes.
// Before, a claim that found all 64 lanes held read 2n+8n+32n rows, and one
// that found three quarters held read 2n+8n.
func TestClaimDoesNotReadHeldLanesPastEveryLane(t *testing.T) {
	t.Parallel()
	pool, tbl, r := growSetup(t, 0, 20000, 10000)
	const n = 500
	t.Run("all held", func(t *testing.T) {
		holdLanes(t, pool, r, laneRange(0, 64))
		ids, read := claimReads(t, pool, tbl, r, n)
		if len(ids) != 0 {
			t.Fatalf("locked %d rows of held lanes", len(ids))
		}
		if read > 2*n {
			t.Errorf("the claim read %d rows to find every lane held; one window is %d", read, 2*n)
		}
	})
	t.Run("three quarters held", func(t *testing.T) {
		holdLanes(t, pool, r, laneRange(0, 48))
		ids, read := claimReads(t, pool, tbl, r, n)
		if len(ids) == 0 {
			t.Fatal("locked nothing while 16 lanes were free")
		}
		if read > 2*n {
			t.Errorf("the claim read %d rows for %d of its own; one window is %d", read, len(ids), 2*n)
		}
	})
}

// With fewer keys than lanes, every lane is never seen: a claim whose keys'
// lanes are all held grows its window to the largest and finds nothing, and
// then the relay's claims stop growing for a PollInterval.
func TestClaimStopsGrowingWhenNoNewLaneAppears(t *testing.T) {
	t.Parallel()
	pool, tbl, r := growSetup(t, 0, 5000, 10)
	holdLanes(t, pool, r, laneRange(0, 64))
	const n = 50
	ids, read := claimReads(t, pool, tbl, r, n)
	if len(ids) != 0 {
		t.Fatalf("locked %d rows of held lanes", len(ids))
	}
	if read > 42*n {
		t.Errorf("first claim read %d rows; at most its three windows (%d)", read, 42*n)
	}
	if _, read = claimReads(t, pool, tbl, r, n); read > 2*n {
		t.Errorf("second claim read %d rows; within PollInterval of a fruitless growth it reads one window (%d)", read, 2*n)
	}
}

// A grown window still finds lanes past a held hot key: the relay that does
// not hold the hot key's lane publishes the other keys meanwhile.
func TestClaimGrowsPastAHeldHotKey(t *testing.T) {
	t.Parallel()
	pool, tbl, r := growSetup(t, 1000, 100, 50)
	var hot int32
	if err := pool.QueryRow(context.Background(), "SELECT (hashtext('hot0') & 2147483647) % 64").Scan(&hot); err != nil {
		t.Fatal(err)
	}
	holdLanes(t, pool, r, []int32{hot})
	ids, _ := claimReads(t, pool, tbl, r, 50)
	if len(ids) == 0 {
		t.Fatal("the claim found nothing past the hot key's held lane")
	}
	var keys []string
	rows, err := pool.Query(context.Background(), "SELECT DISTINCT partition_key FROM "+sqlname.Ident(tbl)+" WHERE id = ANY($1)", ids)
	if err != nil {
		t.Fatal(err)
	}
	keys, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if k == "hot0" {
			t.Errorf("claimed rows of the held hot key")
		}
	}
}

// The oldest rows of a shared backlog are those of the lanes other
// replicas are publishing: a claim that grows past them and still finds
// less than half a batch makes the relay's next claims (for a PollInterval)
// take what their first window offers instead of reading grown windows
// again.
func TestClaimStopsGrowingAfterAGrowthFoundLittle(t *testing.T) {
	t.Parallel()
	pool, tbl, r := growSetup(t, 0, 0, 1)
	ctx := context.Background()
	// 1000 rows in lanes 0-9, then 20000 over every lane.
	ins := "INSERT INTO " + sqlname.Ident(tbl) + " (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key)" +
		" SELECT gen_random_uuid(), 'a', k, 'a.b', '{}', 't', k FROM (SELECT g, k FROM (SELECT g, 'k' || (g % $1) AS k FROM generate_series(1, $2) g) s" +
		" WHERE (hashtext(k) & 2147483647) % 64 < $3 ORDER BY g LIMIT $4) s"
	if _, err := pool.Exec(ctx, ins, 5000, 100000, 10, 1000); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, ins, 5000, 20000, 64, 20000); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE "+sqlname.Ident(tbl)); err != nil {
		t.Fatal(err)
	}
	holdLanes(t, pool, r, laneRange(0, 60)) // lanes 60-63 are free
	const n = 500
	ids, read := claimReads(t, pool, tbl, r, n)
	if len(ids) == 0 || 2*len(ids) >= n {
		t.Fatalf("first claim took %d rows; the test needs a grown claim that finds a few", len(ids))
	}
	if read <= 2*n {
		t.Fatalf("first claim read %d rows: it did not grow its window", read)
	}
	if _, read = claimReads(t, pool, tbl, r, n); read > 2*n {
		t.Errorf("second claim read %d rows; within PollInterval of a growth that found little it reads one window (%d)", read, 2*n)
	}
}

// A claim that takes nothing says whether that is because other relays
// hold the lanes of the events it saw (the loop then defers wake-ups for a
// moment: see waitWake) or because there was nothing to take (a relay alone
// must answer the next commit's wake-up at once).
func TestClaimSaysWhenEventsAreHeldElsewhere(t *testing.T) {
	t.Parallel()
	pool, tbl, r := growSetup(t, 0, 0, 1)
	ctx := context.Background()
	claimOnce := func() claimed {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		c, err := marksClaimed(r.marks.Claim(ctx, tx, 50, nil, 0))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	if c := claimOnce(); len(c.rows) != 0 || c.heldElsewhere {
		t.Fatalf("empty table: %d rows, heldElsewhere %v; want none, false", len(c.rows), c.heldElsewhere)
	}
	if _, err := pool.Exec(ctx, "INSERT INTO "+sqlname.Ident(tbl)+" (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key)"+
		" SELECT gen_random_uuid(), 'a', 'k' || g, 'a.b', '{}', 't', 'k' || g FROM generate_series(1, 20) g"); err != nil {
		t.Fatal(err)
	}
	if c := claimOnce(); len(c.rows) != 20 || c.heldElsewhere {
		t.Fatalf("free lanes: %d rows, heldElsewhere %v; want 20, false", len(c.rows), c.heldElsewhere)
	}
	holdLanes(t, pool, r, laneRange(0, 64))
	if c := claimOnce(); len(c.rows) != 0 || !c.heldElsewhere {
		t.Fatalf("every lane held: %d rows, heldElsewhere %v; want none, true", len(c.rows), c.heldElsewhere)
	}
}
