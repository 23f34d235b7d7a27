package relay

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/tablesql"
	"github.com/fxoutbox/outbox/relay/internal/claim"
	"github.com/fxoutbox/outbox/relay/internal/cursor"
)

// Progress says how a relay records what it delivered.
type Progress int

const (
	// ProgressAuto (the default) follows the table: ProgressCursor where
	// the table has the cursor migration and either a relay already
	// recorded cursor progress on it, or migrations.Install made it with
	// the migration (fxoutbox's OUTBOX_MIGRATE on a new table), or it is
	// partitioned; ProgressMarks otherwise, and always under Ordering
	// Unordered. A table given the cursor migration later stays on marks
	// until its first relay with ProgressCursor starts (its marks relays
	// may still be delivering the events written before; see "Turning it
	// on" in docs/progress.md). The relay reads the table at Start, or at
	// its first batch when the database could not be reached then, logs
	// what it chose, and reports it in Relay.Progress. When the table goes
	// over to cursor progress under a relay that chose marks, its batches
	// fail with ErrCursorTable within cursor.CheckEvery (10s) instead of sending again what the
	// cursor delivers; restarted, it records cursor progress.
	ProgressAuto Progress = iota
	// ProgressMarks sets published_at on each delivered
	// row: an UPDATE per event (a new tuple, an entry in every index, a
	// dead tuple for vacuum), and Retention deletes the rows later.
	ProgressMarks
	// ProgressCursor records, per lane, the snapshot up to which the lane
	// is delivered and its place in the window after it (see
	// docs/progress.md): one small UPDATE of the lanes' rows per batch and
	// nothing per event, so an event costs the table its INSERT. An open
	// transaction holds back only its own events. It needs the cursor
	// migration (migrations.Cursor.Up) and Ordering PerKey; in Stream mode
	// the relay publishes what the slot decodes and the positions are its
	// checkpoint, once a second (docs/streaming.md); under
	// ExactlyOnce each lane's position also travels in the progress record
	// of its Kafka transaction. A parked event moves to the parked table
	// (<name>_parked) in the transaction that moves its lane past it; a
	// requeue writes it back into the table with a new id and txid, which
	// the next window takes.
	ProgressCursor
)

func (p Progress) String() string {
	switch p {
	case ProgressAuto:
		return "auto"
	case ProgressMarks:
		return "marks"
	case ProgressCursor:
		return "cursor"
	}
	return "Progress(" + strconv.Itoa(int(p)) + ")"
}

// validateProgress checks Progress and what ProgressCursor needs.
func (c Config) validateProgress() error {
	bad := func(why string) error {
		return &outbox.ConfigError{Field: "Progress", Reason: fmt.Sprintf("is %v: %s", c.Progress, why)}
	}
	switch {
	case c.Progress == ProgressMarks || c.Progress == ProgressAuto:
		return nil
	case c.Progress != ProgressCursor:
		return bad("use relay.ProgressAuto, relay.ProgressMarks or relay.ProgressCursor")
	case c.Ordering != PerKey:
		return bad("needs Ordering PerKey: the positions are kept per lane")
	}
	return nil
}

// ErrCursorNotReady wraps the reasons a table cannot be relayed with
// ProgressCursor yet; the message says what to do.
var ErrCursorNotReady = cursor.ErrNotReady

// ErrCursorCluster says the server's transaction ids are behind the
// lanes' positions: the table was restored into another cluster (pg_dump
// and pg_restore, or a move by logical replication), where the positions
// would take new events for delivered ones. The relay stops rather than
// lose them; "Changes of cluster" in docs/progress.md says what
// to do.
var ErrCursorCluster = cursor.ErrCluster

// ErrCursorTable is returned by Start of a relay with ProgressMarks on a
// table whose relays record cursor progress: it would send again every
// event the cursor delivered (their published_at is NULL).
var ErrCursorTable = errors.New("relay: the table's relays record cursor progress")

// checkMarks refuses marks progress on a table whose relays record cursor
// progress (tablesql.ForCursor): at Start, at each polling batch until one
// check went through (a relay started while the database was down), and
// again every cursor.CheckEvery, so a marks relay that runs when the table
// goes over to cursor progress (its first cursor relay started) stops
// instead of sending again what the cursor delivers. A batch checks in its
// own transaction tx (no second connection while it holds one), and one
// worker at a time checks again; nil tx (Start) checks in a transaction of
// its own.
func (r *Relay) checkMarks(ctx context.Context, tx pgx.Tx) (err error) {
	at := r.marksChecked.Load()
	if at != 0 && (time.Since(time.Unix(0, at)) < cursor.CheckEvery || !r.marksChecked.CompareAndSwap(at, time.Now().UnixNano())) {
		return nil // checked lately, or another worker checks now
	}
	defer func() {
		if err != nil {
			r.marksChecked.Store(at) // the next batch checks again
		}
	}()
	var inUse bool
	read := func(tx pgx.Tx) (err error) {
		_, inUse, err = tablesql.ForCursor(ctx, tx, r.cfg.Table)
		return err
	}
	if tx != nil {
		err = read(tx)
	} else {
		err = pgx.BeginFunc(ctx, r.db, read)
	}
	if err != nil {
		return fmt.Errorf("relay: check the progress of %s: %w", r.cfg.Table, err)
	}
	if yes, err := r.isPartitioned(ctx); err != nil {
		return err
	} else if yes {
		return r.partitionedMarks()
	}
	if inUse {
		do := "set Progress to relay.ProgressCursor (OUTBOX_PROGRESS=cursor), or go back to marks as the cursor migration's down file says"
		if r.cfg.Progress == ProgressAuto {
			do = "this relay chose marks when it started (Progress auto) and the table went over to cursor progress since: restart it, and it records cursor progress"
		}
		return fmt.Errorf("%w: %s records cursor progress (%s), and a relay with marks progress would send again every event the cursor delivered: %s", ErrCursorTable, r.cfg.Table, cursor.PositionsOf(r.cfg.Table), do)
	}
	r.marksChecked.Store(time.Now().UnixNano())
	return nil
}

// cursorClaim is the claim under ProgressCursor (cursor.Engine.Claim).
func (r *Relay) cursorClaim(ctx context.Context, tx pgx.Tx, n int, held []string, k *cursor.Keeper) (claimed, error) {
	c, err := r.cur.Claim(ctx, tx, n, held, k)
	return claimedOf(c), err
}

// claimedOf is a cursor claim as the pipeline takes it.
func claimedOf(c cursor.Claim) claimed {
	return claimed{rows: c.Rows, bad: c.Bad, more: c.More, heldElsewhere: c.HeldElsewhere, cur: c.Batch}
}

// marksClaimed is a marks claim as the pipeline takes it.
func marksClaimed(c claim.Claimed, err error) (claimed, error) {
	return claimed{rows: c.Rows, bad: c.Bad, more: c.More, heldElsewhere: c.HeldElsewhere}, err
}
