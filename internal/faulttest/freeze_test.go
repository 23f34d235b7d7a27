package faulttest

import (
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/tablesql"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
)

// TestFrozenRelayLosesItsLanes freezes (SIGSTOP) a relay process while it
// holds a claimed batch, and runs a second relay meanwhile:
//
//   - lanes the frozen relay does not hold keep flowing at once;
//   - its lanes (and the rows it claimed) wait, and are taken over only when
//     PostgreSQL ends the frozen transaction (idle_in_transaction_session_timeout
//     = BatchTimeout + 5s), not earlier and not never;
//   - woken with SIGCONT, the stale relay sends its old batch anyway (its
//     mark then fails: its session is gone) and goes back to work.
//
// In the end nothing is lost, each key's first deliveries are in write
// order, and the stale batch is the only duplicate. With
// OUTBOX_TEST_DELIVERY=exactly-once the relay process holds a batch whose
// Kafka transaction committed, before its mark; the second relay takes
// the lane over by reading its progress back, and nothing is duplicated.
//
// It needs DATABASE_URL and KAFKA_BROKERS, and runs in make test.
func TestFrozenRelayLosesItsLanes(t *testing.T) {
	pool := testenv.Pool(t)
	w := newWorldOn(t, pool, testenv.Brokers(t), 40)
	for i := range 400 {
		if err := w.commit(w.ctx, w.key(i*7)); err != nil {
			t.Fatal(err)
		}
	}
	app := testenv.Name("faulttest-frozen-")
	child := startHelper(t, w, "freeze", envHelperApp+"="+app, envHelperHold+"=3s")
	held := strings.Split(child.next("HOLDING", 60*time.Second), ",")
	child.signal(syscall.SIGSTOP)
	frozen := time.Now()
	t.Logf("relay process (pid %d) frozen with SIGSTOP holding %d events", child.cmd.Process.Pid, len(held))

	// The lanes it holds: its batch transaction's advisory locks. Only the
	// session in a transaction: the relay's table-statistics reporter holds
	// a session lock in the same namespace on another connection, for as
	// long as the process lives, and a check of its pid would see "locks
	// still held" for ever.
	var lanes []int32
	var state string
	var pid int32
	if err := pool.QueryRow(w.ctx, `SELECT coalesce(array_agg(l.objid::int ORDER BY l.objid), '{}'), coalesce(min(a.state), ''), coalesce(min(a.pid), 0)
		FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted AND a.application_name = $1
		  AND a.state LIKE 'idle in transaction%'`, app).Scan(&lanes, &state, &pid); err != nil {
		t.Fatal(err)
	}
	if len(lanes) == 0 {
		t.Fatalf("the frozen relay holds no lane locks (state %q)", state)
	}
	t.Logf("it holds lanes %v; its session is %q", lanes, state)
	// Relay's lane of a row, for the default 64 lanes (relay/claim.go).
	inHeld := tablesql.Lane("partition_key", defaultLanes) + " = ANY('{" + joinInts(lanes) + "}'::int[])"
	if len(held) == 1 && held[0] == "" {
		// An exactly-once relay under cursor progress froze at its
		// positions' save, which names no rows: its batch's rows are among
		// the rows waiting in the lanes it holds, which stand for them.
		if err := pool.QueryRow(w.ctx, "SELECT coalesce(array_agg(event_id::text), '{}') FROM "+sqlname.Ident(w.table)+" WHERE "+w.waiting()+" AND "+inHeld).Scan(&held); err != nil {
			t.Fatal(err)
		}
		t.Logf("the frozen batch named no rows (a save of positions): the %d rows waiting in its lanes stand for them", len(held))
		if len(held) == 0 {
			t.Fatal("no row waits in the frozen relay's lanes")
		}
	}
	heldRows := "event_id::text = ANY('{" + strings.Join(held, ",") + "}')"
	var lastBefore int64
	if err := pool.QueryRow(w.ctx, "SELECT max(id) FROM "+sqlname.Ident(w.table)).Scan(&lastBefore); err != nil {
		t.Fatal(err)
	}

	stop := w.startRelayWith(t, func(c *relay.Config) { c.BatchTimeout = 10 * time.Second })
	ws := w.startWriters(t, 2)

	// Other lanes flow at once: their backlog is published while the frozen
	// relay still holds its lanes (until PostgreSQL ends its transaction).
	// Asserted as an order of events, read in that order (the rows, then
	// the locks), not as a duration: a loaded machine is slower, not wrong.
	bound := helperFreezeBatchTimeout + 5*time.Second
	flow := waitFor(t, 60*time.Second, "the rows of the other lanes to be published", func() bool {
		return w.count(t, w.waiting()+" AND id <= "+strconv.FormatInt(lastBefore, 10)+" AND NOT "+inHeld) == 0
	})
	t.Logf("every other lane's backlog was published %v after the second relay started (%v after the freeze)",
		flow.Round(time.Millisecond), time.Since(frozen).Round(time.Millisecond))
	if laneLocks(t, w, pid) == 0 {
		t.Errorf("the frozen relay's transaction ended (bound %v) before the backlog of the other lanes was published: they waited for it", bound)
	}

	// Its rows are taken over once PostgreSQL ends the frozen transaction,
	// never while it still holds their lanes.
	early := 0
	waitFor(t, 60*time.Second, "the frozen relay's rows to be published by the other relay", func() bool {
		if n := w.count(t, w.delivered()+" AND "+heldRows); n > 0 && laneLocks(t, w, pid) > 0 {
			early = max(early, n)
		}
		return w.count(t, w.waiting()+" AND "+heldRows) == 0
	})
	if early > 0 {
		t.Errorf("%d rows the frozen relay claimed were published while it still held their lanes: were its locks held at all?", early)
	}
	t.Logf("the frozen relay's rows were published %v after the freeze (its idle-in-transaction bound is %v)", time.Since(frozen).Round(time.Millisecond), bound)
	var alive int
	var last []string // their last statements, cut
	if err := pool.QueryRow(w.ctx, "SELECT count(*), coalesce(array_agg(left(query, 160)), '{}') FROM pg_stat_activity WHERE application_name = $1 AND state LIKE 'idle in transaction%'", app).Scan(&alive, &last); err != nil {
		t.Fatal(err)
	}
	if alive != 0 {
		t.Errorf("the frozen relay still has %d session(s) idle in transaction after its rows were taken over, last statements: %q", alive, last)
	}

	// Wake it: it sends its stale batch (duplicates), fails to mark it, and
	// relays alongside the other one.
	child.signal(syscall.SIGCONT)
	t.Logf("relay process continued: stale batch %s", child.next("STALE", 60*time.Second))
	time.Sleep(2 * time.Second)
	if errs := ws.halt(); len(errs) > 0 {
		t.Errorf("%d writer commits failed, first: %v", len(errs), errs[0])
	}
	waitFor(t, 60*time.Second, "every row to be published", func() bool { return w.unpublished(t) == 0 })
	child.signal(syscall.SIGKILL) // nothing left to publish: no batch in flight
	child.wait(30 * time.Second)
	stop()
	d := w.check(t, 1)
	stale := map[string]bool{}
	for _, id := range held {
		stale[id] = true
	}
	for id := range d.dups {
		if !stale[id] {
			t.Errorf("event %s delivered twice but was not in the frozen relay's batch", id)
		}
	}
}

// laneLocks returns how many lane locks (advisory, relay/claim.go) the
// session pid holds now: read after a count of rows, a lock still held
// means it was held when the rows were counted.
func laneLocks(t *testing.T, w *world, pid int32) int {
	t.Helper()
	var n int
	if err := w.pool.QueryRow(w.ctx, "SELECT count(*) FROM pg_locks WHERE pid = $1 AND locktype = 'advisory' AND objsubid = 2 AND granted", pid).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func joinInts(xs []int32) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(int(x))
	}
	return strings.Join(s, ",")
}
