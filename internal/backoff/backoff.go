// Package backoff is the one failure/backoff helper of the library's
// long-running loops: the relay's workers, its stream and LISTEN
// connection, and the inbox's consumer group and record retries. It counts
// consecutive failures and says how long to wait after each, and it sleeps
// that long unless the loop is stopping or a health probe cuts it short.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff counts consecutive failures. After the first it waits Initial;
// after each further one twice the previous wait, up to Max. With Jitter
// (0 to 1) each wait is spread by up to ±Jitter of itself, so that
// replicas do not retry in step. The zero value of the counter is "no
// failure yet"; Reset returns to it after a success.
type Backoff struct {
	Initial time.Duration
	Max     time.Duration
	Jitter  float64
	n       int
}

// Failures returns the number of consecutive failures counted.
func (b *Backoff) Failures() int { return b.n }

// Reset forgets the failures (after a success).
func (b *Backoff) Reset() { b.n = 0 }

// Fail counts a failure and returns the wait before the next try.
func (b *Backoff) Fail() time.Duration {
	b.n++
	return b.Delay(b.n)
}

// Delay returns the wait after failures consecutive failures (at least
// one): Initial, then doubling up to Max (the first wait is Initial even
// above Max), spread by Jitter.
func (b *Backoff) Delay(failures int) time.Duration {
	d := b.Initial
	for i := 1; i < failures && d < b.Max; i++ {
		d *= 2
	}
	if failures > 1 {
		d = min(d, b.Max)
	}
	if b.Jitter > 0 {
		d = time.Duration(float64(d) * (1 - b.Jitter + 2*b.Jitter*rand.Float64()))
	}
	return d
}

// Wait counts a failure and sleeps the wait it implies (see Sleep).
func (b *Backoff) Wait(ctx context.Context, stop, kick <-chan struct{}) bool {
	return Sleep(ctx, b.Fail(), stop, kick)
}

// Sleep waits d. It returns false when ctx ends or stop is closed first,
// true when d passed or kick received (a health probe that found the
// failed dependency answering again cuts the wait short). Nil channels
// never fire.
func Sleep(ctx context.Context, d time.Duration, stop, kick <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-stop:
		return false
	case <-t.C:
		return true
	case <-kick:
		return true
	}
}
