package relay

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox/internal/tablesql"
	"github.com/fxoutbox/outbox/internal/textcut"
	"github.com/fxoutbox/outbox/relay/internal/claim"
	"github.com/fxoutbox/outbox/relay/internal/cursor"
	"github.com/fxoutbox/outbox/relay/internal/failure"
	"github.com/fxoutbox/outbox/relay/internal/marks"
)

// progressMode is what a polling batch does that depends on Progress: how
// it claims rows and how it writes, in the batch's transaction, what
// became of them. New picks one: marksMode (ProgressMarks: rows are
// marked and charged in place, relay/internal/marks) or cursorMode
// (ProgressCursor: the lanes' positions move, a parked row moves to the
// parked table, relay/internal/cursor). The pipeline around them (publish,
// pacing, commit) is one.
type progressMode interface {
	// claim is the finder of a polling batch of up to n rows, leaving out
	// the rows of the held keys (see marks.Engine.Claim and
	// cursor.Engine.Claim).
	claim(ctx context.Context, tx pgx.Tx, n int, held []string, upto int64, keep *cursor.Keeper, isolate bool) (claimed, error)
	// claimEO is claim for an exactly-once batch b (see eoClaim and
	// eoCursorClaim).
	claimEO(ctx context.Context, tx pgx.Tx, n int, held []string, b *eoBatch) (claimed, error)
	// chargeUnreadable charges the rows that cannot be read (see
	// Relay.chargeUnreadable), parking them with park, and hands scan the
	// charged rows: id, event_id, topic, partition_key, parked.
	chargeUnreadable(ctx context.Context, tx pgx.Tx, u unreadableCharge, scan func(pgx.Rows) error) error
	// record writes what became of a batch's published rows (see
	// Relay.record) and returns which failed rows were parked.
	record(ctx context.Context, tx pgx.Tx, rec recording) (map[int64]bool, error)
}

// unreadableCharge is the charge of the rows that cannot be read (bad,
// their ids), with their stored reasons (msgs), parked at once with park.
type unreadableCharge struct {
	bad  []claim.Unreadable
	ids  []int64
	msgs []string
	park bool
}

// recording is what record writes: the acknowledged rows' ids, the rows
// sent and their outcomes, the failed ones (rows[failed[j]]: its id
// fids[j], its stored reason reasons[j], its limit of attempts
// limits[j]), whether the finder claimed the rows by marking them (the
// marks stream's claim), and the cursor batch (every batch cursorMode
// records has one: its claim read the rows).
type recording struct {
	ids     []int64
	rows    []claim.Row
	errs    []error
	failed  []int
	fids    []int64
	reasons []string
	limits  []int32
	marked  bool
	cur     *cursor.Batch
}

// markError is the error of record's first round trip.
func (rec recording) markError(err error) error {
	return fmt.Errorf("relay: mark %d events published, %d failed: %w", len(rec.ids), len(rec.failed), err)
}

// marksMode is ProgressMarks' progressMode.
type marksMode struct{ r *Relay }

func (m marksMode) claim(ctx context.Context, tx pgx.Tx, n int, held []string, upto int64, _ *cursor.Keeper, isolate bool) (claimed, error) {
	if err := m.r.checkMarks(ctx, tx); err != nil {
		return claimed{}, err
	}
	if isolate {
		return marksClaimed(m.r.marks.ClaimIsolating(ctx, tx, n, held, upto))
	}
	return marksClaimed(m.r.marks.Claim(ctx, tx, n, held, upto))
}

func (m marksMode) claimEO(ctx context.Context, tx pgx.Tx, n int, held []string, b *eoBatch) (claimed, error) {
	if err := m.r.checkMarks(ctx, tx); err != nil {
		return claimed{}, err
	}
	return m.r.eoClaim(ctx, tx, n, held, b)
}

func (m marksMode) chargeUnreadable(ctx context.Context, tx pgx.Tx, u unreadableCharge, scan func(pgx.Rows) error) error {
	return m.r.marks.ChargeUnreadable(ctx, tx, u.ids, u.msgs, u.park, scan)
}

