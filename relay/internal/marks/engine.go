package marks

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/relay/internal/claim"
)

// Config is what an Engine needs of its relay.
type Config struct {
	Table        outbox.Table
	Lanes        int           // the relay's Lanes
	PollInterval time.Duration // the relay's: how long claims do not grow their window (LockLanes)
	NS           int32         // the table's advisory lock namespace
	Unordered    bool          // Ordering Unordered: rows are locked, not lanes
	// TxSettings ($1: IdleMillis) sets a batch transaction's settings, in
	// the round trip of its claim's first statement.
	TxSettings, IdleMillis string
}

// Engine is a relay's marks claims: the statements of Queries run in a
// batch's transaction, the rows scanned, the lanes locked.
type Engine struct {
	Q   Queries
	cfg Config
	// growAfter (unix nanoseconds): until then claims do not grow their
	// window (see LockLanes).
	growAfter atomic.Int64
}

// New returns the claims of cfg.Table with its statements q.
func New(q Queries, cfg Config) *Engine { return &Engine{Q: q, cfg: cfg} }

// Guarded is the guarded read of rows by id (claim.Guarded) on the table.
func (e *Engine) Guarded() claim.Guarded {
	return claim.Guarded{Table: e.cfg.Table.String(), Savepoint: e.Q.Savepoint, RollbackTo: e.Q.RollbackTo, Read: e.Q.Read, FirstID: e.Q.FirstID}
}

// ReadGuarded reads up to n of the rows ids, setting aside those that
// cannot be read (claim.Guarded).
func (e *Engine) ReadGuarded(ctx context.Context, tx pgx.Tx, ids []int64, n int) (c claim.Claimed, err error) {
	c.Rows, c.Bad, c.More, err = e.Guarded().ReadGuarded(ctx, tx, ids, n)
	return c, err
}

// ErrIsolate says an Unordered claim met a row it cannot read: the
// pipeline starts the batch over in a new transaction, with a finder that
// reads ids first (ClaimIsolating).
var ErrIsolate = errors.New("relay: claim met an unreadable row")

// Claim returns the next batch of up to n rows, locked for this
// transaction (under PerKey, by the lanes' advisory locks), leaving out the
// rows of the held keys.
//
// Rows are read in id order. Under PerKey the read of the locked lanes' rows
// runs under a savepoint (sent in the read's round trip): if a row cannot be
// read (a data error: SQLSTATE class 22 or 54, XX001, or a value pgx cannot
// decode), the rows before it were received already, the transaction goes
// back to the savepoint, keeping the lane locks, a query that reads only ids
// names the row, and the read goes on after it (see claim.Guarded). Under
// Unordered the claim reads and locks in one statement; if it fails so,
// Claim returns ErrIsolate and the caller runs ClaimIsolating in a new
// transaction.
func (e *Engine) Claim(ctx context.Context, tx pgx.Tx, n int, held []string, upto int64) (c claim.Claimed, err error) {
	if e.cfg.Unordered {
		sql, args := e.Q.Claim, pgx.NamedArgs{"n": n}
		if len(held) > 0 {
			sql, args["held"] = e.Q.ClaimHeld, held
		}
		c.Rows, err = claim.ReadRows(ctx, tx, e.cfg.TxSettings, []any{e.cfg.IdleMillis}, n, e.bounded(sql, args, upto), args)
		if err != nil {
			if claim.IsUnreadable(err) {
				return claim.Claimed{}, ErrIsolate
			}
			return claim.Claimed{}, fmt.Errorf("relay: claim from %s: %w", e.cfg.Table, err)
		}
		c.More = len(c.Rows) == n
		return c, nil
	}
	ids, more, err := e.LockLanes(ctx, tx, n, held, upto, nil, nil)
	if err != nil || len(ids) == 0 {
		// With no lane locked, more says the window saw unpublished rows.
		return claim.Claimed{HeldElsewhere: err == nil && more}, err
	}
	// A new statement: its snapshot is taken after the locks were granted.
	c, err = e.ReadGuarded(ctx, tx, ids, n)
	c.More = c.More || more || len(c.Rows) == n
	return c, err
}

// ClaimIsolating is the Unordered claim after it met an unreadable row: it
// locks the rows reading only their ids, then reads them as claim.Guarded does.
func (e *Engine) ClaimIsolating(ctx context.Context, tx pgx.Tx, n int, held []string, upto int64) (claim.Claimed, error) {
	if held == nil {
		held = []string{}
	}
	var ids []int64
	args := pgx.NamedArgs{"n": n, "held": held}
	err := claim.Query(ctx, tx, e.cfg.TxSettings, []any{e.cfg.IdleMillis}, e.bounded(e.Q.ClaimIDs, args, upto), args, func(rows pgx.Rows) error {
		var err error
		ids, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		return err
	})
	if err != nil {
		return claim.Claimed{}, fmt.Errorf("relay: claim from %s: %w", e.cfg.Table, err)
	}
	if len(ids) == 0 {
		return claim.Claimed{}, nil
	}
	c, err := e.ReadGuarded(ctx, tx, ids, n)
	c.More = c.More || len(ids) == n
	return c, err
}

