package relay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox/internal/locks"
	"github.com/fxoutbox/outbox/internal/tablesql"
	"github.com/fxoutbox/outbox/relay/internal/cursor"
	"github.com/fxoutbox/outbox/relay/internal/partition"
)

// ErrPartitionedTable is returned by Start (and RunOnce) of a relay with
// ProgressMarks on a partitioned table (migrations.Partitioned): its
// retention drops whole partitions once the lanes' positions are past
// them, which marks cannot tell.
var ErrPartitionedTable = errors.New("relay: the table is partitioned")

// partitionLockTimeout bounds each wait of the partitions' upkeep for a
// table lock: writers queue behind a waiting ALTER TABLE, so it is short,
// and a change that timed out is tried again at the next round.
const partitionLockTimeout = time.Second

// PartitionReport is what one round of MaintainPartitions did.
type PartitionReport struct {
	// Made are the partitions it created (or the tail it bounded).
	Made []string
	// Dropped are the partitions it retired.
	Dropped []string
	// Kept are the partitions past their upper bound that stay, with why:
	// a reason that starts with its class (retention, undelivered, parked,
	// older, lock_timeout, ahead) and a colon.
	Kept []PartitionKept
}

// PartitionKept is a partition that stays, and why: in a PartitionReport,
// and in admin.Status (the relays' last word, read from the catalog).
type PartitionKept struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// partitions is what the relay knows of its table's partitioning.
type partitions struct {
	mu      sync.Mutex
	checked bool // partitioned is known
	yes     bool
	kept    []PartitionKept // from the last round
	done    bool            // a round ended
}

// isPartitioned reports, once it could read it, whether the table is
// partitioned.
func (r *Relay) isPartitioned(ctx context.Context) (bool, error) {
	p := &r.parts
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.checked {
		return p.yes, nil
	}
	var l partition.Layout
	err := pgx.BeginFunc(ctx, r.db, func(tx pgx.Tx) (err error) {
		l, err = partition.Load(ctx, tx, r.cfg.Table)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("relay: partitions of %s: %w", r.cfg.Table, err)
	}
	p.checked, p.yes = true, l.Partitioned
	return p.yes, nil
}

// MaintainPartitions is one round of a partitioned table's upkeep (see
// docs/partitions.md); started relays run it every CleanupInterval in
// place of Cleanup's deletions, and Cleanup runs it on such a table. It
// makes the partitions Ahead intervals past now (the interval is read from
// the partitions' bounds), bounds a tail that took writes, and drops, oldest
// first, each partition that Retention has passed since its upper bound
// and whose every row every lane delivered. What stays is named in the
// report, in the partitions' comments (which admin.ReadStatus and
// `outboxctl status` show) and in the metric outbox.partitions.kept. One
// relay of a table changes its partitions at a time (an advisory lock);
// the others skip the round. A table that is not partitioned gets nothing.
func (r *Relay) MaintainPartitions(ctx context.Context) (PartitionReport, error) {
	var rep PartitionReport
	if err := r.settleProgress(ctx); err != nil {
		return rep, err
	}
	yes, err := r.isPartitioned(ctx)
	if err != nil || !yes {
		return rep, err
	}
	if r.progress != ProgressCursor {
		return rep, r.partitionedMarks()
	}
	env := partition.Env{
		Table: r.cfg.Table, Cursor: cursor.PositionsOf(r.cfg.Table), Delivered: tablesql.Delivered(r.cfg.Table),
		LockNS: locks.Namespace(r.cfg.Table.String()), LockKey: locks.Partitions,
		LockTimeout: partitionLockTimeout, Retention: r.cfg.Retention,
	}
	now := time.Now()
	made, aheadKept, err := partition.Extend(ctx, r.db, env, now)
	if err != nil && !errors.Is(err, partition.ErrBusy) {
		return rep, fmt.Errorf("relay: make the partitions of %s: %w", r.cfg.Table, err)
	}
	dropped, kept, err := partition.Retire(ctx, r.db, env, now)
	rep.Made, rep.Dropped = made, dropped
	for _, k := range append(aheadKept, kept...) {
		rep.Kept = append(rep.Kept, PartitionKept(k))
	}
	if err != nil {
		return rep, fmt.Errorf("relay: retire the partitions of %s: %w", r.cfg.Table, err)
	}
	r.parts.mu.Lock()
	r.parts.kept, r.parts.done = rep.Kept, true
	r.parts.mu.Unlock()
	for _, n := range rep.Dropped {
		r.cfg.Logger.Info("outbox relay: dropped a delivered partition", "table", r.cfg.Table.String(), "partition", n)
	}
	return rep, nil
}

func (r *Relay) partitionedMarks() error {
	return fmt.Errorf("%w: %s is partitioned, and its relays drop partitions once the lanes' positions are past them: set Progress to relay.ProgressCursor (OUTBOX_PROGRESS=cursor), or keep marks on an unpartitioned table (migrations.Outbox.Up)", ErrPartitionedTable, r.cfg.Table)
}

// keptByReason counts the partitions of the last round that stay, by the
// class of their reason; ok is false before a round ended.
func (r *Relay) keptByReason() (map[string]int64, bool) {
	r.parts.mu.Lock()
	defer r.parts.mu.Unlock()
	if !r.parts.done {
		return nil, false
	}
	n := map[string]int64{}
	for _, c := range partitionReasons {
		n[c] = 0
	}
	for _, k := range r.parts.kept {
		for _, c := range partitionReasons {
			if len(k.Reason) > len(c) && k.Reason[:len(c)+1] == c+":" {
				n[c]++
			}
		}
	}
	return n, true
}

var partitionReasons = []string{partition.ReasonRetention, partition.ReasonUndelivered, partition.ReasonParked, partition.ReasonOlder, partition.ReasonLockTimeout, partition.ReasonAhead}
