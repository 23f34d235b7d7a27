package backoff

import (
	"context"
	"testing"
	"time"
)

func TestDelayDoublesUpToMax(t *testing.T) {
	b := Backoff{Initial: 100 * time.Millisecond, Max: time.Second}
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i, w := range want {
		if got := b.Fail(); got != w*time.Millisecond {
			t.Fatalf("failure %d: wait %v, want %v", i+1, got, w*time.Millisecond)
		}
	}
	if b.Failures() != len(want) {
		t.Fatalf("Failures() = %d, want %d", b.Failures(), len(want))
	}
	b.Reset()
	if got := b.Fail(); got != 100*time.Millisecond {
		t.Fatalf("after Reset: wait %v, want the initial 100ms", got)
	}
}

// The first wait is Initial even above Max (the inbox's group backoff
// starts at ten times MinBackoff), then Max.
func TestFirstWaitIsInitialAboveMax(t *testing.T) {
	b := Backoff{Initial: 2 * time.Second, Max: time.Second}
	if got := b.Fail(); got != 2*time.Second {
		t.Fatalf("first wait %v, want 2s", got)
	}
	if got := b.Fail(); got != time.Second {
		t.Fatalf("second wait %v, want the cap 1s", got)
	}
}

func TestJitterStaysWithinBounds(t *testing.T) {
	b := Backoff{Initial: time.Second, Max: 30 * time.Second, Jitter: 0.2}
	lo, hi := time.Duration(1<<62), time.Duration(0)
	for range 1000 {
		d := b.Delay(1)
		lo, hi = min(lo, d), max(hi, d)
		if d < 800*time.Millisecond || d > 1200*time.Millisecond {
			t.Fatalf("wait %v outside 1s ±20%%", d)
		}
	}
	if hi-lo < 100*time.Millisecond {
		t.Fatalf("waits spread over only %v: no jitter", hi-lo)
	}
}

func TestSleepEndsOnStopContextOrKick(t *testing.T) {
	stop := make(chan struct{})
	close(stop)
	if Sleep(context.Background(), time.Hour, stop, nil) {
		t.Fatal("Sleep returned true with stop closed")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, time.Hour, nil, nil) {
		t.Fatal("Sleep returned true with ctx done")
	}
	kick := make(chan struct{}, 1)
	kick <- struct{}{}
	if !Sleep(context.Background(), time.Hour, nil, kick) {
		t.Fatal("Sleep returned false on a kick")
	}
	if !Sleep(context.Background(), time.Millisecond, nil, nil) {
		t.Fatal("Sleep returned false after its wait")
	}
}
