package faulttest

import (
	"math/rand/v2"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/fxoutbox/outbox/internal/testenv"
)

// TestRelayProcessesKilledEveryHalfSecond runs three relay processes (the
// test binary re-executed, see TestHelperRelayProcess, mode "run") on a
// backlog and a stream of writes, and SIGKILLs one of them every 0.5 s for
// 10 s (OUTBOX_FAULTTEST_KILL_FOR), starting a fresh one in its place each
// time: batches are cut wherever the signal lands (claimed, in Publish,
// acknowledged and not committed, committing). A relay in this process
// then publishes the rest. Nothing may be lost, each key's first
// deliveries must be in write order, nothing charged or parked, and each
// kill may repeat at most the batch it interrupted.
//
// Under OUTBOX_TEST_PROGRESS=cursor every one of them records cursor
// progress; under OUTBOX_TEST_DELIVERY=exactly-once they deliver exactly
// once (then read_committed, not one duplicate).
//
// It needs DATABASE_URL and KAFKA_BROKERS (the broker is not harmed), so it
// runs in make test and make test-kafka.
func TestRelayProcessesKilledEveryHalfSecond(t *testing.T) {
	const (
		replicas = 3
		every    = 500 * time.Millisecond
	)
	killFor := 10 * time.Second
	if v := os.Getenv("OUTBOX_FAULTTEST_KILL_FOR"); v != "" {
		var err error
		if killFor, err = time.ParseDuration(v); err != nil {
			t.Fatalf("OUTBOX_FAULTTEST_KILL_FOR=%q: %v", v, err)
		}
	}
	w := newWorldOn(t, testenv.Pool(t), testenv.Brokers(t), 100)
	w.preload(t, 40000) // batches in flight when the kills land
	ws := w.startWriters(t, 4)
	procs := make([]*proc, replicas)
	for i := range procs {
		procs[i] = startHelper(t, w, "run")
	}
	waitFor(t, 30*time.Second, "the relay processes to publish", func() bool { return w.published(t) > 0 })

	start := time.Now()
	kills := 0
	tick := time.NewTicker(every)
	for time.Since(start) < killFor {
		<-tick.C
		i := rand.IntN(replicas)
		procs[i].signal(syscall.SIGKILL)
		st := procs[i].wait(30 * time.Second)
		if ws, ok := st.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("relay process ended with %v before its SIGKILL", st)
		}
		kills++
		procs[i] = startHelper(t, w, "run")
	}
	tick.Stop()
	took := time.Since(start)
	t.Logf("%d relay processes SIGKILLed in %v (one every %v); %d of %d events published",
		kills, took.Round(time.Millisecond), (took / time.Duration(max(1, kills))).Round(time.Millisecond), w.published(t), w.count(t, "true"))

	stop := w.startRelay(t)
	time.Sleep(time.Second)
	if errs := ws.halt(); len(errs) > 0 {
		t.Errorf("%d writer commits failed, first: %v", len(errs), errs[0])
	}
	waitFor(t, 2*time.Minute, "every row to be published", func() bool { return w.unpublished(t) == 0 })
	for _, p := range procs {
		p.signal(syscall.SIGTERM) // nothing left to publish: they stop cleanly
	}
	for _, p := range procs {
		p.wait(30 * time.Second)
	}
	stop()
	if n := w.count(t, "attempts > 0 OR parked_at IS NOT NULL"); n != 0 {
		t.Errorf("%d rows charged an attempt or parked because relays were killed", n)
	}
	// Each kill may repeat the batch it interrupted (at most maxBatchSize).
	w.check(t, kills)
}
