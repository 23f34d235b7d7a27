package inbox_test

import (
	"os"
	"strconv"
	"testing"
	"time"
)

// TestMeasureThroughput reports how fast one consumer applies a backlog
// (INBOX_TEST_MEASURE=<events>, INBOX_TEST_CONCURRENCY=<n>, default 16), and
// checks that every event was applied once. It asserts no speed.
func TestMeasureThroughput(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("INBOX_TEST_MEASURE"))
	if n <= 0 {
		t.Skip("set INBOX_TEST_MEASURE=<events> to measure")
	}
	conc, _ := strconv.Atoi(os.Getenv("INBOX_TEST_CONCURRENCY"))
	e := newEnv(t, 6)
	all := e.produce(events(n, 200)...)
	g := group()
	cfg := e.config(g, e.effect("m"))
	cfg.Concurrency = conc
	start := time.Now()
	e.start(cfg)
	e.waitEffects(n)
	d := time.Since(start)
	e.checkOnce(all)
	t.Logf("%d events, 6 partitions, 200 keys, concurrency %d: %v, %.0f events/s", n, cfg.Concurrency, d.Round(time.Millisecond), float64(n)/d.Seconds())
}
