package cursor

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox/relay/internal/lanelock"
	"github.com/fxoutbox/outbox/relay/internal/lazytx"
)

// Lanes kept across batches (cursor progress, Mode Poll, AtLeastOnce, a
// pool as the DB): each worker runs its batches on a connection of its own
// and keeps the lanes it delivers on locked between them, with a session
// lock in the lanes' namespace, so that no other relay or worker can take
// them. Their positions are then the worker's: a batch reads a kept lane's
// position from the worker, not from its row, and writes nothing; the
// worker writes the positions that changed at most every KeepSaveEvery, or
// once its batches read MaxBatchSize rows since the last write (in the batch's
// transaction when one is due, or a transaction of its own when the worker
// is idle), and lets go, after that write committed, of the lanes that no
// batch took since it last let lanes go, at most every KeepSaveEvery (a
// drain writes at each batch, and reads the lanes behind first). A lane's
// row is so
// written about twice a second while it has events, instead of once per
// batch. Its batches' transactions begin at their first write (see
// lazytx.Tx): a batch that reads the kept lanes and writes nothing is one
// statement, without BEGIN and COMMIT.
//
// What the row does not hold yet was delivered: a relay that crashes, or
// whose connection is lost, leaves its lanes' rows behind what it published
// in the last KeepSaveEvery, fewer than MaxBatchSize events, and its last
// batch; the relay that takes
// the lanes next sends those events again, in order. A worker whose batch
// fails closes its connection (the server drops its locks) and forgets the
// positions it kept. A relay frozen between batches loses its connection,
// and so its lanes, after idle_session_timeout (BatchTimeout + 5s, at least
// twice PollInterval + 5s), as one frozen in a batch does after
// idle_in_transaction_session_timeout; its next batch then fails before
// sending anything.

// keptFindEvery is how often a worker that keeps lanes runs Find while its
// kept lanes have events to send: its other claims read the kept lanes
// alone (see fast), so a lane that no worker keeps waits up to this long
// for this worker while the kept lanes stay busy (a claim whose kept lanes
// have nothing to send runs Find at once, and so do the other workers and
// relays that are woken).
const keptFindEvery = 25 * time.Millisecond

// KeepSaveEvery is the longest a kept lane's row stays behind what its
// worker delivered (the duplicates a crash can cause).
const KeepSaveEvery = 500 * time.Millisecond

// Keeper is one worker's kept lanes and its connection. Only the
// worker's goroutine uses it.
type Keeper struct {
	e    *Engine
	conn *pgx.Conn // taken out of the pool, as the LISTEN connection is
	// off: the server cannot bound an idle session (no
	// idle_session_timeout, PostgreSQL 13): no lane is kept.
	off bool
	// lanes are the kept lanes' positions, as committed; dirty the ones
	// not written to their rows; used the ones a batch took since the
	// last write.
	lanes map[int32]Lane
	dirty map[int32]bool
	used  map[int32]bool
	saved time.Time // the last write
	// freed is when the lanes no batch took were last let go: at a write,
	// once every (not at each write of a drain, whose batches of
	// MaxBatchSize write each time and read the lanes behind first: the
	// lanes ahead would be let go and found again batch after batch).
	freed time.Time
	// session: conn's session has the batches' settings (Engine.settings).
	session bool
	every   time.Duration
	// unsaved counts the rows that batches read from kept lanes since the
	// last write: at MaxBatchSize the batch writes (see plan).
	unsaved int
	// found is when a claim last ran Find (see fast), and left how many of
	// the waiting rows it saw the claims since have not read (MaxInt: a
	// backlog); findEvery is keptFindEvery, or what a test set.
	found     time.Time
	left      int
	findEvery time.Duration
}

// NewKeeper returns a worker's Keeper, or nil where lanes are not kept (the
// DB is not a pool). The relay gives one to each worker of a polling relay
// that delivers at least once.
func (e *Engine) NewKeeper() *Keeper {
	if e.cfg.Pool == nil {
		return nil
	}
	every := e.keepEvery // set by tests only
	if every <= 0 {
		every = KeepSaveEvery
	}
	find := e.keepFind // set by tests only
	if find <= 0 {
		find = keptFindEvery
	}
	return &Keeper{e: e, lanes: map[int32]Lane{}, dirty: map[int32]bool{}, used: map[int32]bool{}, every: every, findEvery: find}
}

// fast reports whether the next claim reads the kept lanes alone, without
// Find: lanes are kept and Find ran less than findEvery ago, or the worker
// keeps every lane. Such a claim is one statement fewer, and its Load and
// Read are those of a claim whose Find locked the kept lanes (their
// positions are the worker's, their session locks the connection's), so
// order, late rows, held keys and parking are as in any claim; it returns
// to Find when the kept lanes have nothing to send, unless they are all
// the lanes there are.
func (k *Keeper) fast() bool {
	return k.keeping() && len(k.lanes) > 0 && (time.Since(k.found) < k.findEvery || k.everyLane())
}

