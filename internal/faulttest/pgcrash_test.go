package faulttest

import (
	"testing"
	"time"

	"github.com/fxoutbox/outbox/internal/testenv"
)

// TestRelaySurvivesPostgresCrash crashes PostgreSQL (pg_ctl stop -m
// immediate: no checkpoint, crash recovery at the next start) while two
// relays drain a 60k backlog, then starts it again; the relays, never
// restarted, reconnect by themselves, writers commit after the restart,
// and everything is delivered: nothing lost, each key's first deliveries in
// write order, nothing charged or parked.
//
// The relays commit their batches with synchronous_commit off (the
// default, relay.Config.SynchronousCommit): the progress of the batches
// committed in the last moments before the crash (at most 3 x
// wal_writer_delay) may be lost with it, marks or the lanes' positions, and
// those events are sent again. So the duplicates allowed are what the
// relays can deliver in that time (their fastest rate seen before the
// crash, over the time from the last look to the crash plus 700 ms) plus
// two batches per relay (the batches in flight). Under OUTBOX_TEST_PROGRESS=cursor the progress taken back is
// the lanes' positions: their windows open again, and must neither lose
// nor reorder anything.
//
// It needs the PostgreSQL server binaries (a cluster of its own, see
// TestRelaySurvivesPostgresRestart) and KAFKA_BROKERS.
func TestRelaySurvivesPostgresCrash(t *testing.T) {
	brokers := testenv.Brokers(t)
	pg := ownPG(t)
	pool := pg.pool(t)
	w := newWorldOn(t, pool, brokers, 100)
	const (
		backlog = 60000
		relays  = 2
	)
	w.preload(t, backlog)
	for range relays {
		w.startRelay(t)
	}
	// A crash loses at most the commits of its last 3 x wal_writer_delay
	// (600 ms by default). Bound what the relays deliver in that time by
	// their fastest rate between two looks, over the time from the last
	// look's start to the crash plus 700 ms.
	type look struct {
		at time.Time
		n  int
	}
	var looks []look
	waitFor(t, 2*time.Minute, "a third of the backlog published", func() bool {
		looks = append(looks, look{time.Now(), w.published(t)})
		return looks[len(looks)-1].n >= backlog/3 && len(looks) >= 3
	})
	rate := 0.0 // events per second
	for i := 1; i < len(looks); i++ {
		if d := looks[i].at.Sub(looks[i-1].at).Seconds(); d > 0 {
			rate = max(rate, float64(looks[i].n-looks[i-1].n)/d)
		}
	}
	before := looks[len(looks)-1].n // the last look before the crash
	window := time.Since(looks[len(looks)-1].at) + 700*time.Millisecond
	pg.crash(t, w)
	crashed := time.Now()
	if _, _, err := pg.run(2*time.Minute, "up"); err != nil {
		t.Fatal(err)
	}
	var after int
	waitFor(t, 30*time.Second, "PostgreSQL to answer after the crash", func() bool {
		n, err := w.publishedCount()
		after = n
		return err == nil
	})
	allowed := int(rate*window.Seconds()) + 2*relays*maxBatchSize
	t.Logf("PostgreSQL back %v after the crash: %d events delivered at the last look before it, %d at the first look after the restart (progress taken back: at least %d); fastest rate %.0f/s over %v: %d duplicates allowed",
		time.Since(crashed).Round(time.Millisecond), before, after, max(0, before-after), rate, window.Round(time.Millisecond), allowed)
	ws := w.startWriters(t, 2)
	time.Sleep(2 * time.Second)
	errs := ws.halt()
	t.Logf("writers after the restart: %d commits, %d failed, first failure: %v", ws.commits.Load(), len(errs), firstErr(errs))
	waitFor(t, 3*time.Minute, "every event published", func() bool {
		n, err := countRows(w, w.waiting())
		return err == nil && n == 0
	})
	if n := w.count(t, "attempts > 0 OR parked_at IS NOT NULL"); n != 0 {
		t.Errorf("%d rows charged or parked: a database crash is not the events' fault", n)
	}
	w.check(t, (allowed+maxBatchSize-1)/maxBatchSize)
}
