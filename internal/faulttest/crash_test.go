package faulttest

import (
	"testing"
	"time"
)

// TestRelaySurvivesBrokerCrash SIGKILLs the broker while writers commit and
// the relay publishes, keeps writing through the outage, restarts the broker
// on the same data directory, and checks that the same relay (never
// restarted) publishes every committed event, in per-key order, with at
// most one batch of duplicates.
func TestRelaySurvivesBrokerCrash(t *testing.T) {
	b := faultBroker(t)
	w := newWorld(t, b, 50)
	stopRelay := w.startRelay(t)
	ws := w.startWriters(t, 6)

	// Let the producer connect and publish for a while, so the crash hits it
	// with batches in flight.
	waitFor(t, 30*time.Second, "the relay to publish 500 events", func() bool { return w.published(t) >= 500 })

	b.kill(t)
	killed := time.Now()
	before := ws.commits.Load()
	time.Sleep(5 * time.Second)
	during := ws.commits.Load() - before
	backlog := w.unpublished(t)
	t.Logf("broker down: writers committed %d events in %v; %d unpublished", during, time.Since(killed).Round(time.Millisecond), backlog)
	if during == 0 {
		t.Errorf("writers committed nothing while Kafka was down: the outbox must decouple them from the broker")
	}
	if backlog == 0 {
		t.Errorf("nothing unpublished while the broker was down: the crash did not reach the relay")
	}

	b.up(t)
	restarted := time.Now()
	time.Sleep(2 * time.Second) // writers go on while the relay recovers
	errs := ws.halt()
	if len(errs) > 0 {
		t.Errorf("%d writer commits failed, first: %v (writers must never need Kafka)", len(errs), errs[0])
	}
	t.Logf("writers committed %d events in all (outage %v)", ws.commits.Load(), restarted.Sub(killed).Round(time.Millisecond))

	took := waitFor(t, 90*time.Second, "the relay to publish every row after the restart", func() bool { return w.unpublished(t) == 0 })
	t.Logf("backlog drained %v after the broker was back (%v after writers stopped)", time.Since(restarted).Round(time.Millisecond), took.Round(time.Millisecond))
	if n := w.count(t, "attempts > 0 OR parked_at IS NOT NULL"); n != 0 {
		t.Errorf("%d rows charged an attempt or parked because of a broker crash: an outage is retried, never held against events", n)
	}
	stopRelay()
	w.verify(t, 1)
}

// TestRelayStartsWhileBrokerDown starts the relay while the broker is down:
// Start succeeds (the SaramaPublisher connects lazily), writers commit, the
// relay retries with backoff, and once the broker is up it publishes
// everything.
func TestRelayStartsWhileBrokerDown(t *testing.T) {
	b := faultBroker(t)
	w := newWorld(t, b, 20)
	b.kill(t)

	for i := range 300 {
		if err := w.commit(w.ctx, w.key(i)); err != nil {
			t.Fatalf("commit %d with Kafka down: %v", i, err)
		}
	}
	stopRelay := w.startRelay(t) // fails the test if Start does
	ws := w.startWriters(t, 2)
	time.Sleep(3 * time.Second)
	if n := w.published(t); n != 0 {
		t.Fatalf("%d events marked published with no broker", n)
	}

	b.up(t)
	restarted := time.Now()
	time.Sleep(time.Second)
	if errs := ws.halt(); len(errs) > 0 {
		t.Errorf("%d writer commits failed, first: %v", len(errs), errs[0])
	}
	waitFor(t, 90*time.Second, "the relay to publish every row once the broker is up", func() bool { return w.unpublished(t) == 0 })
	t.Logf("%d events published %v after the broker came up", w.published(t), time.Since(restarted).Round(time.Millisecond))
	stopRelay()
	w.verify(t, 1)
}