// LockLanes locks lanes that hold about n of the oldest unpublished events,
// skipping lanes other relays hold, and returns the ids of their events in
// order. It looks at a window of the oldest rows (2n, growing 4x up to 32n
// while the lanes in it are taken and some lane has not been seen yet), so
// each replica finds work past the others' lanes. Once every lane has been
// tried the window stops growing: a larger one would read only more rows of
// the lanes other relays hold (with several replicas draining a backlog
// spread over all lanes, that growth read up to 21n rows per claim and
// doubled PostgreSQL's work per event); the claim then takes what it has,
// possibly less than n, or nothing, and the lanes' holders drain the rest.
// When grown windows find less than half a batch (the lanes with events
// are mostly held: the oldest rows of a shared backlog are those of the
// lanes other replicas are publishing, or there are fewer keys than lanes),
// the relay's claims do not grow their windows for a PollInterval
// (growAfter): they take what the first window offers. A relay alone on its table locks its lanes in the first
// window's statement; one that finds lanes held tries further lanes a chunk
// at a time. Every unpublished event of a lane older than the window's last
// one is in the window, so reading the window's ids of a locked lane keeps
// its keys' order. more reports unpublished rows this batch does not take.
//
// The rows of held keys are left out (windowHeld), so a key waiting for a
// failed event's retry takes no room in the batch.
//
// With laneOf not nil (an exactly-once worker), LockLanes records the lane
// of each id it returns, tries the lanes in owned before the others of
// each window, and, when the lanes it locked in the first window hold less
// than n rows of a backlog, reads on in them (ReadOn).
func (e *Engine) LockLanes(ctx context.Context, tx pgx.Tx, n int, held []string, upto int64, laneOf map[int64]int32, owned []int32) (ids []int64, more bool, err error) {
	note := func(lane int32, ids []int64) {
		if laneOf != nil {
			for _, id := range ids {
				laneOf[id] = lane
			}
		}
	}
	covered := 0
	tried := map[int32]bool{}
	for window := 2 * n; ; window *= 4 {
		type laneRows struct {
			lane int32
			ids  []int64
		}
		var cands []laneRows
		seen := 0
		var (
			lr  laneRows
			got *bool
		)
		// Only the first window locks in its statement: the lanes a larger
		// one adds all come after those already tried.
		lockUpTo := 0
		if window == 2*n {
			lockUpTo = n
		}
		sql, args := e.Q.Window, pgx.NamedArgs{"window": window, "lanes": e.cfg.Lanes, "n": lockUpTo, "ns": e.cfg.NS}
		if len(held) > 0 {
			sql, args["held"] = e.Q.WindowHeld, held
		}
		if laneOf != nil {
			sql, args["owned"] = e.Q.WindowOwned, owned
			if len(held) > 0 {
				sql = e.Q.WindowOwnedHeld
			}
		}
		pre, preArgs := "", []any(nil)
		if window == 2*n {
			pre, preArgs = e.cfg.TxSettings, []any{e.cfg.IdleMillis}
		}
		err = claim.Query(ctx, tx, pre, preArgs, e.bounded(sql, args, upto), args,
			func(rows pgx.Rows) error {
				var cnt int
				_, err := pgx.ForEachRow(rows, []any{&lr.lane, &cnt, &lr.ids, &got}, func() error {
					seen += cnt
					switch {
					case tried[lr.lane]:
					case got == nil:
						cands = append(cands, lr)
					case *got:
						tried[lr.lane] = true
						ids = append(ids, lr.ids...)
						note(lr.lane, lr.ids)
						covered += len(lr.ids)
					default:
						tried[lr.lane] = true
					}
					lr = laneRows{}
					return nil
				})
				return err
			})
		if err != nil {
			return nil, false, fmt.Errorf("relay: find lanes in %s: %w", e.cfg.Table, err)
		}
		// Lanes held by other relays left the batch short: try the next
		// lanes in order of their oldest event, a chunk at a time.
		for len(cands) > 0 && covered < n {
			var chunk []int32
			want := map[int32][]int64{}
			for need := n - covered; len(cands) > 0 && need > 0; cands = cands[1:] {
				chunk = append(chunk, cands[0].lane)
				want[cands[0].lane] = cands[0].ids
				tried[cands[0].lane] = true
				need -= len(cands[0].ids)
			}
			rows, err := tx.Query(ctx, e.Q.Lock, pgx.NamedArgs{"candidates": chunk, "ns": e.cfg.NS})
			if err != nil {
				return nil, false, fmt.Errorf("relay: lock lanes: %w", err)
			}
			got, err := pgx.CollectRows(rows, pgx.RowTo[int32])
			if err != nil {
				return nil, false, fmt.Errorf("relay: lock lanes: %w", err)
			}
			for _, l := range got {
				ids = append(ids, want[l]...)
				note(l, want[l])
				covered += len(want[l])
			}
		}
		// Done when the batch is covered, the window held every unpublished
		// row, every lane has been tried (a larger window cannot show a lane
		// that is not taken, only more rows of those other relays hold), or
		// the window is as large as it gets.
		if covered >= n || seen < window || len(tried) >= e.cfg.Lanes || window >= 32*n ||
			time.Now().UnixNano() < e.growAfter.Load() {
			if window > 2*n && 2*covered < n {
				// Grown windows found less than half a batch: the lanes
				// with events are mostly held (other replicas' lanes, fewer
				// keys than lanes). Growing again soon would read as many
				// rows for as little: the relay's claims do not grow for a
				// PollInterval.
				e.growAfter.Store(time.Now().Add(e.cfg.PollInterval).UnixNano())
			}
			if laneOf != nil && upto == 0 && covered < n && seen >= window && window == 2*n && len(ids) > 0 {
				if ids, err = e.ReadOn(ctx, tx, n, held, laneOf); err != nil {
					return nil, false, err
				}
			}
			slices.Sort(ids)
			return ids, seen >= window || seen > covered, nil
		}
	}
}

