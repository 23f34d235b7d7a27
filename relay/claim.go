package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/locks"
	"github.com/fxoutbox/outbox/relay/internal/claim"
	"github.com/fxoutbox/outbox/relay/internal/cursor"
	"github.com/fxoutbox/outbox/relay/internal/marks"
	"github.com/fxoutbox/outbox/relay/internal/streamsql"
)

// Ordering says what a relay promises about the order of events in Kafka.
type Ordering int

const (
	// PerKey (the default) publishes the events of each partition key in
	// the order they were written, also with many relay replicas on one
	// table and across their crashes. Keys are hashed into Lanes; a claim
	// takes transaction-scoped advisory locks on the lanes it publishes, so
	// one relay at a time publishes a lane, and then reads those lanes' rows
	// in id order in a new statement (whose snapshot sees everything the
	// previous holder marked).
	PerKey Ordering = iota
	// Unordered claims rows with a plain FOR UPDATE SKIP LOCKED, as the
	// classic outbox relay does. It is the fastest claim, and per-key order
	// still holds with a single relay; with several replicas, two of them
	// can hold different events of one key at once and publish them out of
	// order. Choose it only when consumers do not rely on order.
	Unordered
)

func (o Ordering) String() string {
	switch o {
	case PerKey:
		return "per-key"
	case Unordered:
		return "unordered"
	}
	return "Ordering(" + strconv.Itoa(int(o)) + ")"
}

// readGuarded reads up to n of the rows ids, setting aside those that
// cannot be read (claim.Guarded).
func (r *Relay) readGuarded(ctx context.Context, tx pgx.Tx, ids []int64, n int) (c claimed, err error) {
	c.rows, c.bad, c.more, err = claim.Guarded{Table: r.cfg.Table.String(), Savepoint: r.q.Savepoint, RollbackTo: r.q.RollbackTo, Read: r.q.Read, FirstID: r.q.FirstID}.ReadGuarded(ctx, tx, ids, n)
	return c, err
}

// queries are the marks progress's statements, with the batch statements
// both progress modes share (relay/internal/marks), the stream's statements
// on its slot and the table's snapshot (relay/internal/streamsql), and the
// table's advisory lock namespace.
type queries struct {
	marks.Queries
	stream streamsql.Queries
	ns     int32 // advisory lock namespace of the table
}

// newQueries returns table t's statements and lock namespace.
func newQueries(t outbox.Table) queries {
	q := queries{Queries: marks.NewQueries(t, claim.Cols), stream: streamsql.NewQueries(t), ns: locks.Namespace(t.String())}
	return q
}

// txSettings returns the statement that sets a batch transaction's
// settings, the same for a session the relay keeps (see laneKeeper), and
// their argument: the planner's settings (see below), the server-side bound (a relay that hangs
// while holding locks loses them after BatchTimeout + 5s) and, unless
// SynchronousCommit, an asynchronous commit.
func txSettings(cfg Config, p Progress) (tx, session, idleMillis string) {
	// No parallel plans and no JIT: a batch's statements read a few rows,
	// and a Gather's start-up or a JIT compilation (seconds, where an
	// estimate went wrong) costs more than they do.
	//
	// The cursor's statements find rows through the (txid, id) index by
	// transaction ids that the table's statistics cannot predict: after a
	// bulk load (many rows per transaction) the planner expects each id to
	// match thousands of rows and scans the table instead, on every claim.
	// So no sequential scans under ProgressCursor; and generic plans: a
	// custom plan of the cursor's statements weighs each of their CTEs for
	// the values at hand, and making one cost more than running the
	// generic plan (bench cost section: cursor_relay_pg_us_per_event).
	commit := marks.CommitDefault
	switch {
	case cfg.Delivery == ExactlyOnce:
		// A lane's marks must be durable before its next Kafka
		// transaction: only its last one is read back.
		commit = marks.CommitSync
	case !cfg.SynchronousCommit:
		commit = marks.CommitAsync
	}
	cursor := p == ProgressCursor
	return marks.TxSettings(cursor, commit), marks.SessionSettings(cursor, commit), strconv.FormatInt((cfg.BatchTimeout + 5*time.Second).Milliseconds(), 10)
}

