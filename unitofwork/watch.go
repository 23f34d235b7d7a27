package unitofwork

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// The commit watcher gives AddTx the wake-up that Do has. A pgx.Tx has no
// commit hook, and a NOTIFY inside the caller's transaction would take
// PostgreSQL's global notify lock at every commit (see Notifier). Instead
// AddTx's INSERT also returns the transaction's id (pg_current_xact_id(),
// in the same round trip), and one goroutine per UnitOfWork asks the server,
// in one small statement for all pending ids, which of them have ended:
// pg_xact_status says committed or aborted, and pg_visible_in_snapshot
// against a fresh snapshot says the commit is visible to the relay's next
// claim (a transaction is marked committed a moment before new snapshots see
// it). For each committed one it calls OnCommit, as Do does after its
// commit. Checks start watchFirst after an AddTx and back off to watchMax
// while nothing ends, so a short transaction is seen within a few
// milliseconds of its commit and a long one costs a statement per watchMax.
const (
	watchFirst   = 2 * time.Millisecond
	watchMax     = 100 * time.Millisecond
	watchPending = 10000 // transactions watched at once; more wait for the relay's ticker
)

// querier is a pool: its Query may run concurrently with the callers'
// transactions, on a connection of its own.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

type watcher struct {
	db       querier
	onCommit func(int)
	log      *slog.Logger

	mu      sync.Mutex
	pending map[int64]int // transaction id -> events AddTx wrote in it
	fresh   bool          // ids arrived since the last check
	full    bool          // a registration was dropped: logged once
	closed  bool

	background
}

func newWatcher(db querier, onCommit func(int), log *slog.Logger) *watcher {
	if log == nil {
		log = slog.Default()
	}
	return &watcher{db: db, onCommit: onCommit, log: log, pending: map[int64]int{}, background: newBackground()}
}

// add watches transaction xid, in which events were written. It never
// blocks; the first call starts the goroutine.
func (w *watcher) add(xid int64, events int) {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	if _, ok := w.pending[xid]; !ok && len(w.pending) >= watchPending {
		logIt := !w.full
		w.full = true
		w.mu.Unlock()
		if logIt {
			w.log.Warn("outbox unit of work: too many AddTx transactions still open to watch; their events wait for the relay's next poll",
				"watched", watchPending)
		}
		return
	}
	w.pending[xid] += events
	w.fresh = true
	w.mu.Unlock()
	w.poke(w.run)
}

func (w *watcher) close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	w.stop()
}

const watchSQL = `SELECT u.x, pg_xact_status(u.x::text::xid8),
	pg_visible_in_snapshot(u.x::text::xid8, pg_current_snapshot())
FROM unnest($1::bigint[]) AS u(x)`

func (w *watcher) run() {
	delay := watchFirst
	failing := false
	for {
		w.mu.Lock()
		n := len(w.pending)
		w.mu.Unlock()
		if n == 0 {
			select {
			case <-w.ctx.Done():
				return
			case <-w.signal:
			}
			delay = watchFirst
		}
		if !w.sleep(delay) {
			return
		}
		ended, err := w.check()
		switch {
		case err != nil && !failing && !errors.Is(err, context.Canceled):
			failing = true
			w.log.Warn("outbox unit of work: cannot check AddTx transactions for their commit; their events wait for the relay's next poll",
				"error", err)
		case err == nil && failing:
			failing = false
		}
		w.mu.Lock()
		fresh := w.fresh
		w.fresh = false
		w.mu.Unlock()
		if fresh || ended {
			delay = watchFirst
		} else {
			delay = min(2*delay, watchMax)
		}
	}
}

// sleep waits d, cut short to watchFirst when a new transaction arrives,
// or returns false when the watcher is closed.
func (w *watcher) sleep(d time.Duration) bool {
	until := time.Now().Add(d)
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-w.ctx.Done():
			return false
		case <-t.C:
			return true
		case <-w.signal:
			if soon := time.Now().Add(watchFirst); soon.Before(until) {
				until = soon
				t.Reset(watchFirst)
			}
		}
	}
}

// check asks for the state of every watched transaction, calls onCommit
// for the committed ones and forgets every one that ended. It reports
// whether any ended.
func (w *watcher) check() (bool, error) {
	w.mu.Lock()
	w.fresh = false
	ids := make([]int64, 0, len(w.pending))
	for x := range w.pending {
		ids = append(ids, x)
	}
	w.mu.Unlock()
	ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
	defer cancel()
	rows, err := w.db.Query(ctx, watchSQL, ids)
	if err != nil {
		return false, err
	}
	committed, ended := 0, false
	var gone []int64
	for rows.Next() {
		var (
			x       int64
			status  *string
			visible bool
		)
		if err := rows.Scan(&x, &status, &visible); err != nil {
			rows.Close()
			return false, err
		}
		switch {
		case status == nil || *status == "aborted": // too old to know, or rolled back
			gone = append(gone, x)
		case *status == "committed" && visible:
			gone = append(gone, x)
			w.mu.Lock()
			committed += w.pending[x]
			w.mu.Unlock()
		}
	}
	if err := rows.Err(); err != nil {
		return false, err
	}
	w.mu.Lock()
	for _, x := range gone {
		delete(w.pending, x)
		ended = true
	}
	if len(w.pending) < watchPending/2 {
		w.full = false
	}
	w.mu.Unlock()
	if committed > 0 {
		w.onCommit(committed)
	}
	return ended, nil
}
