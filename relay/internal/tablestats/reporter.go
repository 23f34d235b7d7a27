// Package tablestats is the relay's reporter of table-wide statistics: the
// backlog, the age of the oldest waiting event and the parked events by
// topic and reason, read by one relay of a table, the one holding a
// session-level advisory lock, and cached for the relay's gauges (scrapes
// cost no query).
package tablestats

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/tablesql"
)

// DB is the relay's database: Begin, and, for a pool, Acquire (see
// Config.DB).
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// acquirer is a DB that can give out a connection of its own (a
// *pgxpool.Pool).
type acquirer interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// Config configures a Reporter. Every field is required.
type Config struct {
	// DB is read from. When it can Acquire (a *pgxpool.Pool), the reporter
	// takes a connection out of it to hold the lock; otherwise there is no
	// lock and every relay reports.
	DB    DB
	Table outbox.Table
	// LockNamespace and LockKey are the two keys of the session-level
	// advisory lock the reporting relay holds.
	LockNamespace, LockKey int32
	// Interval is the time between reads (longer after a slow read) and
	// between tries to take the lock.
	Interval time.Duration
	Logger   *slog.Logger
	// Failed is called with each failed read (after the reporter logged the
	// first of a run of failures), e.g. to count it.
	Failed func(ctx context.Context, err error)
	// ErrorType names an error's cause for the log (error.type).
	ErrorType func(error) string
	// Settings returns the statements that set a read's settings for its
	// transaction (tx) or for the session of the connection holding the
	// lock (session), with their arguments: the relay's batch settings (no
	// JIT, no parallel plans, under cursor progress no sequential scans),
	// as they stand at the read. The counts probe the rows of running
	// transactions through the (txid, id) index, and after a bulk load the
	// planner would scan the table for each probe, or compile the plan at
	// every read.
	Settings func() (tx, session string, args []any)
}

// Stats are the table-wide statistics.
type Stats struct {
	Backlog int64   // unpublished, unparked events (counted up to 1,000,000)
	Age     float64 // seconds, never negative
	Future  bool    // the oldest waiting event's created_at is in the future
	Parked  []Parked
}

// Parked counts the parked events of one topic and reason (error.type).
type Parked struct {
	Topic, Reason string
	N             int64
}

// Reporter keeps the table-wide statistics current while it runs.
type Reporter struct {
	cfg Config

	mu  sync.Mutex
	ok  bool
	val Stats
}

// New returns a reporter. It does no I/O.
func New(cfg Config) *Reporter { return &Reporter{cfg: cfg} }

// Snapshot returns the statistics read last, and false when this relay
// does not report them (another one holds the lock, the last read failed,
// or the reporter is not running).
func (r *Reporter) Snapshot() (Stats, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.val, r.ok
}

func (r *Reporter) set(v Stats, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.val, r.ok = v, ok
}

// Run keeps the statistics current until ctx ends, and returns then: once
// per Interval the relay that holds the reporter lock reads them; the
// others try to take the lock. A slow read (a large backlog to count)
// spaces the next one out, so statistics never take more than a tenth of a
// connection's time. When the connection holding the lock fails, it is
// dropped, and any relay may take the lock over at its next try.
func (r *Reporter) Run(ctx context.Context) {
	var conn *pgx.Conn // holds the reporter lock
	defer func() {
		if conn != nil {
			_ = conn.Close(context.WithoutCancel(ctx))
		}
		r.set(Stats{}, false)
	}()
	t := time.NewTimer(0)
	defer t.Stop()
	var failing, future bool
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		start := time.Now()
		st, c, err := r.read(ctx, conn)
		took := time.Since(start)
		conn = c
		if ctx.Err() != nil {
			return
		}
		switch {
		case err != nil:
			r.cfg.Failed(ctx, err)
			if !failing {
				r.cfg.Logger.Warn("outbox relay: reading the table statistics failed; the table-wide gauges are not reported until it works",
					"table", r.cfg.Table.String(), "error", err, "error.type", r.cfg.ErrorType(err))
			}
		case st != nil && st.Future && !future:
			r.cfg.Logger.Warn("outbox relay: the oldest unpublished event has a created_at in the future; its age counts as 0 (check the clocks of the database and of writers that set created_at)",
				"table", r.cfg.Table.String())
		}
		failing = err != nil
		if st != nil {
			future = st.Future
		}
		if st != nil {
			r.set(*st, true)
		} else {
			r.set(Stats{}, false)
		}
		t.Reset(max(r.cfg.Interval, 10*took))
	}
}

// read reads the table-wide statistics if this relay reports them: on
// conn, which holds the reporter lock, or on a connection it takes from the
// pool once it wins the lock. It returns nil statistics when another relay
// reports them, and the connection to keep (nil once it failed). A DB that
// is not a pool has no lock: every relay reports.
func (r *Reporter) read(ctx context.Context, conn *pgx.Conn) (*Stats, *pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, max(r.cfg.Interval, 5*time.Second))
	defer cancel()
	pool, ok := r.cfg.DB.(acquirer)
	if !ok {
		tx, err := r.cfg.DB.Begin(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("relay: table statistics: %w", err)
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		set, _, args := r.cfg.Settings()
		if _, err := tx.Exec(ctx, set, args...); err != nil {
			return nil, nil, fmt.Errorf("relay: table statistics: %w", err)
		}
		st, err := r.query(ctx, tx)
		return st, nil, err
	}
	if conn == nil {
		pc, err := pool.Acquire(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("relay: table statistics: %w", err)
		}
		var won bool
		if err := pc.QueryRow(ctx, "SELECT pg_try_advisory_lock($1, $2)", r.cfg.LockNamespace, r.cfg.LockKey).Scan(&won); err != nil {
			pc.Release()
			return nil, nil, fmt.Errorf("relay: table statistics: take the reporter lock: %w", err)
		}
		if !won {
			pc.Release() // another relay reports; the connection holds no lock
			return nil, nil, nil
		}
		conn = pc.Hijack() // the lock lives as long as this connection
		_, set, args := r.cfg.Settings()
		if _, err := conn.Exec(ctx, set, args...); err != nil {
			_ = conn.Close(context.WithoutCancel(ctx))
			return nil, nil, fmt.Errorf("relay: table statistics: %w", err)
		}
	}
	st, err := r.query(ctx, conn)
	if err != nil {
		_ = conn.Close(context.WithoutCancel(ctx)) // releases the lock for another relay
		return nil, nil, err
	}
	return st, conn, nil
}

// query reads the backlog, the oldest age and the parked events by topic
// and reason with the SQL admin.ReadStatus (outboxctl status) shares.
func (r *Reporter) query(ctx context.Context, q tablesql.Querier) (*Stats, error) {
	c, err := tablesql.ReadCounts(ctx, q, r.cfg.Table)
	if err != nil {
		return nil, fmt.Errorf("relay: table statistics: %w", err)
	}
	st := &Stats{Backlog: c.Backlog, Age: c.OldestAge.Seconds(), Future: c.OldestInFuture}
	if c.Parked > 0 {
		groups, err := tablesql.CountParkedByType(ctx, q, r.cfg.Table, 1000)
		if err != nil {
			return nil, fmt.Errorf("relay: table statistics: %w", err)
		}
		for _, g := range groups {
			st.Parked = append(st.Parked, Parked{Topic: g.Topic, Reason: g.ErrorType, N: g.Count})
		}
	}
	return st, nil
}
