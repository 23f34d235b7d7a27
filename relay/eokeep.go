package relay

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox/internal/dberr"
	"github.com/fxoutbox/outbox/relay/internal/cursor"
	"github.com/fxoutbox/outbox/relay/internal/eo"
	"github.com/fxoutbox/outbox/relay/internal/lanelock"
)

// Lanes kept by exactly-once workers (Mode Poll, ExactlyOnce, a pool as the
// DB). Taking a lane that another worker's producer owns fences that
// producer (see eoAcquire): its open transaction is aborted and it takes
// its lanes again, fencing in turn. Replicas that take lanes from each
// other between batches therefore abort each other's transactions while a
// backlog drains. So each worker runs its batches on a connection of its
// own, with one producer for as long as it runs, and keeps the lanes its
// producer owns locked between batches with a session lock in the lanes'
// namespace: its own claims' try-locks go through, other relays' and
// workers' fail, and they leave the lanes to it. A lane is kept from the
// batch that took it over (the session lock is taken in that batch's
// transaction, which holds the lane's transaction lock, so it is granted at
// once) and let go once no batch took it for eoKeepIdle.
//
// The locks only keep order and spare fences: what a crash or a takeover
// sends twice is decided by the producers' fencing and the progress
// records, as without them. A batch that fails, or whose producer was
// fenced, closes the connection (the server drops its locks): its lanes
// are free at once. A relay frozen between batches loses its session, and
// so its lanes, after idle_session_timeout (see keptIdleMillis).
type eoKeeper struct {
	r    *Relay
	conn *pgx.Conn // taken out of the pool, as the LISTEN connection is
	// off: the server cannot bound an idle session (no
	// idle_session_timeout, PostgreSQL 13): no lane is kept.
	off bool
	// w is the worker's producer, taken at its first batch and kept until
	// the worker stops: the lanes conn keeps are w's.
	w *eo.Worker
	// kept are the lanes whose session locks conn holds; used the kept
	// lanes a batch took since freed, when the unused ones were let go.
	kept  map[int32]bool
	used  map[int32]bool
	freed time.Time
}

// eoKeepIdle is how long an exactly-once worker keeps a lane that no batch
// of its took, as long as cursor progress's workers keep theirs: a lane
// whose events stopped is free for any relay soon after.
const eoKeepIdle = cursor.KeepSaveEvery

// newEOKeeper returns an exactly-once worker's keeper, or nil where lanes
// are not kept.
func (r *Relay) newEOKeeper() *eoKeeper {
	if r.eo == nil || r.cfg.Mode != Poll {
		return nil
	}
	if _, ok := r.db.(acquirer); !ok {
		return nil
	}
	return &eoKeeper{r: r, kept: map[int32]bool{}, used: map[int32]bool{}}
}

// usable reports whether k runs the worker's batches.
func (k *eoKeeper) usable() bool { return k != nil && !k.off }

// keptIdleMillis is the bound on a kept connection's idle time between
// batches, in milliseconds: longer than any wait of a live worker.
func keptIdleMillis(cfg Config) string {
	d := max(cfg.BatchTimeout, 2*cfg.PollInterval) + 5*time.Second
	return strconv.FormatInt(d.Milliseconds(), 10)
}

// Begin begins a batch's transaction on the worker's connection, which it
// acquires first when it has none.
func (k *eoKeeper) Begin(ctx context.Context) (pgx.Tx, error) {
	if k.off {
		return k.r.db.Begin(ctx)
	}
	if k.conn == nil {
		conn, err := lanelock.Keep(ctx, k.r.db.(acquirer), keptIdleMillis(k.r.cfg), k.r.cfg.Logger, &k.off, "exactly-once workers keep no lanes between batches, so replicas fence each other more often")
		if err != nil {
			return nil, err
		}
		if conn == nil { // each batch locks its lanes for itself only
			return k.r.db.Begin(ctx)
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

// worker returns the worker's producer, taking one on first use.
func (k *eoKeeper) worker(client sarama.Client) *eo.Worker {
	if k.w == nil {
		k.w = k.r.eo.Take(client)
	}
	return k.w
}

// own takes, in tx, session locks on the lanes of a batch its producer now
// owns that the connection does not keep yet: tx holds their transaction
// locks, so they are granted at once. Nothing is kept when tx does not run
// on the kept connection.
func (k *eoKeeper) own(ctx context.Context, tx pgx.Tx, lanes map[int32]bool) error {
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
	if _, err := tx.Exec(ctx, lanelock.Own, pgx.NamedArgs{"ns": k.r.q.ns, "lanes": take}); err != nil {
		return fmt.Errorf("relay: exactly-once: keep lanes %v of %s: %w", take, k.r.cfg.Table, err)
	}
	for _, lane := range take {
		k.kept[lane] = true
	}
	return nil
}

// finished takes the outcome of a batch of the worker (b.w nil: it failed
// before it took the producer). Every lane is let go, by closing the
// connection, after a failure while lanes are kept (other relays may
// deliver them meanwhile) or one of the database or its connection, and
// once the producer must be initialised again while lanes are
// kept (fenced, or a transaction of unknown outcome: it owns no lane until
// it takes them again). Otherwise the batch's lanes are used, and once
// every eoKeepIdle the kept lanes no batch took since are let go. A worker
// that keeps nothing keeps its connection through Kafka's failures and
// through batches that found nothing to take.
func (k *eoKeeper) finished(ctx context.Context, b *eoBatch, err error) {
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
	for lane := range b.lanes {
		if k.kept[lane] {
			k.used[lane] = true
		}
	}
	if time.Since(k.freed) < eoKeepIdle {
		return
	}
	k.freed = time.Now()
	var free []int32
	for lane := range k.kept {
		if !k.used[lane] {
			free = append(free, lane)
		}
	}
	clear(k.used)
	if len(free) == 0 {
		return
	}
	slices.Sort(free)
	ctx, cancel := context.WithTimeout(ctx, k.r.cfg.BatchTimeout)
	defer cancel()
	if _, err := k.conn.Exec(ctx, lanelock.Release, pgx.NamedArgs{"ns": k.r.q.ns, "lanes": free}); err != nil {
		k.r.cfg.Logger.Warn("outbox relay: exactly-once: could not let idle lanes go; closing the worker's connection lets them all go", "lanes", free, "error", err)
		k.drop(ctx)
		return
	}
	for _, lane := range free {
		delete(k.kept, lane)
	}
}

// drop closes the connection: the server drops its locks.
func (k *eoKeeper) drop(ctx context.Context) {
	if k.conn == nil {
		return
	}
	_ = k.conn.Close(context.WithoutCancel(ctx))
	k.conn = nil
	clear(k.kept)
	clear(k.used)
}

// close lets the lanes and the producer go (the worker stops).
func (k *eoKeeper) close(ctx context.Context) {
	if k == nil {
		return
	}
	k.drop(ctx)
	if k.w != nil {
		k.r.eo.Release(k.w)
		k.w = nil
	}
}
