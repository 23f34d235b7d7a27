package faulttest

import (
	"maps"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
)

// TestRelayKilledBetweenAckAndCommit runs a relay in a child process that
// SIGKILLs itself right after its third batch was acknowledged by Kafka,
// before the relay marked the rows and committed. A fresh relay then
// publishes everything: nothing is lost, the killed batch is the only thing
// sent twice, and its duplicates carry the same x-event-id (and the same key
// and payload) as the first records.
//
// With OUTBOX_TEST_DELIVERY=exactly-once the child SIGKILLs itself after
// its third batch's Kafka transaction committed, before the batch's mark:
// then nothing at all is delivered twice to a read_committed consumer.
//
// It needs DATABASE_URL and KAFKA_BROKERS (any Kafka-protocol broker: the
// broker is not harmed), so it runs in make test and make test-kafka.
func TestRelayKilledBetweenAckAndCommit(t *testing.T) {
	pool := testenv.Pool(t)
	w := newWorldOn(t, pool, testenv.Brokers(t), 40)
	for i := range 600 { // a backlog: the child's batches are full
		if err := w.commit(w.ctx, w.key(i*7)); err != nil {
			t.Fatal(err)
		}
	}
	ws := w.startWriters(t, 2)

	const killAfter = 3
	child := startHelper(t, w, "kill", envHelperAfter+"="+strconv.Itoa(killAfter))
	killed := strings.Split(child.next("KILL", 60*time.Second), ",")
	st := child.wait(30 * time.Second)
	if ws, ok := st.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("relay process ended with %v, want killed by SIGKILL", st)
	}
	t.Logf("relay process SIGKILLed after batch %d was acknowledged (%d events); %d events published before",
		killAfter, len(killed), w.published(t))
	if len(killed) == 0 || len(killed) > maxBatchSize {
		t.Fatalf("killed batch has %d events, want 1..%d", len(killed), maxBatchSize)
	}
	// The crash hit between the ack and the commit: the acknowledged batch
	// must still be unpublished in the table. A relay that marks (and
	// commits) before it publishes shows up here: a crash between its
	// commit and its publish would lose the batch.
	if n := w.count(t, w.delivered()+" AND event_id::text = ANY('{"+strings.Join(killed, ",")+"}')"); n != 0 {
		t.Errorf("%d of the %d events acknowledged just before the SIGKILL are marked published: "+
			"rows must be marked only after their ack, in the claim's transaction", n, len(killed))
	}

	stop := w.startRelay(t) // a fresh relay, in this process
	time.Sleep(time.Second)
	if errs := ws.halt(); len(errs) > 0 {
		t.Errorf("%d writer commits failed, first: %v", len(errs), errs[0])
	}
	waitFor(t, 60*time.Second, "the fresh relay to publish every row", func() bool { return w.unpublished(t) == 0 })
	stop()

	d := w.check(t, 1)
	if w.delivery == relay.ExactlyOnce {
		// The killed batch's Kafka transaction committed before the
		// SIGKILL: the fresh relay read the lane's progress back and
		// marked it instead of sending it again. check allowed no
		// duplicate read_committed, and found every event of it.
		if !t.Failed() {
			t.Logf("exactly once: the %d events of the killed batch were delivered once", len(killed))
		}
		return
	}
	// Only the killed batch may be duplicated, and all of it was: it was
	// acknowledged once by the dead relay and sent again by the fresh one.
	want := map[string]bool{}
	for _, id := range killed {
		want[id] = true
	}
	for id, n := range d.dups {
		if !want[id] {
			t.Errorf("event %s delivered %d extra time(s) but was not in the batch the crash interrupted", id, n)
		} else if n != 1 {
			t.Errorf("event %s of the interrupted batch delivered %d extra times, want 1", id, n)
		}
	}
	missing := 0
	for id := range want {
		if d.dups[id] == 0 {
			missing++
		}
	}
	if missing > 0 {
		t.Errorf("%d of the %d events of the interrupted batch were not delivered twice (dups %v): the fresh relay should have sent them again",
			missing, len(want), slices.Sorted(maps.Keys(d.dups)))
	}
}
