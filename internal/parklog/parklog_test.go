package parklog

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type summed struct {
	mu    sync.Mutex
	n     map[Cause]int64
	lines int
}

func (s *summed) summary(_ *slog.Logger, c Cause, n int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n[c] += n
	s.lines++
}

// Every event is either logged alone or in a summary; past maxCauses the
// further causes share one; a cause quiet for a whole interval starts over;
// Run stops with its context.
func TestCountsAreExact(t *testing.T) {
	s := &summed{n: map[Cause]int64{}}
	l := New(slog.New(slog.DiscardHandler), 3, time.Hour, s.summary)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { l.Run(ctx) })
	alone := map[Cause]int64{}
	for i := range 5000 {
		c := Cause{Topic: "t", Reason: fmt.Sprint("r", i%(maxCauses+20))}
		if l.Parked(c) {
			alone[c]++
		}
	}
	l.Flush()
	var total int64
	for _, n := range alone {
		total += n
	}
	for c, n := range s.n {
		total += n
		if c != (Cause{}) && alone[c] != 3 {
			t.Errorf("cause %v: %d alone, want 3", c, alone[c])
		}
	}
	if total != 5000 || s.lines != maxCauses+1 || s.n[Cause{}] != 20*(5000/(maxCauses+20)) {
		t.Errorf("accounted %d of 5000 in %d summaries (%d for other causes)", total, s.lines, s.n[Cause{}])
	}
	// Seen since the last Flush: still known, counted. Then a quiet
	// interval: forgotten, alone again.
	c := Cause{Topic: "t", Reason: "r0"}
	if l.Parked(c) {
		t.Error("a known cause's event logged alone")
	}
	l.Flush()
	l.Flush()
	if !l.Parked(c) {
		t.Error("a cause quiet for an interval is not logged alone again")
	}
	cancel()
	wg.Wait()
	if got := More(1, "event") + "/" + More(1998, "event"); got != "1 more event/1,998 more events" {
		t.Errorf("More: %s", got)
	}
}
