package testenv

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// These tests need no service: they run without DATABASE_URL.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeT records what Eventually does with its test instead of ending it.
// Any other method of testing.TB panics (nil embedded interface).
type fakeT struct {
	testing.TB
	helpers int
	fatal   []string
}

func (f *fakeT) Helper() { f.helpers++ }
func (f *fakeT) Fatalf(format string, args ...any) {
	f.fatal = append(f.fatal, fmt.Sprintf(format, args...))
}

// deadlineT is a fakeT whose test binary ends at deadline.
type deadlineT struct {
	*fakeT
	deadline time.Time
}

func (d deadlineT) Deadline() (time.Time, bool) { return d.deadline, true }

// counter is a condition that is done on call doneAt (never when 0) and
// otherwise says which call it was.
type counter struct {
	calls, doneAt int
	onCall        func(n int)
}

func (c *counter) cond() (bool, string) {
	c.calls++
	if c.onCall != nil {
		c.onCall(c.calls)
	}
	return c.calls == c.doneAt, fmt.Sprintf("check %d not done", c.calls)
}

func TestEventuallyDoneAtOnce(t *testing.T) {
	c := &counter{doneAt: 1}
	Eventually(t, time.Minute, c.cond)
	if c.calls != 1 {
		t.Errorf("cond called %d times, want once: a condition that holds is not polled again", c.calls)
	}
}

func TestEventuallyPollsUntilDone(t *testing.T) {
	f := &fakeT{}
	c := &counter{doneAt: 5}
	Eventually(f, time.Minute, c.cond)
	if c.calls != 5 || len(f.fatal) != 0 {
		t.Errorf("cond called %d times, failures %q; want 5 calls and no failure", c.calls, f.fatal)
	}
	if f.helpers == 0 {
		t.Error("Eventually did not call t.Helper: failures would point into testenv")
	}
}

func TestEventuallyTimeoutReportsTheLastReason(t *testing.T) {
	f := &fakeT{}
	c := &counter{}
	const timeout = 150 * time.Millisecond
	waited := Eventually(f, timeout, c.cond)
	if len(f.fatal) != 1 {
		t.Fatalf("failures %q, want one", f.fatal)
	}
	msg := f.fatal[0]
	last := fmt.Sprintf("check %d not done", c.calls)
	if c.calls < 2 || !strings.Contains(msg, last) || !strings.Contains(msg, "timeout 150ms") || !strings.Contains(msg, "gave up waiting after") {
		t.Errorf("after %d checks the failure is %q; want it to name the timeout, how long it waited and the last reason %q", c.calls, msg, last)
	}
	if waited < timeout {
		t.Errorf("gave up after %v, before the timeout %v", waited, timeout)
	}
}

func TestEventuallyStopsBeforeTheTestDeadline(t *testing.T) {
	// The binary's deadline comes long before the timeout: Eventually fails
	// in time for the reason to be seen instead of the binary's panic.
	f := deadlineT{fakeT: &fakeT{}, deadline: time.Now().Add(deadlineGrace + 100*time.Millisecond)}
	c := &counter{}
	Eventually(f, 20*time.Second, c.cond)
	if len(f.fatal) != 1 || !strings.Contains(f.fatal[0], "deadline") || !strings.Contains(f.fatal[0], fmt.Sprintf("check %d not done", c.calls)) {
		t.Errorf("failures %q; want one naming the test's deadline and the last reason", f.fatal)
	}

	// Already past: one check, then the failure.
	f = deadlineT{fakeT: &fakeT{}, deadline: time.Now().Add(-time.Second)}
	c = &counter{}
	Eventually(f, 20*time.Second, c.cond)
	if c.calls != 1 || len(f.fatal) != 1 || !strings.Contains(f.fatal[0], "deadline") {
		t.Errorf("past the deadline: %d checks, failures %q; want one check and a failure naming the deadline", c.calls, f.fatal)
	}

	// A deadline after the timeout does not matter.
	f = deadlineT{fakeT: &fakeT{}, deadline: time.Now().Add(time.Hour)}
	c = &counter{}
	Eventually(f, 50*time.Millisecond, c.cond)
	if len(f.fatal) != 1 || !strings.Contains(f.fatal[0], "timeout 50ms") {
		t.Errorf("failures %q; want one naming the timeout", f.fatal)
	}
}

func TestEventuallyCtxStopsWhenTheContextEnds(t *testing.T) {
	broker := errors.New("the broker process exited")
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(broker)
	f := &fakeT{}
	c := &counter{}
	EventuallyCtx(ctx, f, 20*time.Second, c.cond)
	if c.calls != 1 || len(f.fatal) != 1 || !strings.Contains(f.fatal[0], broker.Error()) || !strings.Contains(f.fatal[0], "check 1 not done") {
		t.Errorf("ended context: %d checks, failures %q; want one check and a failure with the cause and the reason", c.calls, f.fatal)
	}

	// Ended while waiting: the wait ends too, after one last check.
	ctx, cancel = context.WithCancelCause(context.Background())
	defer cancel(nil)
	f = &fakeT{}
	c = &counter{onCall: func(n int) {
		if n == 3 {
			cancel(broker)
		}
	}}
	EventuallyCtx(ctx, f, 20*time.Second, c.cond)
	if c.calls != 3 || len(f.fatal) != 1 || !strings.Contains(f.fatal[0], broker.Error()) {
		t.Errorf("context ended at check 3: %d checks, failures %q; want 3 and a failure with the cause", c.calls, f.fatal)
	}

	// A condition that holds wins over an ended context.
	f = &fakeT{}
	c = &counter{doneAt: 1}
	EventuallyCtx(ctx, f, time.Minute, c.cond)
	if len(f.fatal) != 0 {
		t.Errorf("a condition that holds failed: %q", f.fatal)
	}
}

func TestEventuallyLeavesNoGoroutine(t *testing.T) {
	Eventually(&fakeT{}, 30*time.Millisecond, (&counter{}).cond)
	ctx, cancel := context.WithCancel(context.Background())
	EventuallyCtx(ctx, &fakeT{}, time.Minute, (&counter{onCall: func(n int) {
		if n == 2 {
			cancel()
		}
	}}).cond)
	Eventually(&fakeT{}, time.Minute, (&counter{doneAt: 3}).cond)
	goleak.VerifyNone(t)
}

func TestCond(t *testing.T) {
	held := false
	cond := Cond("the relay to start", func() bool { return held })
	if done, why := cond(); done || why != "still waiting for the relay to start" {
		t.Errorf("cond() = %v, %q; want false and what it waits for", done, why)
	}
	held = true
	if done, _ := cond(); !done {
		t.Error("cond() = false for a condition that holds")
	}
}

func TestPollPausesGrowToTheCap(t *testing.T) {
	pause, seen := firstPoll, []time.Duration{}
	for range 5 {
		seen = append(seen, pause)
		pause = nextPause(pause)
	}
	want := []time.Duration{10 * time.Millisecond, 20 * time.Millisecond, 40 * time.Millisecond, 50 * time.Millisecond, 50 * time.Millisecond}
	if fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Errorf("pauses %v, want %v", seen, want)
	}
}
