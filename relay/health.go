package relay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fxoutbox/outbox/relay/internal/failure"
)

// Pinger is implemented by publishers that can check the broker without
// publishing; SaramaPublisher does.
type Pinger interface {
	Ping(ctx context.Context) error
}

// ErrNotRunning is returned by Health for a relay that is not started or
// is stopping.
var ErrNotRunning = errors.New("not started, or stopping")

// HealthError says which check failed and why.
type HealthError struct {
	Check string // "relay", "database", "broker", "stream" or "backlog"
	Err   error
}

func (e *HealthError) Error() string {
	return "outbox relay unhealthy: " + e.Check + ": " + e.Err.Error()
}
func (e *HealthError) Unwrap() error { return e.Err }

// health remembers the outcome of each worker's latest batch. A worker's
// batch that completes, even with nothing to claim, clears that worker's
// failure: the database answered, and none of the events it failed on is
// waiting any more (it would have claimed them). Workers are tracked apart,
// so one worker's empty claim does not hide another's failing publish.
type health struct {
	mu      sync.Mutex
	workers []workerHealth
	changed chan struct{} // closed and replaced on every change
}

type workerHealth struct {
	err   error
	since time.Time // when the worker's current run of failed batches began
}

func (h *health) init(workers int) {
	h.workers = make([]workerHealth, workers)
	h.changed = make(chan struct{})
}

func (h *health) set(worker int, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	w := &h.workers[worker]
	if w.err == nil && err == nil {
		return
	}
	if err != nil && w.err == nil {
		w.since = time.Now()
	}
	w.err = err
	close(h.changed)
	h.changed = make(chan struct{})
}

// failing returns the oldest failure of a worker whose latest batch failed
// (a nil error when none failed), and a channel closed at the next change.
func (h *health) failing() (since time.Time, err error, changed <-chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, w := range h.workers {
		if w.err != nil && (err == nil || w.since.Before(since)) {
			since, err = w.since, w.err
		}
	}
	return since, err, h.changed
}

// healthWait bounds how long Health waits for the retry it triggers.
const healthWait = 2 * time.Second

// Health checks that the relay can do its job now: it is running, the
// database answers, the broker answers (the publisher's Ping, when it has
// one) and the relay's batches do not fail, and, when maxAge > 0, the oldest
// unpublished event is younger than maxAge. It returns nil or a
// *HealthError whose Check names what failed: "database" for an error of
// PostgreSQL or the way to it, "broker" for a publish that failed.
//
// A failed batch is not taken on trust: when the database and the broker
// both answer, Health cuts the backoff of the failed workers short, so they
// retry at once, and waits for that retry (up to 2s, or ctx): a relay whose
// database or broker came back is healthy again at the first check, with or
// without traffic, and one that still fails says so with the fresh error.
// Events parked or held for their own faults do not make the relay
// unhealthy (a held event shows in the backlog's age). It costs one indexed
// statement and, with a Pinger, one broker round trip; bound it with ctx.
// In Stream mode it also fails ("stream") while the stream lags more than
// StreamConfig.MaxLagBytes or MaxLag; a standby relay, and one that
// publishes by polling because its slot was invalidated, are healthy (see
// StreamStatus and the outbox.stream.state metric for which it is).
// Use it for readiness and liveness probes; it works without fx.
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
	if since, err, changed := r.health.failing(); err != nil {
		// Both answer: retry now instead of at the end of the backoff.
		r.kick()
		t := time.NewTimer(healthWait)
		defer t.Stop()
		for err != nil {
			select {
			case <-changed:
				since, err, changed = r.health.failing()
				continue
			case <-t.C:
			case <-ctx.Done():
			}
			break
		}
		if err != nil {
			return &HealthError{Check: component(err), Err: fmt.Errorf("batches failing since %s: %w", since.Format(time.RFC3339), err)}
		}
	}
	if r.cfg.Mode == Stream {
		if err := r.streamHealth(); err != nil {
			return &HealthError{Check: "stream", Err: err}
		}
	}
	if maxAge > 0 && st.OldestAge > maxAge {
		return &HealthError{Check: "backlog", Err: fmt.Errorf("oldest unpublished event is %s old, over %s (%d waiting)",
			st.OldestAge.Round(time.Millisecond), maxAge, st.Backlog)}
	}
	return nil
}

// component names the part of the system that a batch's error comes from:
// "database" for PostgreSQL (a server error, a failed connect, any failure
// of the batch's statements), "broker" for everything the publisher
// returned.
func component(err error) string {
	if failure.FromDatabase(err) {
		return "database"
	}
	return "broker"
}
