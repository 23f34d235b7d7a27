package relay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Pinger is implemented by publishers that can check the broker without
// publishing; SaramaPublisher does.
type Pinger interface {
	Ping(ctx context.Context) error
}

// ErrNotRunning is returned by Health for a relay that is not started or
// is stopping.
var ErrNotRunning = errors.New("relay: not running")

// HealthError says which check failed and why.
type HealthError struct {
	Check string // "relay", "database", "broker" or "backlog"
	Err   error
}

func (e *HealthError) Error() string {
	return "outbox relay unhealthy: " + e.Check + ": " + e.Err.Error()
}
func (e *HealthError) Unwrap() error { return e.Err }

// health remembers the outcome of the relay's latest batch that did
// something: a worker that found nothing to claim says nothing about the
// broker, so it does not clear another worker's failure.
type health struct {
	mu      sync.Mutex
	lastErr error
	since   time.Time // when the current run of failed batches began
}

func (h *health) set(published int, err error) {
	if published == 0 && err == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if err != nil && h.lastErr == nil {
		h.since = time.Now()
	}
	h.lastErr = err
}

// failing returns when the current run of failed batches began and its last
// error, or a nil error when the latest batch succeeded.
func (h *health) failing() (time.Time, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.since, h.lastErr
}

// Health checks that the relay can do its job: it is running, the database
// answers, the broker answers (the publisher's Ping, when it has one) and
// the last batch did not fail, and, when maxAge > 0, the oldest unpublished
// event is younger than maxAge. It returns nil or a *HealthError. It costs
// one indexed statement and, with a Pinger, one broker round trip; bound it
// with ctx. Use it for readiness and liveness probes; it works without fx.
func (r *Relay) Health(ctx context.Context, maxAge time.Duration) error {
	r.mu.Lock()
	running := r.started
	if running {
		select {
		case <-r.stop:
			running = false
		default:
		}
	}
	r.mu.Unlock()
	if !running {
		return &HealthError{Check: "relay", Err: ErrNotRunning}
	}
	st, err := r.Stats(ctx)
	if err != nil {
		return &HealthError{Check: "database", Err: err}
	}
	if p, ok := r.pub.(Pinger); ok {
		if err := p.Ping(ctx); err != nil {
			return &HealthError{Check: "broker", Err: err}
		}
	}
	if since, err := r.health.failing(); err != nil {
		return &HealthError{Check: "broker", Err: fmt.Errorf("batches failing since %s: %w", since.Format(time.RFC3339), err)}
	}
	if maxAge > 0 && st.OldestAge > maxAge {
		return &HealthError{Check: "backlog", Err: fmt.Errorf("oldest unpublished event is %s old, over %s (%d waiting)",
			st.OldestAge.Round(time.Millisecond), maxAge, st.Backlog)}
	}
	return nil
}
