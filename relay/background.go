package relay

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox/internal/backoff"
	"github.com/fxoutbox/outbox/internal/sqlname"
)

type acquirer interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// listen holds a connection that LISTENs on the table's channel and wakes
// the relay on every notification, until ctx ends. A lost connection is
// re-established with backoff; each (re)connect wakes the relay once, since
// notifications sent meanwhile were lost.
func (r *Relay) listen(ctx context.Context) {
	b := r.newBackoff()
	b.Initial = min(250*time.Millisecond, r.cfg.PollInterval)
	for {
		start := time.Now()
		err := r.listenOnce(ctx)
		if time.Since(start) > time.Minute {
			b.Reset() // it worked for a while: this is a new failure
		}
		if ctx.Err() != nil {
			return
		}
		d := b.Fail()
		if b.Failures() == 1 {
			r.cfg.Logger.Warn("outbox relay: LISTEN connection lost; polling every PollInterval until it is back",
				"channel", sqlname.Channel(r.cfg.Table), "error", err)
		}
		if !backoff.Sleep(ctx, d, nil, nil) {
			return
		}
	}
}

func (r *Relay) listenOnce(ctx context.Context) error {
	pc, err := r.db.(acquirer).Acquire(ctx)
	if err != nil {
		return err
	}
	// The connection keeps its LISTEN: it never goes back to the pool.
	conn := pc.Hijack()
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	if _, err := conn.Exec(ctx, r.q.Listen); err != nil {
		return fmt.Errorf("relay: listen: %w", err)
	}
	r.Wake()
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		r.Wake()
	}
}

// clean deletes old published rows every CleanupInterval until ctx ends.
func (r *Relay) clean(ctx context.Context) {
	t := time.NewTicker(r.cfg.CleanupInterval)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for {
			start := time.Now()
			n, err := r.Cleanup(ctx)
			if ctx.Err() != nil {
				return
			}
			_, err = r.metrics.lap(ctx, StepCleanup, start, err)
			if err != nil && !failing {
				r.cfg.Logger.Warn("outbox relay: deleting old published rows failed; retrying next interval", "table", r.cfg.Table.String(), "error", err)
			}
			failing = err != nil
			if err != nil || n < r.cfg.CleanupBatch {
				break
			}
		}
	}
}

// Cleanup deletes up to CleanupBatch rows published more than Retention ago,
// in one short statement that skips rows other relays have locked, and
// returns how many it deleted. Started relays call it every CleanupInterval;
// call it yourself to clean on your own schedule (with Retention < 0 it
// deletes nothing).
//
// On a partitioned table (migrations.Partitioned) it deletes no row: it
// runs MaintainPartitions, which drops whole partitions, and returns 0.
func (r *Relay) Cleanup(ctx context.Context) (int, error) {
	if err := r.settleProgress(ctx); err != nil {
		return 0, err
	}
	if yes, err := r.isPartitioned(ctx); err != nil {
		return 0, err
	} else if yes {
		_, err := r.MaintainPartitions(ctx)
		return 0, err
	}
	if r.cfg.Retention < 0 {
		return 0, nil
	}
	tx, err := r.db.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("relay: cleanup: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	cutoff := time.Now().Add(-r.cfg.Retention)
	ct, err := tx.Exec(ctx, r.q.Cleanup, cutoff, r.cfg.CleanupBatch)
	if err != nil {
		return 0, fmt.Errorf("relay: cleanup %s: %w", r.cfg.Table, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("relay: cleanup commit: %w", err)
	}
	return int(ct.RowsAffected()), nil
}