// claimed is what a finder (see pipeline) claimed in a batch's
// transaction.
type claimed struct {
	rows []claim.Row        // readable rows, in order
	bad  []claim.Unreadable // rows that cannot be read, in order
	more bool               // more unpublished rows are likely waiting
	// heldElsewhere: no rows, because the lanes of the unpublished rows the
	// claim saw are all held by other relays (PerKey only).
	heldElsewhere bool
	// marked: the finder claimed rows by marking them published in the
	// transaction (the stream does); deliver takes the mark back from
	// those that fail.
	marked bool
	// deferred: rows were left in the table for a sweep (the stream).
	deferred bool
	// eo: the ExactlyOnce batch (its worker's transaction), nil otherwise.
	eo *eoBatch
	// cur: the ProgressCursor batch (its lanes' positions), nil otherwise.
	cur *cursor.Batch
	// retry: nothing was claimed, and the next batch should run at once
	// (an exactly-once worker was fenced while taking lanes).
	retry bool
}

// errIsolate says an Unordered claim met a row it cannot read: the
// pipeline starts the batch over in a new transaction, with a finder that
// reads ids first (claimIsolating).
var errIsolate = errors.New("relay: claim met an unreadable row")

// claim returns the next batch of up to n rows, locked for this
// transaction (under PerKey, by the lanes' advisory locks), leaving out the
// rows of the held keys.
//
// Rows are read in id order. Under PerKey the read of the locked lanes' rows
// runs under a savepoint (sent in the read's round trip): if a row cannot be
// read (a data error: SQLSTATE class 22 or 54, XX001, or a value pgx cannot
// decode), the rows before it were received already, the transaction goes
// back to the savepoint, keeping the lane locks, a query that reads only ids
// names the row, and the read goes on after it (see readGuarded). Under
// Unordered the claim reads and locks in one statement; if it fails so,
// claim returns errIsolate and the caller runs claimIsolating in a new
// transaction.
func (r *Relay) claim(ctx context.Context, tx pgx.Tx, n int, held []string, upto int64) (c claimed, err error) {
	if r.cfg.Ordering == Unordered {
		sql, args := r.q.Claim, pgx.NamedArgs{"n": n}
		if len(held) > 0 {
			sql, args["held"] = r.q.ClaimHeld, held
		}
		c.rows, err = claim.ReadRows(ctx, tx, r.txSettings, []any{r.idleMillis}, n, bounded(r.q, sql, args, upto), args)
		if err != nil {
			if claim.IsUnreadable(err) {
				return claimed{}, errIsolate
			}
			return claimed{}, fmt.Errorf("relay: claim from %s: %w", r.cfg.Table, err)
		}
		c.more = len(c.rows) == n
		return c, nil
	}
	ids, more, err := r.lockLanes(ctx, tx, n, held, upto, nil, nil)
	if err != nil || len(ids) == 0 {
		// With no lane locked, more says the window saw unpublished rows.
		return claimed{heldElsewhere: err == nil && more}, err
	}
	// A new statement: its snapshot is taken after the locks were granted.
	c, err = r.readGuarded(ctx, tx, ids, n)
	c.more = c.more || more || len(c.rows) == n
	return c, err
}

// claimIsolating is the Unordered claim after it met an unreadable row: it
// locks the rows reading only their ids, then reads them as readGuarded does.
func (r *Relay) claimIsolating(ctx context.Context, tx pgx.Tx, n int, held []string, upto int64) (claimed, error) {
	if held == nil {
		held = []string{}
	}
	var ids []int64
	args := pgx.NamedArgs{"n": n, "held": held}
	err := claim.Query(ctx, tx, r.txSettings, []any{r.idleMillis}, bounded(r.q, r.q.ClaimIDs, args, upto), args, func(rows pgx.Rows) error {
		var err error
		ids, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		return err
	})
	if err != nil {
		return claimed{}, fmt.Errorf("relay: claim from %s: %w", r.cfg.Table, err)
	}
	if len(ids) == 0 {
		return claimed{}, nil
	}
	c, err := r.readGuarded(ctx, tx, ids, n)
	c.more = c.more || len(ids) == n
	return c, err
}

