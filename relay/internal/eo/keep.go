package eo

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox/internal/dberr"
	"github.com/fxoutbox/outbox/relay/internal/cursor"
	"github.com/fxoutbox/outbox/relay/internal/lanelock"
)

// Keeper is the lanes an exactly-once worker keeps (Mode Poll, a pool as
// the relay's DB). Taking a lane that another worker's producer owns fences that
// producer (see Pool.Acquire): its open transaction is aborted and it takes
// its lanes again, fencing in turn. Replicas that take lanes from each
// other between batches therefore abort each other's transactions while a
// backlog drains. So each worker runs its batches on a connection of its
// own, with one producer for as long as it runs, and keeps the lanes its
// producer owns locked between batches with a session lock in the lanes'
// namespace: its own claims' try-locks go through, other relays' and
// workers' fail, and they leave the lanes to it. A lane is kept from the
// batch that took it over (the session lock is taken in that batch's
// transaction, which holds the lane's transaction lock, so it is granted at
// once) and let go once no batch took it for keepIdle.
//
// The locks only keep order and spare fences: what a crash or a takeover
// sends twice is decided by the producers' fencing and the progress
// records, as without them. A batch that fails, or whose producer was
// fenced, closes the connection (the server drops its locks): its lanes
// are free at once. A relay frozen between batches loses its session, and
// so its lanes, after idle_session_timeout (NewKeeper's idleMillis).
type Keeper struct {
	p    *Pool
	pool lanelock.Acquirer
	db   interface {
		Begin(ctx context.Context) (pgx.Tx, error)
	}
	idleMillis   string
	ns           int32
	table        string
	batchTimeout time.Duration

	conn *pgx.Conn // taken out of the pool, as the LISTEN connection is
	// off: the server cannot bound an idle session (no
	// idle_session_timeout, PostgreSQL 13): no lane is kept.
	off bool
	// w is the worker's producer, taken at its first batch and kept until
	// the worker stops: the lanes conn keeps are w's.
	w *Worker
	// kept are the lanes whose session locks conn holds; used the kept
	// lanes a batch took since freed, when the unused ones were let go.
	kept  map[int32]bool
	used  map[int32]bool
	freed time.Time
}

// keepIdle is how long an exactly-once worker keeps a lane that no batch
// of its took, as long as cursor progress's workers keep theirs: a lane
// whose events stopped is free for any relay soon after.
const keepIdle = cursor.KeepSaveEvery

// NewKeeper returns an exactly-once worker's keeper on pool (the relay's
// DB), its connection's idle session bounded by idleMillis, locking lanes
// in namespace ns of table; nil where lanes are not kept (no pool).
func (p *Pool) NewKeeper(pool lanelock.Acquirer, db interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}, idleMillis string, ns int32, table string, batchTimeout time.Duration) *Keeper {
	if pool == nil {
		return nil
	}
	return &Keeper{p: p, pool: pool, db: db, idleMillis: idleMillis, ns: ns, table: table, batchTimeout: batchTimeout, kept: map[int32]bool{}, used: map[int32]bool{}}
}

// Usable reports whether k runs the worker's batches.
func (k *Keeper) Usable() bool { return k != nil && !k.off }

// Begin begins a batch's transaction on the worker's connection, which it
// acquires first when it has none.
func (k *Keeper) Begin(ctx context.Context) (pgx.Tx, error) {
	if k.off {
		return k.db.Begin(ctx)
	}
	if k.conn == nil {
		conn, err := lanelock.Keep(ctx, k.pool, k.idleMillis, k.p.cfg.Logger, &k.off, "exactly-once workers keep no lanes between batches, so replicas fence each other more often")
		if err != nil {
			return nil, err
		}
		if conn == nil { // each batch locks its lanes for itself only
			return k.db.Begin(ctx)
		}
		k.conn, k.freed = conn, time.Now()
	}
	tx, err := k.conn.Begin(ctx)
	if err != nil {
		// The connection was lost (or its idle session ended): its locks
		// went with it.
		k.drop(ctx)
		return nil, err
	}
	return tx, nil
}

// Worker returns the worker's producer, taking one on first use.
func (k *Keeper) Worker(client sarama.Client) *Worker {
	if k.w == nil {
		k.w = k.p.Take(client)
	}
	return k.w
}

// Own takes, in tx, session locks on the lanes of a batch its producer now
// owns that the connection does not keep yet: tx holds their transaction
// locks, so they are granted at once. Nothing is kept when tx does not run
// on the kept connection.
func (k *Keeper) Own(ctx context.Context, tx pgx.Tx, lanes map[int32]bool) error {
	if k == nil || k.conn == nil || tx.Conn() != k.conn {
		return nil
	}
	var take []int32
	for lane := range lanes {
		if !k.kept[lane] {
			take = append(take, lane)
		}
	}
	if len(take) == 0 {
		return nil
	}
	slices.Sort(take)
	if _, err := tx.Exec(ctx, lanelock.Own, pgx.NamedArgs{"ns": k.ns, "lanes": take}); err != nil {
		return fmt.Errorf("relay: exactly-once: keep lanes %v of %s: %w", take, k.table, err)
	}
	for _, lane := range take {
		k.kept[lane] = true
	}
	return nil
}

// Finished takes the outcome err of a batch of the worker, which took
// lanes (none when it failed before it took its producer). Every lane is let go, by closing the
// connection, after a failure while lanes are kept (other relays may
// deliver them meanwhile) or one of the database or its connection, and
// once the producer must be initialised again while lanes are
// kept (fenced, or a transaction of unknown outcome: it owns no lane until
// it takes them again). Otherwise the batch's lanes are used, and once
// every keepIdle the kept lanes no batch took since are let go. A worker
// that keeps nothing keeps its connection through Kafka's failures and
// through batches that found nothing to take.
func (k *Keeper) Finished(ctx context.Context, lanes map[int32]bool, err error) {
	if k.conn == nil {
		return
	}
	kept := len(k.kept) > 0
	switch {
	case err != nil && (kept || dberr.Is(err) || k.conn.IsClosed()), kept && k.w != nil && !k.w.Txn.Ready():
		k.drop(ctx)
		return
	case err != nil:
		return
	}
	for lane := range lanes {
		if k.kept[lane] {
			k.used[lane] = true
		}
	}
	if time.Since(k.freed) < keepIdle {
		return
	}
	k.freed = time.Now()
	free := lanelock.Idle(k.kept, k.used)
	if len(free) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, k.batchTimeout)
	defer cancel()
	if _, err := k.conn.Exec(ctx, lanelock.Release, pgx.NamedArgs{"ns": k.ns, "lanes": free}); err != nil {
		k.p.cfg.Logger.Warn("outbox relay: exactly-once: could not let idle lanes go; closing the worker's connection lets them all go", "lanes", free, "error", err)
		k.drop(ctx)
		return
	}
	for _, lane := range free {
		delete(k.kept, lane)
	}
}

// drop closes the connection: the server drops its locks.
func (k *Keeper) drop(ctx context.Context) {
	if k.conn == nil {
		return
	}
	_ = k.conn.Close(context.WithoutCancel(ctx))
	k.conn = nil
	clear(k.kept)
	clear(k.used)
}

// Close lets the lanes and the producer go (the worker stops).
func (k *Keeper) Close(ctx context.Context) {
	if k == nil {
		return
	}
	k.drop(ctx)
	if k.w != nil {
		k.p.Release(k.w)
		k.w = nil
	}
}

// Holds reports whether w is the keeper's worker (its producer).
func (k *Keeper) Holds(w *Worker) bool { return k != nil && k.w == w }