// record marks the acknowledged rows published (or, for rows the finder
// marked, takes the mark back from the others) and counts an attempt on
// each failed one, in one round trip.
func (m marksMode) record(ctx context.Context, tx pgx.Tx, rec recording) (map[int64]bool, error) {
	ids, back := rec.ids, []int64(nil)
	if rec.marked {
		ids = nil
		for i, err := range rec.errs {
			if err != nil {
				back = append(back, rec.rows[i].ID)
			}
		}
	}
	parked, err := m.r.marks.Record(ctx, tx, ids, back, rec.fids, rec.reasons, rec.limits)
	if err != nil {
		return nil, rec.markError(err)
	}
	return parked, nil
}

// queueCharge queues a try counted on each of the failed rows ids of a
// cursor table, their last errors errs cut to lastErrorMax
// (cursor.Engine.QueueCharge).
func (r *Relay) queueCharge(b *pgx.Batch, ids []int64, reasons []string, limits []int32, errs []error, seen func(id int64, parked bool)) {
	texts := make([]string, len(errs))
	for j, err := range errs {
		texts[j] = textcut.Cut(err.Error(), lastErrorMax)
	}
	r.cur.QueueCharge(b, ids, reasons, limits, texts, seen)
}

// cursorMode is ProgressCursor's progressMode.
type cursorMode struct{ r *Relay }

func (c cursorMode) claim(ctx context.Context, tx pgx.Tx, n int, held []string, _ int64, keep *cursor.Keeper, _ bool) (claimed, error) {
	return c.r.cursorClaim(ctx, tx, n, held, keep)
}

func (c cursorMode) claimEO(ctx context.Context, tx pgx.Tx, n int, held []string, b *eoBatch) (claimed, error) {
	return c.r.eoCursorClaim(ctx, tx, n, held, b)
}

// chargeUnreadable parks by moving the rows to the parked table, copied by
// the server (which never prints them), with what PostgreSQL said.
func (c cursorMode) chargeUnreadable(ctx context.Context, tx pgx.Tx, u unreadableCharge, scan func(pgx.Rows) error) error {
	details := make([]string, len(u.bad))
	for i, b := range u.bad {
		details[i] = textcut.Cut(strings.TrimSpace(b.Err.Error()+" "+failure.UnreadableDetail(b.Err)), lastErrorMax)
	}
	return c.r.cur.ChargeUnreadable(ctx, tx, u.ids, u.msgs, details, u.park, scan)
}

// record writes no marks: it counts an attempt on each failed row (a row
// out of tries moves to the parked table: Charge copies it, with its last
// error in full beside the reason, and Unpark deletes it), then writes the
// lanes' positions, which follow what was parked (a second round trip
// when rows failed).
func (c cursorMode) record(ctx context.Context, tx pgx.Tx, rec recording) (map[int64]bool, error) {
	b := &pgx.Batch{}
	parked := map[int64]bool{}
	if len(rec.fids) == 0 {
		c.r.cur.Save(ctx, b, rec.cur, rec.rows, rec.errs, parked)
		if b.Len() > 0 {
			if err := tx.SendBatch(ctx, b).Close(); err != nil {
				return nil, rec.markError(err)
			}
		}
		return parked, nil
	}
	errs := make([]error, len(rec.failed))
	for j, i := range rec.failed {
		errs[j] = rec.errs[i]
	}
	c.r.queueCharge(b, rec.fids, rec.reasons, rec.limits, errs, func(id int64, p bool) {
		if p {
			parked[id] = true
		}
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, rec.markError(err)
	}
	b = &pgx.Batch{}
	c.r.cur.Save(ctx, b, rec.cur, rec.rows, rec.errs, parked)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("relay: save the lanes' positions after %d events published, %d failed: %w", len(rec.ids), len(rec.failed), err)
	}
	return parked, nil
}

// fixedProgress is the progress the configuration decides without the
// table: Progress when it is not ProgressAuto; marks under Ordering
// Unordered (cursor needs PerKey). ok is false when the table decides.
func (c Config) fixedProgress() (p Progress, ok bool) {
	switch {
	case c.Progress != ProgressAuto:
		return c.Progress, true
	case c.Ordering != PerKey:
		return ProgressMarks, true
	}
	return ProgressAuto, false
}

