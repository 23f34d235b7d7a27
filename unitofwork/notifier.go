package unitofwork

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
)

// Notifier wakes relays in other processes after commits: it sends a
// PostgreSQL NOTIFY on the table's channel (<name>_wakeup; see docs/operating.md), coalesced
// so that at most one is sent per Interval however many transactions commit.
//
// The NOTIFY goes in its own tiny statement after the business transaction
// committed, never inside it: a NOTIFY inside a transaction takes a
// database-wide lock at commit, which costs every writer throughput. A lost
// notification only delays an event to the relay's next tick.
//
// Use it as the UnitOfWork's OnCommit hook, which also runs after commits
// of AddTx transactions (fxoutbox does this unless its Config.DisableNotify
// is set); Close it when the application stops.
type Notifier struct {
	db       execer
	channel  string
	interval time.Duration
	log      *slog.Logger

	conn *pgx.Conn // the notifier's own connection, when db is a pool
	background
}

// DefaultNotifyInterval is NewNotifier's interval when none is given.
const DefaultNotifyInterval = 10 * time.Millisecond

// NewNotifier returns a notifier that sends on table's channel through db
// (normally the *pgxpool.Pool, from which it takes one connection of its
// own for as long as it runs), at most once per interval
// (DefaultNotifyInterval when zero). The first commit after a quiet
// interval is notified at once; while commits keep coming, the interval is
// the most an event waits for its wake-up, and what a woken relay's batch
// gathers (the trade is measured in docs/benchmarks.md). It logs a failed NOTIFY once per run of failures to log (default
// slog.Default()).
func NewNotifier(db interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}, table outbox.Table, interval time.Duration, log *slog.Logger) (*Notifier, error) {
	if err := table.Validate(); err != nil {
		return nil, err
	}
	if interval == 0 {
		interval = DefaultNotifyInterval
	}
	if interval < 0 {
		return nil, &outbox.ConfigError{Field: "NotifyInterval", Reason: "is negative"}
	}
	if log == nil {
		log = slog.Default()
	}
	return &Notifier{db: db, channel: sqlname.Channel(table), interval: interval, log: log, background: newBackground()}, nil
}

// Notify asks for a NOTIFY. It never blocks. The first call starts the
// notifier's goroutine; Close ends it.
func (n *Notifier) Notify() { n.poke(n.run) }

// OnCommit has the signature of Config.OnCommit.
func (n *Notifier) OnCommit(int) { n.Notify() }

// Close stops the notifier and waits for an in-flight NOTIFY. Notify after
// Close does nothing.
func (n *Notifier) Close() { n.stop() }

// send sends one NOTIFY. With a pool it uses a connection of its own, taken
// out of the pool once, so that it never waits for, nor holds up, the
// application's transactions; a failed connection is replaced next time.
func (n *Notifier) send(ctx context.Context) error {
	const notify = "SELECT pg_notify($1, '')"
	pool, ok := n.db.(interface {
		Acquire(ctx context.Context) (*pgxpool.Conn, error)
	})
	if !ok {
		_, err := n.db.Exec(ctx, notify, n.channel)
		return err
	}
	if n.conn == nil {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return err
		}
		n.conn = c.Hijack()
	}
	if _, err := n.conn.Exec(ctx, notify, n.channel); err != nil {
		_ = n.conn.Close(context.WithoutCancel(ctx))
		n.conn = nil
		return err
	}
	return nil
}

func (n *Notifier) run() {
	defer func() {
		if n.conn != nil {
			_ = n.conn.Close(context.Background())
		}
	}()
	failing := false
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-n.signal:
		}
		ctx, cancel := context.WithTimeout(n.ctx, 5*time.Second)
		err := n.send(ctx)
		cancel()
		switch {
		case err != nil && !failing && !errors.Is(err, context.Canceled):
			failing = true
			n.log.Warn("outbox notifier: NOTIFY failed; relays in other processes pick events up at their next tick",
				"channel", n.channel, "error", err)
		case err == nil && failing:
			failing = false
			n.log.Info("outbox notifier: NOTIFY works again", "channel", n.channel)
		}
		t := time.NewTimer(n.interval)
		select {
		case <-n.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}