// ReadOn returns the ids of the first n waiting rows of the lanes locked
// (those of laneOf), among the first 4n waiting rows, in id order, and
// records their lanes in laneOf instead of the window's. An exactly-once
// worker's claim whose locked lanes held less than its n rows in the window
// reads on so: while replicas drain a backlog, about half the oldest rows
// are the other relays' (kept by their workers), and a batch short of n
// neither fills its Kafka transaction nor grows the next one. The rows are
// read again from the start in one statement: rows of a lane that committed
// after the window's snapshot with ids inside it (a key's earlier event
// whose later one commits next) come in their place, and each lane's rows
// are a prefix of its waiting rows in one snapshot, so its keys keep their
// order.
func (e *Engine) ReadOn(ctx context.Context, tx pgx.Tx, n int, held []string, laneOf map[int64]int32) ([]int64, error) {
	in := map[int32]bool{}
	for _, l := range laneOf {
		in[l] = true
	}
	lanes := make([]int32, 0, len(in))
	for l := range in {
		lanes = append(lanes, l)
	}
	sql, args := e.Q.ReadOn, pgx.NamedArgs{"lanes": e.cfg.Lanes, "scan": 4 * n, "locked": lanes, "n": n}
	if len(held) > 0 {
		sql, args["held"] = e.Q.ReadOnHeld, held
	}
	rows, err := tx.Query(ctx, sql, args)
	if err != nil {
		return nil, fmt.Errorf("relay: read on in the locked lanes of %s: %w", e.cfg.Table, err)
	}
	clear(laneOf)
	var ids []int64
	var id int64
	var lane int32
	if _, err := pgx.ForEachRow(rows, []any{&id, &lane}, func() error {
		ids = append(ids, id)
		laneOf[id] = lane
		return nil
	}); err != nil {
		return nil, fmt.Errorf("relay: read on in the locked lanes of %s: %w", e.cfg.Table, err)
	}
	return ids, nil
}

// bounded returns the claim statement sql, or, when upto is positive (the
// sweep of a streaming relay), its variant that takes no row past id upto
// (those are the stream's), with its argument added to args.
func (e *Engine) bounded(sql string, args pgx.NamedArgs, upto int64) string {
	if upto > 0 {
		args["upto"] = upto
		return e.Q.Upto[sql]
	}
	return sql
}

// Record writes, in one round trip, what became of a batch's rows: the
// acknowledged rows ids are marked published, or, for rows the stream's
// claim marked, the mark is taken back from the failed ones (back); and an
// attempt is counted on each failed row fids (reasons, limits: see
// Queries.Attempt). It returns which failed rows were parked.
func (e *Engine) Record(ctx context.Context, tx pgx.Tx, ids, back, fids []int64, reasons []string, limits []int32) (map[int64]bool, error) {
	b := &pgx.Batch{}
	switch {
	case len(back) > 0:
		b.Queue(e.Q.Unmark, back)
	case len(ids) > 0:
		b.Queue(e.Q.Mark, ids)
	}
	parked := map[int64]bool{}
	if len(fids) > 0 {
		b.Queue(e.Q.Attempt, fids, reasons, limits).Query(func(rows pgx.Rows) error {
			var id int64
			var p bool
			_, err := pgx.ForEachRow(rows, []any{&id, &p}, func() error {
				if p {
					parked[id] = true
				}
				return nil
			})
			return err
		})
	}
	if b.Len() > 0 {
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return nil, err
		}
	}
	return parked, nil
}

// ChargeUnreadable charges (and, with park, parks in place) the rows ids
// that cannot be read, with the reasons msgs, without reading them; scan
// gets the charged rows: id, event_id, topic, partition_key, parked.
func (e *Engine) ChargeUnreadable(ctx context.Context, tx pgx.Tx, ids []int64, msgs []string, park bool, scan func(pgx.Rows) error) error {
	rs, err := tx.Query(ctx, e.Q.Unreadable, pgx.NamedArgs{"ids": ids, "errs": msgs, "park": park})
	if err != nil {
		return err
	}
	return scan(rs)
}
