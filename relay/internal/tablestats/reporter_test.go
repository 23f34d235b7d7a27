package tablestats

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/fxoutbox/outbox/internal/locks"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/migrations"
	"github.com/fxoutbox/outbox/relay/internal/marks"
)

// The parked gauge counts parked events by topic and by the error.type the
// relay stored at the start of last_error (through the admin API, whose
// plan test checks the statement reads only the partial index): with 50k
// rows of which 50 are parked over 7 topics, 7 groups of that reason.
func TestParkedGaugeGroupsByTopicAndReason(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	tbl := testenv.Table(t, pool)
	ctx := context.Background()
	_, err := pool.Exec(ctx, "INSERT INTO "+sqlname.Ident(tbl)+
		" (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, published_at, parked_at, last_error)"+
		" SELECT gen_random_uuid(), 'a', 'k' || (g % 500), 'a.b', '{}', 't' || (g % 7), 'k' || (g % 500),"+
		" CASE WHEN g % 1000 <> 7 THEN now() END, CASE WHEN g % 1000 = 7 THEN now() END, CASE WHEN g % 1000 = 7 THEN '[kafka.message_too_large] permanent: x' END"+
		" FROM generate_series(1, 50000) g")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE "+sqlname.Ident(tbl)); err != nil {
		t.Fatal(err)
	}
	r := New(Config{DB: pool, Table: tbl})
	st, err := r.query(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, g := range st.Parked {
		if g.Reason != "kafka.message_too_large" {
			t.Errorf("parked group %+v, want reason kafka.message_too_large", g)
		}
		n += g.N
	}
	if n != 50 || len(st.Parked) != 7 {
		t.Errorf("parked groups %+v: %d events in %d groups, want 50 in 7 (one per topic)", st.Parked, n, len(st.Parked))
	}
}

// In cursor mode the parked events are the parked table's rows, grouped by
// the error type of their reason; the backlog comes from the lanes'
// positions.
func TestParkedGaugeInCursorMode(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	tbl := testenv.Table(t, pool)
	ctx := context.Background()
	if err := migrations.Cursor.Up(ctx, pool, tbl); err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		"INSERT INTO " + sqlname.Ident(sqlname.Cursor(tbl)) + " (lane, lanes, done, base) SELECT g, 4, pg_current_snapshot(), 0 FROM generate_series(0, 3) g",
		"INSERT INTO " + sqlname.Ident(tbl) + " (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key) VALUES (gen_random_uuid(), 'a', 'k', 'a.b', '{}', 't', 'k')",
		"INSERT INTO " + sqlname.Ident(sqlname.Parked(tbl)) + " (id, event_id, topic, reason, last_error, attempts, last_try_at)" +
			" SELECT g, gen_random_uuid(), 't' || (g % 3), CASE WHEN g % 2 = 0 THEN '[kafka.message_too_large] x' ELSE 'no type' END, 'the error', 1, now()" +
			" FROM generate_series(1, 12) g",
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	st, err := New(Config{DB: pool, Table: tbl}).query(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, g := range st.Parked {
		got[g.Topic+"/"+g.Reason] += g.N
	}
	if st.Backlog != 1 || len(got) != 6 || got["t0/kafka.message_too_large"] != 2 || got["t1/_OTHER"] != 2 {
		t.Errorf("backlog %d, parked groups %v; want 1, and 6 groups of 2 by topic and error type", st.Backlog, got)
	}
}

// Of two reporters of one table, exactly one holds the lock and reports the
// statistics (here a backlog of 3); when it stops, its connection closes,
// the other takes the lock over at its next try, and the stopped one
// reports nothing any more.
func TestOneReporterPerTableAndTakeover(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	tbl := testenv.Table(t, pool)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "INSERT INTO "+sqlname.Ident(tbl)+
		" (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key)"+
		" SELECT gen_random_uuid(), 'a', 'k', 'a.b', '{}', 't', 'k' FROM generate_series(1, 3)"); err != nil {
		t.Fatal(err)
	}
	newReporter := func() *Reporter {
		return New(Config{DB: pool, Table: tbl, LockNamespace: locks.Namespace(tbl.String()), LockKey: -1, Interval: 20 * time.Millisecond,
			Logger: slog.New(slog.DiscardHandler), Failed: func(_ context.Context, err error) { t.Errorf("read failed: %v", err) },
			ErrorType: func(error) string { return "test" },
			Settings: func() (string, string, []any) {
				return marks.TxSettings(true, marks.CommitDefault), marks.SessionSettings(true, marks.CommitDefault), []any{"10000"}
			}})
	}
	a, b := newReporter(), newReporter()
	actx, stopA := context.WithCancel(ctx)
	bctx, stopB := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, run := range []func(){func() { a.Run(actx) }, func() { b.Run(bctx) }} {
		wg.Add(1)
		go func() { defer wg.Done(); run() }()
	}
	defer func() { stopA(); stopB(); wg.Wait() }()

	// reporting waits until exactly one of the running reporters reports,
	// for several reads in a row, and returns it.
	reporting := func(rs ...*Reporter) *Reporter {
		t.Helper()
		var holder *Reporter
		stable := 0
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && stable < 10; time.Sleep(20 * time.Millisecond) {
			var on []*Reporter
			for _, r := range rs {
				if st, ok := r.Snapshot(); ok {
					if st.Backlog != 3 {
						t.Fatalf("backlog %d, want 3", st.Backlog)
					}
					on = append(on, r)
				}
			}
			switch {
			case len(on) > 1:
				t.Fatal("two reporters report the table at once")
			case len(on) == 1 && on[0] == holder:
				stable++
			case len(on) == 1:
				holder, stable = on[0], 0
			}
		}
		if holder == nil {
			t.Fatal("no reporter reports the table")
		}
		return holder
	}
	first := reporting(a, b)
	other := b
	if first == b {
		other = a
		stopB()
	} else {
		stopA()
	}
	if got := reporting(other); got != other {
		t.Fatal("the other reporter did not take over")
	}
	if _, ok := first.Snapshot(); ok {
		t.Error("the stopped reporter still reports")
	}
}
