package relay

import (
	"testing"
	"time"
)

// A wake-up that comes while the worker is quiet (its last wake-up found
// nothing: another relay took the events) is deferred to the end of the
// quiet time, not answered at once; the ticker and Stop still end the wait;
// outside the quiet time a wake-up is answered at once. With several relays
// woken by every commit, this is what keeps those that keep finding nothing
// from claiming once per commit.
func TestWakeDuringQuietIsDeferred(t *testing.T) {
	type res struct{ woken, ok bool }
	run := func(r *Relay, tick chan time.Time, wake chan struct{}, quiet time.Time) chan res {
		out := make(chan res, 1)
		go func() {
			w, ok := r.waitWake(tick, wake, quiet)
			out <- res{w, ok}
		}()
		return out
	}
	t.Run("quiet: the wake-up waits, the tick ends the wait", func(t *testing.T) {
		r := &Relay{stop: make(chan struct{})}
		tick, wake := make(chan time.Time), make(chan struct{}, 1)
		out := run(r, tick, wake, time.Now().Add(time.Hour))
		wake <- struct{}{}
		select {
		case tick <- time.Now(): // taken: the wake-up did not end the wait
		case got := <-out:
			t.Fatalf("waitWake = %+v: answered the wake-up at once", got)
		}
		if got := <-out; got != (res{false, true}) {
			t.Fatalf("waitWake = %+v, want ended by the tick", got)
		}
	})
	t.Run("quiet: the wake-up is answered when the quiet time ends", func(t *testing.T) {
		r := &Relay{stop: make(chan struct{})}
		tick, wake := make(chan time.Time), make(chan struct{}, 1)
		out := run(r, tick, wake, time.Now().Add(20*time.Millisecond))
		wake <- struct{}{}
		if got := <-out; got != (res{true, true}) {
			t.Fatalf("waitWake = %+v, want woken", got)
		}
	})
	t.Run("quiet: Stop ends the wait", func(t *testing.T) {
		r := &Relay{stop: make(chan struct{})}
		tick, wake := make(chan time.Time), make(chan struct{}, 1)
		out := run(r, tick, wake, time.Now().Add(time.Hour))
		wake <- struct{}{}
		close(r.stop)
		if got := <-out; got != (res{false, false}) {
			t.Fatalf("waitWake = %+v, want stopped", got)
		}
	})
	t.Run("not quiet: answered at once", func(t *testing.T) {
		r := &Relay{stop: make(chan struct{})}
		tick, wake := make(chan time.Time), make(chan struct{}, 1)
		out := run(r, tick, wake, time.Time{})
		wake <- struct{}{}
		if got := <-out; got != (res{true, true}) {
			t.Fatalf("waitWake = %+v, want woken", got)
		}
	})
}
