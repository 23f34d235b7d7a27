package faulttest

import (
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/tablesql"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
)

// TestFrozenRelayHoldsOnlyItsLanes freezes (SIGSTOP) a relay process in
// its first batch, as TestFrozenRelayLosesItsLanes does, on a table whose
// 20 keys leave most of the 64 lanes without events. A frozen relay may
// hold back the lanes of the rows it claimed, for its lease
// (BatchTimeout + 5 s), and no other: a key written after the freeze,
// in a lane that had no waiting event, is published by a second relay at
// once, not when the frozen relay's transaction ends.
//
// With marks progress the claim locks only lanes with waiting rows. Under
// OUTBOX_TEST_PROGRESS=cursor a claim also try-locks, once a second and in
// a relay's first batch, every closed lane that transactions went past
// (relay/internal/cursor Queries.Idle, "a lane without events keeps up"),
// so that a batch frozen there holds every lane of the table: this test
// fails then (see the report of branch fault-cursor).
//
// It needs DATABASE_URL and KAFKA_BROKERS, and runs in make test.
func TestFrozenRelayHoldsOnlyItsLanes(t *testing.T) {
	pool := testenv.Pool(t)
	w := newWorldOn(t, pool, testenv.Brokers(t), 20)
	for i := range 200 {
		if err := w.commit(w.ctx, w.key(i)); err != nil {
			t.Fatal(err)
		}
	}
	app := testenv.Name("faulttest-frozenlanes-")
	child := startHelper(t, w, "freeze", envHelperApp+"="+app, envHelperHold+"=3s")
	child.next("HOLDING", 60*time.Second)
	child.signal(syscall.SIGSTOP)
	frozen := time.Now()
	bound := helperFreezeBatchTimeout + 5*time.Second

	var held, busy []int32
	var pid int32
	if err := pool.QueryRow(w.ctx, `SELECT coalesce(array_agg(l.objid::int ORDER BY l.objid), '{}'), coalesce(min(a.pid), 0)
		FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted AND a.application_name = $1
		  AND a.state LIKE 'idle in transaction%'`, app).Scan(&held, &pid); err != nil {
		t.Fatal(err)
	}
	if len(held) == 0 {
		t.Fatal("the frozen relay holds no lane locks")
	}
	// Lanes with events waiting (the relay's lane function, 64 lanes).
	if err := pool.QueryRow(w.ctx, "SELECT coalesce(array_agg(DISTINCT "+tablesql.Lane("partition_key", defaultLanes)+"), '{}') FROM "+
		sqlname.Ident(w.table)+" WHERE "+w.waiting()).Scan(&busy); err != nil {
		t.Fatal(err)
	}
	var idle []int32
	for _, l := range held {
		if !slices.Contains(busy, l) {
			idle = append(idle, l)
		}
	}
	t.Logf("progress %v: the frozen relay holds %d lanes, %d of them without a waiting event; %d lanes have events waiting",
		w.progress, len(held), len(idle), len(busy))

	// A new key, in a lane without events.
	var probe string
	for i := 0; probe == ""; i++ {
		k := fmt.Sprintf("probe-%d", i)
		var lane int32
		if err := pool.QueryRow(w.ctx, "SELECT "+tablesql.Lane("$1", defaultLanes), k).Scan(&lane); err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(busy, lane) {
			probe = k
			t.Logf("probe key %s: lane %d (held by the frozen relay: %v)", k, lane, slices.Contains(held, lane))
		}
	}
	if _, err := pool.Exec(w.ctx, "INSERT INTO "+w.account+" (id) VALUES ($1)", probe); err != nil {
		t.Fatal(err)
	}
	stop := w.startRelayWith(t, func(c *relay.Config) { c.BatchTimeout = 10 * time.Second })
	if err := w.commit(w.ctx, probe); err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	waitFor(t, 60*time.Second, "the probe event to be published", func() bool {
		return w.count(t, w.delivered()+" AND partition_key = '"+probe+"'") == 1
	})
	t.Logf("the probe event was published %v after its commit, %v after the freeze (the frozen relay's bound: %v)",
		time.Since(sent).Round(time.Millisecond), time.Since(frozen).Round(time.Millisecond), bound)
	// Published while the frozen relay still holds its lanes (read after
	// the probe's row), not when its transaction ended: an order of events,
	// not a duration.
	if laneLocks(t, w, pid) == 0 {
		t.Errorf("an event of a lane that had no waiting event was published only after the frozen relay's transaction ended (its bound: %v): "+
			"the frozen relay held %d lanes without a waiting event (%v)", bound, len(idle), idle)
	}

	child.signal(syscall.SIGCONT)
	t.Logf("relay process continued: stale batch %s", child.next("STALE", 60*time.Second))
	waitFor(t, 60*time.Second, "every row to be published", func() bool { return w.unpublished(t) == 0 })
	child.signal(syscall.SIGKILL)
	child.wait(30 * time.Second)
	stop()
	w.check(t, 1)
}
