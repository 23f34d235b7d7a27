package faulttest

import (
	"strings"
	"testing"
	"time"

	"github.com/fxoutbox/outbox/internal/sqlname"
)

// TestBrokerOutage30sParksNothing takes the broker away (SIGKILL) for 30
// seconds while writers commit and a relay publishes, then restarts it. An
// outage is not the events' fault: afterwards every row has attempts = 0
// and parked_at NULL, and every committed event was delivered, in per-key
// order, with at most one batch of duplicates. Runs with
// OUTBOX_TEST_REAL_KAFKA=1 (make test-kafka), on the package's own broker.
func TestBrokerOutage30sParksNothing(t *testing.T) {
	const outage = 30 * time.Second
	b := faultBroker(t)
	w := newWorld(t, b, 50)
	stopRelay := w.startRelay(t)
	ws := w.startWriters(t, 4)
	waitFor(t, 30*time.Second, "the relay to publish 300 events", func() bool { return w.published(t) >= 300 })

	b.kill(t)
	killed := time.Now()
	before := ws.commits.Load()
	time.Sleep(outage)
	during := ws.commits.Load() - before
	backlog := w.unpublished(t)
	t.Logf("broker down %v: writers committed %d events, %d unpublished", time.Since(killed).Round(time.Millisecond), during, backlog)
	if during == 0 || backlog == 0 {
		t.Errorf("writers committed %d events and %d are unpublished during the outage: want both > 0", during, backlog)
	}
	// During the outage already, nothing is charged or parked.
	if n := w.count(t, "attempts > 0 OR parked_at IS NOT NULL"); n != 0 {
		t.Errorf("%d rows charged or parked during the broker outage", n)
	}

	upAfterOutage(t, b)
	restarted := time.Now()
	time.Sleep(2 * time.Second)
	if errs := ws.halt(); len(errs) > 0 {
		t.Errorf("%d writer commits failed, first: %v (writers must never need Kafka)", len(errs), errs[0])
	}
	waitFor(t, 120*time.Second, "the relay to publish every row after the outage", func() bool { return w.unpublished(t) == 0 })
	t.Logf("backlog drained %v after the broker was back", time.Since(restarted).Round(time.Millisecond))
	if n := w.count(t, "attempts > 0 OR parked_at IS NOT NULL OR last_error IS NOT NULL"); n != 0 {
		var sample string
		_ = w.pool.QueryRow(w.ctx, "SELECT format('attempts=%s parked_at=%s last_error=%s', attempts, parked_at, last_error) FROM "+
			sqlname.Ident(w.table)+" WHERE attempts > 0 OR parked_at IS NOT NULL OR last_error IS NOT NULL LIMIT 1").Scan(&sample)
		t.Errorf("%d rows were charged an attempt or parked because of a broker outage, e.g. %s", n, sample)
	}
	stopRelay()
	w.verify(t, 1)
}

// upAfterOutage restarts the broker, retrying a start that failed. The
// broker's port lies in Linux's ephemeral range (32768-60999): after 30 s
// of clients dialing it, the JVM has been seen to fail its bind with
// "Address already in use" once, a fault of the test machine, not of the
// relay (a client's dial to a port in that range with nobody listening
// can connect to itself and hold the port for a moment). The crash tests
// restart the broker many times, so it retries a few times.
func upAfterOutage(t *testing.T, b *broker) {
	t.Helper()
	for i := 1; ; i++ {
		start := time.Now()
		_, _, err := b.run(3*time.Minute, "up")
		if err == nil {
			t.Logf("broker %s up in %v", b.addr, time.Since(start).Round(time.Millisecond))
			return
		}
		if i == 5 {
			t.Fatal(err)
		}
		t.Logf("broker restart %d failed, retrying: %v", i, strings.SplitN(err.Error(), "\n", 2)[0])
		time.Sleep(3 * time.Second)
	}
}
