package testenv

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// Polling intervals of Eventually: the first check is immediate, the next
// after firstPoll, and the pause doubles up to maxPoll, so that a condition
// that holds soon is seen soon and a long wait does not hammer the database.
const (
	firstPoll = 10 * time.Millisecond
	maxPoll   = 50 * time.Millisecond
)

// deadlineGrace is how long before the test binary's deadline (go test
// -timeout) Eventually gives up: early enough that the failure, its reason
// and the test's cleanups run before the binary panics with a stack dump.
const deadlineGrace = 5 * time.Second

// Eventually calls cond until it reports done and returns how long that
// took. cond also says why it is not done yet ("3 of 10 rows published");
// when timeout passes first, Eventually fails the test with the last reason
// and how long it waited. It gives up early, in the same way, when t's
// deadline (go test -timeout, less a few seconds) comes first.
//
// cond runs on the caller's goroutine, which must be the test's (it may call
// t.Fatal); Eventually starts no goroutine and leaves no timer running. The
// first check is immediate, the next ones follow at short intervals
// (10ms, growing to 50ms).
func Eventually(t testing.TB, timeout time.Duration, cond func() (done bool, why string)) time.Duration {
	t.Helper()
	return EventuallyCtx(context.Background(), t, timeout, cond)
}

// EventuallyCtx is Eventually that also gives up when ctx ends (a scenario's
// context, a process that exited), failing the test with ctx's error and the
// last reason. Inside t.Cleanup t.Context() has already ended: pass
// context.Background() there, or use Eventually.
func EventuallyCtx(ctx context.Context, t testing.TB, timeout time.Duration, cond func() (done bool, why string)) time.Duration {
	t.Helper()
	start := time.Now()
	end, cause := start.Add(timeout), fmt.Sprintf("timeout %v", timeout)
	if d, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if dl, ok := d.Deadline(); ok && dl.Add(-deadlineGrace).Before(end) {
			end, cause = dl.Add(-deadlineGrace), fmt.Sprintf("the test binary's deadline (go test -timeout) is at %s", dl.Format(time.TimeOnly))
		}
	}
	timer := time.NewTimer(time.Hour) // Reset before each wait
	defer timer.Stop()
	pause := firstPoll
	for checks := 1; ; checks++ {
		done, why := cond()
		if done {
			return time.Since(start)
		}
		if err := ctx.Err(); err != nil {
			t.Fatalf("gave up waiting after %v (%d checks): %v; last: %s", since(start), checks, context.Cause(ctx), why)
			return time.Since(start) // reached when t's Fatalf returns (a fake TB)
		}
		now := time.Now()
		if !now.Before(end) {
			t.Fatalf("gave up waiting after %v (%d checks, %s); last: %s", since(start), checks, cause, why)
			return time.Since(start)
		}
		timer.Reset(min(pause, end.Sub(now)))
		select {
		case <-timer.C:
		case <-ctx.Done():
		}
		pause = nextPause(pause)
	}
}

// Cond makes a yes/no condition one for Eventually whose reason is what
// it waits for; prefer a cond that tells how far things got.
func Cond(what string, cond func() bool) func() (bool, string) {
	return func() (bool, string) {
		if cond() {
			return true, ""
		}
		return false, "still waiting for " + what
	}
}

// nextPause is the pause after one of pause: twice as long, up to maxPoll.
func nextPause(pause time.Duration) time.Duration { return min(2*pause, maxPoll) }

func since(start time.Time) time.Duration { return time.Since(start).Round(time.Millisecond) }