// everyLane reports whether the worker keeps every lane: Find could find
// no lane that the kept lanes' read does not read (a relay alone on its
// table, with one worker, keeps them all while events spread over them).
func (k *Keeper) everyLane() bool { return len(k.lanes) >= k.e.cfg.Lanes }

// searched notes that a claim of n rows ran Find, which saw seen waiting
// rows: all there are when they did not fill its window (2n), a backlog
// otherwise.
func (k *Keeper) searched(seen, n int) {
	if k == nil {
		return
	}
	k.found, k.left = time.Now(), seen
	if seen >= 2*n {
		k.left = math.MaxInt
	}
}

// seenFor is what a claim without Find of n rows that read rows reports as
// the waiting rows seen: a full window while rows the last Find saw may be
// left (so the worker claims again at once, as after that Find; its next
// claim runs Find once the kept lanes have nothing to send), none once the
// claims since read as many as it saw. took counts them.
func (k *Keeper) seenFor(n int) int {
	if k.left > 0 {
		return 2 * n
	}
	return 0
}

func (k *Keeper) took(rows int) {
	if k != nil && k.left != math.MaxInt {
		k.left -= rows
	}
}

// kept returns the kept lanes, in order.
func (k *Keeper) kept() []int32 {
	out := make([]int32, 0, len(k.lanes))
	for id := range k.lanes {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// Usable reports whether k runs the worker's batches.
func (k *Keeper) Usable() bool { return k != nil && !k.off }

// Settled reports whether tx runs on the kept connection with its
// session's settings (Engine.settings).
func (k *Keeper) Settled(tx pgx.Tx) bool {
	return k.keeping() && k.session && tx.Conn() == k.conn
}

// keeping reports whether k's batch may keep lanes (its connection is up).
func (k *Keeper) keeping() bool { return k.Usable() && k.conn != nil }

// Begin begins a batch's transaction on the worker's connection, which it
// acquires first when it has none.
func (k *Keeper) Begin(ctx context.Context) (pgx.Tx, error) {
	if k.off {
		return k.e.cfg.DB.Begin(ctx)
	}
	if k.conn == nil {
		conn, err := lanelock.Keep(ctx, k.e.cfg.Pool, k.e.cfg.KeptIdleMillis, k.e.cfg.Logger, &k.off, "cursor batches write their lanes' positions each time")
		if err != nil {
			return nil, err
		}
		if conn == nil { // each batch locks its lanes, as with a DB that is not a pool
			return k.e.cfg.DB.Begin(ctx)
		}
		// Its batches' settings for the whole session: a batch then
		// sends no statement for them (see settled).
		_, err = conn.Exec(ctx, k.e.cfg.SessionSettings, k.e.cfg.IdleMillis)
		k.conn, k.saved, k.freed, k.session = conn, time.Now(), time.Now(), err == nil
	}
	if k.session {
		// Begun by its first statement but the kept lanes' read (a batch
		// without a write sends that read alone); a lost connection fails
		// that statement, and the batch with it (see the relay's pipelineOn).
		return lazytx.New(k.conn), nil
	}
	tx, err := k.conn.Begin(ctx)
	if err != nil {
		// The connection was lost (or its idle session ended): its locks
		// went with it, and the kept positions must be read from the rows.
		k.Drop(ctx)
		k.e.Forget()
		return nil, err
	}
	return tx, nil
}

// due reports whether the kept lanes' positions are to be written.
func (k *Keeper) due() bool {
	return k.keeping() && len(k.lanes) > 0 && time.Since(k.saved) >= k.every
}

// Wait returns a channel that fires when the kept positions are due, for
// the worker's wait between batches instead of its PollInterval ticker, and
// a func that stops it; nil when nothing is kept or the ticker comes first
// anyway (the wait stays within PollInterval either way).
func (k *Keeper) Wait() (<-chan time.Time, func()) {
	if !k.keeping() || len(k.lanes) == 0 {
		return nil, func() {}
	}
	d := max(time.Until(k.saved.Add(k.every)), 0)
	if d >= k.e.cfg.PollInterval {
		return nil, func() {}
	}
	t := time.NewTimer(d)
	return t.C, func() { t.Stop() }
}

// given returns the positions of the lanes of locked that k keeps (Load
// reads them instead of their rows).
func (k *Keeper) given(locked []int32) []Lane {
	if !k.keeping() {
		return nil
	}
	var out []Lane
	for _, l := range locked {
		if p, ok := k.lanes[l]; ok {
			out = append(out, p)
		}
	}
	return out
}

// plan queues a batch's writes, given each of its lanes' position after it
// (next) and the ones that changed: nothing, or when due every position not
// written yet; and the session locks of the lanes that changed and are not
// kept yet, which the batch keeps from now on.
func (k *Keeper) plan(b *pgx.Batch, cb *Batch, next, changed []Lane) {
	cb.next = next
	var take []int32
	for _, l := range changed {
		if _, ok := k.lanes[l.Lane]; !ok {
			take = append(take, l.Lane)
		}
	}
	// Due by time, or by the rows the lanes' rows do not hold yet: a batch
	// that brings them to MaxBatchSize writes, so that a crash repeats
	// fewer than MaxBatchSize events besides its last batch (in a drain,
	// batches of MaxBatchSize write each time, as without kept lanes).
	if time.Since(k.saved) >= k.every || k.unsaved+len(cb.IDs) >= k.e.cfg.MaxBatchSize {
		cb.flush = true
		in := map[int32]bool{}
		var write []Lane
		for _, l := range next {
			in[l.Lane] = true
			// The row is behind l: a kept lane's when l is not what the
			// worker kept or that is not written yet; another's when the
			// batch moved it.
			kept, ok := k.lanes[l.Lane]
			if ok && (k.dirty[l.Lane] || !kept.Equal(l)) || !ok && !cb.lanes[l.Lane].Equal(l) {
				write = append(write, l)
			}
		}
		for id := range k.dirty {
			if !in[id] {
				write = append(write, k.lanes[id])
			}
		}
		if len(write) > 0 {
			k.e.SaveLanes(b, write)
		}
		cb.saved = write
	}
	if len(take) > 0 {
		b.Queue(k.e.Q.Own, pgx.NamedArgs{"ns": k.e.cfg.NS, "lanes": take})
		cb.take = take
	}
}

// committed takes a batch's outcome once its transaction committed (or
// had nothing to write): the lanes' positions are kept; after a write,
// once every KeepSaveEvery, the lanes no batch took since the last time
// are let go.
func (k *Keeper) committed(ctx context.Context, cb *Batch) error {
	written := map[int32]bool{}
	for _, l := range cb.saved {
		written[l.Lane] = true
		delete(k.dirty, l.Lane)
	}
	for _, id := range cb.take {
		k.lanes[id] = Lane{}
	}
	read := map[int32]bool{}
	for _, lane := range cb.LaneOf {
		read[lane] = true
	}
	for _, l := range cb.next {
		old, ok := k.lanes[l.Lane]
		if !ok {
			continue // locked for this batch only: its row is its position
		}
		if read[l.Lane] || slices.Contains(cb.take, l.Lane) {
			// Used: the batch read rows of the lane (a claim without Find
			// takes every kept lane along, and one whose window only
			// opened and closed on nothing is let go at the next write).
			k.used[l.Lane] = true
		}
		if !old.Equal(l) {
			k.lanes[l.Lane] = l
			if !written[l.Lane] {
				k.dirty[l.Lane] = true
			}
		}
	}
	if !cb.flush {
		k.unsaved += len(cb.IDs)
		return nil
	}
	k.saved, k.unsaved = time.Now(), 0
	if time.Since(k.freed) < k.every {
		return nil // the lanes taken since the last release are counted on
	}
	k.freed = k.saved
	free := lanelock.Idle(k.lanes, k.used)
	if len(free) == 0 {
		return nil
	}
	for _, id := range free {
		delete(k.lanes, id)
	}
	k.e.keptFreed.Add(int64(len(free)))
	if _, err := k.conn.Exec(ctx, k.e.Q.Release, pgx.NamedArgs{"ns": k.e.cfg.NS, "lanes": free}); err != nil {
		return fmt.Errorf("relay: let go of %d lanes of %s: %w", len(free), k.e.cfg.Table, err)
	}
	return nil
}

// Drop closes the connection (the server drops its locks) and forgets the
// kept positions: their rows are what the next holder reads.
func (k *Keeper) Drop(ctx context.Context) {
	if k == nil || k.conn == nil {
		return
	}
	_ = k.conn.Close(context.WithoutCancel(ctx))
	k.conn, k.session = nil, false
	clear(k.lanes)
	clear(k.dirty)
	clear(k.used)
}

// Close writes the kept positions not written yet and closes the
// connection (the worker stops).
func (k *Keeper) Close(ctx context.Context) {
	if k == nil || k.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), k.e.cfg.BatchTimeout)
	defer cancel()
	if len(k.dirty) > 0 {
		var write []Lane
		for id := range k.dirty {
			write = append(write, k.lanes[id])
		}
		err := pgx.BeginFunc(ctx, k.conn, func(tx pgx.Tx) error {
			b := &pgx.Batch{}
			k.e.SaveLanes(b, write)
			return tx.SendBatch(ctx, b).Close()
		})
		if err != nil {
			k.e.cfg.Logger.Warn("outbox relay: could not write the positions of the lanes kept at stop; the next relay sends their last events again", "lanes", len(write), "error", err)
		}
	}
	k.Drop(ctx)
}