// ProgressFollowsTable reports whether a relay with c chooses its progress
// by reading the table (ProgressAuto under Ordering PerKey): fxoutbox's
// Migrate then gives a table it creates the cursor migration.
func (c Config) ProgressFollowsTable() bool {
	_, fixed := c.fixedProgress()
	return !fixed
}

// Progress returns how the relay records what it delivered: Config's
// Progress, or under ProgressAuto what the relay chose when it read the
// table (ProgressAuto until then).
func (r *Relay) Progress() Progress {
	if !r.settled.Load() {
		return ProgressAuto
	}
	return r.progress
}

// newKeeper returns a worker's cursor.Keeper, or nil where lanes are not
// kept: they are under cursor progress, in Mode Poll, at least once, with a
// pool as the DB.
func (r *Relay) newKeeper() *cursor.Keeper {
	if r.cur == nil || r.eo != nil || r.cfg.Mode != Poll {
		return nil
	}
	return r.cur.NewKeeper()
}

// useProgress sets what goes with the progress p: the cursor's state and
// statements, the batch's finder and recorder, the transactions'
// settings. It runs once, before settled is set.
func (r *Relay) useProgress(p Progress) {
	c := r.cfg
	r.progress, r.prog = p, marksMode{r}
	r.txSettings, r.sessionSettings, r.idleMillis = txSettings(c, p)
	r.marks = marks.New(r.q.Queries, marks.Config{Table: c.Table, Lanes: c.Lanes, PollInterval: c.PollInterval, NS: r.q.ns,
		Unordered: c.Ordering == Unordered, TxSettings: r.txSettings, IdleMillis: r.idleMillis})
	if p == ProgressCursor {
		pool, _ := r.db.(acquirer)
		r.cur = cursor.New(cursor.Config{Table: c.Table, Lanes: c.Lanes, BatchSize: c.BatchSize, MaxBatchSize: c.MaxBatchSize,
			PollInterval: c.PollInterval, BatchTimeout: c.BatchTimeout, NS: r.q.ns, Lock: r.q.Lock,
			Guarded:    r.marks.Guarded(),
			TxSettings: r.txSettings, SessionSettings: r.sessionSettings, IdleMillis: r.idleMillis, ExactlyOnce: c.Delivery == ExactlyOnce,
			DB: r.db, Pool: pool, KeptIdleMillis: keptIdleMillis(c), Logger: c.Logger})
		r.q.Cleanup = r.cur.Q.Cleanup // rows every lane delivered, not marked ones
		r.prog = cursorMode{r}
	}
	r.settled.Store(true)
}

// settleProgress makes sure the relay's progress is known: under
// ProgressAuto it reads the table (tablesql.ForCursor) and logs what it
// chose. A database that cannot be reached leaves it undecided, for the
// next call.
func (r *Relay) settleProgress(ctx context.Context) error {
	if r.settled.Load() {
		return nil
	}
	r.settleMu.Lock()
	defer r.settleMu.Unlock()
	if r.settled.Load() {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.BatchTimeout)
	defer cancel()
	var has, cur bool
	err := pgx.BeginFunc(ctx, r.db, func(tx pgx.Tx) (err error) {
		has, cur, err = tablesql.ForCursor(ctx, tx, r.cfg.Table)
		return err
	})
	if err != nil {
		return fmt.Errorf("relay: Progress auto: read whether %s records cursor progress: %w", r.cfg.Table, err)
	}
	p, why := ProgressCursor, "it has the cursor migration ("+cursor.PositionsOf(r.cfg.Table).String()+")"
	switch {
	case !has:
		p, why = ProgressMarks, "it has no cursor migration; apply it to deliver without a write per event (docs/progress.md), or set Progress"
	case !cur:
		p, why = ProgressMarks, "it was given the cursor migration and no relay has recorded cursor progress on it yet: start the first with Progress cursor once the marks relays are stopped (docs/progress.md, Turning it on)"
	}
	if p == ProgressMarks {
		// What checkMarks reads, just read (a table that is not in cursor
		// progress is not partitioned either).
		r.marksChecked.Store(time.Now().UnixNano())
	}
	r.useProgress(p)
	r.cfg.Logger.Info("outbox relay: progress "+p.String()+" (Progress auto: "+why+")", "table", r.cfg.Table.String())
	return nil
}