// lockLanes locks lanes that hold about n of the oldest unpublished events,
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
// With laneOf not nil (an exactly-once worker), lockLanes records the lane
// of each id it returns, tries the lanes in owned before the others of
// each window, and, when the lanes it locked in the first window hold less
// than n rows of a backlog, reads on in them (readOn).
func (r *Relay) lockLanes(ctx context.Context, tx pgx.Tx, n int, held []string, upto int64, laneOf map[int64]int32, owned []int32) (ids []int64, more bool, err error) {
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
		sql, args := r.q.Window, pgx.NamedArgs{"window": window, "lanes": r.cfg.Lanes, "n": lockUpTo, "ns": r.q.ns}
		if len(held) > 0 {
			sql, args["held"] = r.q.WindowHeld, held
		}
		if laneOf != nil {
			sql, args["owned"] = r.q.WindowOwned, owned
			if len(held) > 0 {
				sql = r.q.WindowOwnedHeld
			}
		}
		pre, preArgs := "", []any(nil)
		if window == 2*n {
			pre, preArgs = r.txSettings, []any{r.idleMillis}
		}
		err = claim.Query(ctx, tx, pre, preArgs, bounded(r.q, sql, args, upto), args,
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
			return nil, false, fmt.Errorf("relay: find lanes in %s: %w", r.cfg.Table, err)
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
			rows, err := tx.Query(ctx, r.q.Lock, pgx.NamedArgs{"candidates": chunk, "ns": r.q.ns})
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
		if covered >= n || seen < window || len(tried) >= r.cfg.Lanes || window >= 32*n ||
			time.Now().UnixNano() < r.growAfter.Load() {
			if window > 2*n && 2*covered < n {
				// Grown windows found less than half a batch: the lanes
				// with events are mostly held (other replicas' lanes, fewer
				// keys than lanes). Growing again soon would read as many
				// rows for as little: the relay's claims do not grow for a
				// PollInterval.
				r.growAfter.Store(time.Now().Add(r.cfg.PollInterval).UnixNano())
			}
			if laneOf != nil && upto == 0 && covered < n && seen >= window && window == 2*n && len(ids) > 0 {
				if ids, err = r.readOn(ctx, tx, n, held, laneOf); err != nil {
					return nil, false, err
				}
			}
			slices.Sort(ids)
			return ids, seen >= window || seen > covered, nil
		}
	}
}

// readOn returns the ids of the first n waiting rows of the lanes locked
// (those of laneOf), among the first 4n waiting rows, in id order, and
// records their lanes in laneOf instead of the window's. An exactly-once
// worker's claim whose locked lanes held less than its n rows in the window
// reads on so: while replicas drain a backlog, about half the oldest rows
// are the other relays' (kept, see eoKeeper), and a batch short of n
// neither fills its Kafka transaction nor grows the next one. The rows are
// read again from the start in one statement: rows of a lane that committed
// after the window's snapshot with ids inside it (a key's earlier event
// whose later one commits next) come in their place, and each lane's rows
// are a prefix of its waiting rows in one snapshot, so its keys keep their
// order.
func (r *Relay) readOn(ctx context.Context, tx pgx.Tx, n int, held []string, laneOf map[int64]int32) ([]int64, error) {
	in := map[int32]bool{}
	for _, l := range laneOf {
		in[l] = true
	}
	lanes := make([]int32, 0, len(in))
	for l := range in {
		lanes = append(lanes, l)
	}
	sql, args := r.q.ReadOn, pgx.NamedArgs{"lanes": r.cfg.Lanes, "scan": 4 * n, "locked": lanes, "n": n}
	if len(held) > 0 {
		sql, args["held"] = r.q.ReadOnHeld, held
	}
	rows, err := tx.Query(ctx, sql, args)
	if err != nil {
		return nil, fmt.Errorf("relay: read on in the locked lanes of %s: %w", r.cfg.Table, err)
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
		return nil, fmt.Errorf("relay: read on in the locked lanes of %s: %w", r.cfg.Table, err)
	}
	return ids, nil
}

// bounded returns the claim statement sql, or, when upto is positive (the
// sweep of a streaming relay), its variant that takes no row past id upto
// (those are the stream's), with its argument added to args.
func bounded(q queries, sql string, args pgx.NamedArgs, upto int64) string {
	if upto > 0 {
		args["upto"] = upto
		return q.Upto[sql]
	}
	return sql
}
