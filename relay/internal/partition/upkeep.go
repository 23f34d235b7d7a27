package partition

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
)

// DB begins transactions.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Env is what the upkeep of one table needs.
type Env struct {
	Table outbox.Table
	// Cursor is the table of the lanes' positions; Delivered the condition,
	// on a row (unqualified columns), that every lane delivered it
	// (tablesql.Delivered).
	Cursor    outbox.Table
	Delivered string
	// LockNS and LockKey name the transaction-scoped advisory lock that
	// every change takes (with pg_try_advisory_xact_lock): one relay of the
	// table changes its partitions at a time, the others skip.
	LockNS, LockKey int32
	// LockTimeout bounds each wait for a table lock (lock_timeout): writers
	// queue behind a waiting ALTER TABLE, so the wait is short, and the
	// change is tried again at the next round.
	LockTimeout time.Duration
	// Retention is how long a partition is kept after its upper bound;
	// negative: forever.
	Retention time.Duration
}

// Kept is a partition past its time that stays, and why. Reason starts
// with its class and a colon (see the Reason constants).
type Kept struct {
	Name   string
	Reason string
}

// The classes of Kept.Reason, for metrics.
const (
	ReasonRetention   = "retention"   // Retention has not passed since its upper bound
	ReasonUndelivered = "undelivered" // a lane has not delivered a row of it
	ReasonParked      = "parked"      // it holds parked events
	ReasonOlder       = "older"       // an older partition stays, and they go in order
	ReasonLockTimeout = "lock_timeout"
	ReasonAhead       = "ahead" // the tail holds ids too far in the future to bound it
)

// FarAhead is how many intervals ahead of the clock an id in the tail may
// be for the upkeep to bound the tail past it.
const FarAhead = 4 * (Ahead + 1)

// ErrBusy says another relay holds the upkeep's lock.
var ErrBusy = errors.New("another relay is changing the partitions")

// lockTimedOut reports a lock_timeout (lock_not_available).
func lockTimedOut(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && pg.Code == "55P03"
}

// asOwner makes tx act as the table's owner when the role it connected as
// is a member of the owning role (granted, as
// migrations/partitioned/roles.example.sql does, so that a relay role
// without the owner's privileges, NOINHERIT, runs the upkeep): SET LOCAL
// ROLE, for this transaction only. Creating, attaching, detaching,
// dropping and commenting on partitions takes the owner's privileges, and
// a partition made so belongs to the owner as its siblings do. The owner
// itself, a superuser, and a role that is no member change nothing (the
// last then fails with PostgreSQL's "must be owner", see explain).
func (e Env) asOwner(ctx context.Context, tx pgx.Tx) error {
	var owner *string
	err := tx.QueryRow(ctx, `SELECT (SELECT r.rolname::text FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner
		WHERE c.oid = to_regclass($1) AND r.rolname <> current_user AND pg_has_role(current_user, c.relowner, 'MEMBER')
		  AND NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user))`, sqlname.Ident(e.Table)).Scan(&owner)
	if err != nil || owner == nil {
		return err
	}
	_, err = tx.Exec(ctx, "SET LOCAL ROLE "+pgx.Identifier{*owner}.Sanitize())
	return err
}

// run runs f in a transaction that acts as the table's owner (asOwner).
func (e Env) run(ctx context.Context, db DB, f func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := e.asOwner(ctx, tx); err != nil {
			return err
		}
		return f(tx)
	})
}

// explain adds to a refused privilege (SQLSTATE 42501) what the upkeep
// needs.
func (e Env) explain(err error) error {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == "42501" {
		return fmt.Errorf("%w (the partitions' upkeep creates, attaches, detaches and drops partitions of %s, which takes its owner: connect the relay as a role that owns the table or is a member of its owning role, and give that role USAGE and CREATE on the schema and SELECT on %s, as migrations/partitioned/roles.example.sql does; docs/partitions.md, \"Roles\")", err, e.Table, e.Cursor)
	}
	return err
}

// begin opens a change: the table owner's role (asOwner), the lock
// timeout and the upkeep's advisory lock.
func (e Env) begin(ctx context.Context, db DB) (pgx.Tx, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	var got bool
	err = e.asOwner(ctx, tx)
	if err == nil {
		_, err = tx.Exec(ctx, "SELECT set_config('lock_timeout', $1, true)", fmt.Sprintf("%dms", max(1, e.LockTimeout.Milliseconds())))
	}
	if err == nil {
		err = tx.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock($1, $2)", e.LockNS, e.LockKey).Scan(&got)
	}
	if err == nil && !got {
		err = ErrBusy
	}
	if err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, err
	}
	return tx, nil
}

// Extend keeps partitions Ahead intervals past now: when the tail starts
// before that, it is split: the empty tail is dropped and made again past
// the new partitions, in one transaction. A tail that took writes (no relay
// made partitions in time, or writers' clocks run ahead) is re-bounded to
// [its start, X), X the interval bound Ahead+1 intervals past the later of
// its highest id and now, and a new tail made from X (see reboundTail). It
// returns the partitions it made, and the tail as Kept when its ids are
// too far ahead (FarAhead intervals) to bound it.
func Extend(ctx context.Context, db DB, e Env, now time.Time) (made []string, kept []Kept, err error) {
	defer func() { err = e.explain(err) }()
	l, err := loadTx(ctx, db, e.Table)
	if err != nil || !l.Partitioned {
		return nil, nil, err
	}
	tail, interval := l.Tail(), l.Interval()
	if tail.Name == "" {
		return nil, nil, fmt.Errorf("partitions of %s: no partition from %s to MAXVALUE: make one (docs/partitions.md)", e.Table, lastHi(l))
	}
	target := Floor(now, interval).Add((Ahead + 1) * interval)
	var maxID *string
	err = e.run(ctx, db, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, "SELECT (SELECT event_id::text FROM "+l.Ident(tail.Name)+" ORDER BY event_id DESC LIMIT 1)").Scan(&maxID)
	})
	if err != nil {
		return nil, nil, fmt.Errorf("partitions of %s: read the tail: %w", e.Table, err)
	}
	if maxID == nil {
		if !tail.Lo.Before(target) {
			return nil, nil, dropStaleBound(ctx, db, e, l, tail)
		}
		made, err = splitEmptyTail(ctx, db, e, tail, interval, target)
		return made, nil, err
	}
	// The tail took writes: writers' ids are ahead of the partitions made
	// (no relay ran for longer than the horizon, or their clocks run ahead).
	mt := IDTime(*maxID)
	if mt.After(now.Add(FarAhead * interval)) {
		return nil, []Kept{{tail.Name, fmt.Sprintf("%s: it holds the event id %s, of %s, more than %d intervals ahead of now: the tail is not bounded (it would make one partition of all that time) until that row is delivered and removed, or the clock comes near it",
			ReasonAhead, *maxID, mt.Format(time.RFC3339), FarAhead)}}, dropStaleBound(ctx, db, e, l, tail)
	}
	x := Floor(later(mt, now), interval).Add((Ahead + 1) * interval)
	made, err = reboundTail(ctx, db, e, tail, x)
	return made, nil, err
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func lastHi(l Layout) string {
	if n := len(l.Parts); n > 0 {
		return l.Parts[n-1].HiID
	}
	return "MINVALUE"
}

func loadTx(ctx context.Context, db DB, table outbox.Table) (l Layout, err error) {
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		l, err = Load(ctx, tx, table)
		return err
	})
	return l, err
}

// splitEmptyTail replaces the empty tail by partitions up to target and a
// tail from there, in one transaction: no id is without a partition at any
// commit.
func splitEmptyTail(ctx context.Context, db DB, e Env, tail Part, interval time.Duration, target time.Time) ([]string, error) {
	tx, err := e.begin(ctx, db)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	l, err := Load(ctx, tx, e.Table)
	if err != nil {
		return nil, err
	}
	if l.Tail().Name != tail.Name || !l.Tail().Lo.Equal(tail.Lo) {
		return nil, nil // changed meanwhile
	}
	if _, err := tx.Exec(ctx, "ALTER TABLE "+l.parent()+" DETACH PARTITION "+l.Ident(tail.Name)); err != nil {
		return nil, err
	}
	var rows bool
	if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT FROM "+l.Ident(tail.Name)+")").Scan(&rows); err != nil || rows {
		return nil, err // a write came in: the next round re-bounds it
	}
	if _, err := tx.Exec(ctx, "DROP TABLE "+l.Ident(tail.Name)); err != nil {
		return nil, err
	}
	var made []string
	for lo := tail.Lo; lo.Before(target); lo = lo.Add(interval) {
		name := Name(l.Base, lo)
		if _, err := tx.Exec(ctx, "CREATE TABLE "+l.Ident(name)+" PARTITION OF "+l.parent()+
			" FOR VALUES FROM ("+quote(IDAt(lo))+") TO ("+quote(IDAt(lo.Add(interval)))+")"); err != nil {
			return nil, err
		}
		made = append(made, name)
	}
	if _, err := tx.Exec(ctx, "CREATE TABLE "+l.Ident(TailName(l.Base))+" PARTITION OF "+l.parent()+
		" FOR VALUES FROM ("+quote(IDAt(target))+") TO (MAXVALUE)"); err != nil {
		return nil, err
	}
	return made, tx.Commit(ctx)
}

// reboundTail makes the tail, which holds rows, the partition [its start,
// x) and a new tail from x. ATTACH PARTITION proves the new bound from a
// valid CHECK constraint equal to it instead of scanning the rows under the
// table's lock; the constraint is added NOT VALID (a short lock on the tail
// only) and validated (a scan that blocks no writer) while the tail stays
// attached, then one transaction detaches the tail, attaches it bounded,
// renames it and makes the new tail: the table's lock is held for catalog
// changes only.
//
// Between the first step and the last, the constraint refuses an id past
// x: more than Ahead+1 intervals ahead of the clock, which no writer with a
// sane clock makes. Taking the tail's lock for the whole change instead
// would deadlock with writers (they hold the table's lock, then want the
// tail's), and scanning under the table's lock would stop every writer
// for the length of the scan. A constraint left by a change that did not
// finish is removed at the next round (dropStaleBound).
func reboundTail(ctx context.Context, db DB, e Env, tail Part, x time.Time) ([]string, error) {
	l := Layout{}
	step := func(f func(tx pgx.Tx) error) error {
		tx, err := e.begin(ctx, db)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		if l, err = Load(ctx, tx, e.Table); err != nil {
			return err
		}
		if l.Tail().Name != tail.Name || !l.Tail().Lo.Equal(tail.Lo) {
			return ErrBusy // changed meanwhile
		}
		if err := f(tx); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	check := "CHECK (event_id >= " + quote(tail.LoID) + " AND event_id < " + quote(IDAt(x)) + ")"
	err := step(func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "ALTER TABLE "+l.Ident(tail.Name)+" DROP CONSTRAINT IF EXISTS "+Bound+", ADD CONSTRAINT "+Bound+" "+check+" NOT VALID")
		return err
	})
	if err == nil {
		err = step(func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "ALTER TABLE "+l.Ident(tail.Name)+" VALIDATE CONSTRAINT "+Bound)
			return err
		})
	}
	name := Name(l.Base, tail.Lo)
	if err == nil {
		err = step(func(tx pgx.Tx) error {
			for _, s := range []string{
				"ALTER TABLE " + l.parent() + " DETACH PARTITION " + l.Ident(tail.Name),
				"ALTER TABLE " + l.parent() + " ATTACH PARTITION " + l.Ident(tail.Name) + " FOR VALUES FROM (" + quote(tail.LoID) + ") TO (" + quote(IDAt(x)) + ")",
				"ALTER TABLE " + l.Ident(tail.Name) + " RENAME TO " + pgx.Identifier{name}.Sanitize(),
				"CREATE TABLE " + l.Ident(TailName(l.Base)) + " PARTITION OF " + l.parent() + " FOR VALUES FROM (" + quote(IDAt(x)) + ") TO (MAXVALUE)",
			} {
				if _, err := tx.Exec(ctx, s); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err != nil {
		return nil, err
	}
	return []string{name}, nil
}

// dropStaleBound removes a CHECK constraint left on the tail by a
// re-bounding that did not finish: it would refuse ids past its bound.
func dropStaleBound(ctx context.Context, db DB, e Env, l Layout, tail Part) error {
	var stale bool
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_constraint WHERE conrelid = to_regclass($1) AND conname = $2)", l.Ident(tail.Name), Bound).Scan(&stale)
	})
	if err != nil || !stale {
		return err
	}
	tx, err := e.begin(ctx, db)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, "ALTER TABLE "+l.Ident(tail.Name)+" DROP CONSTRAINT IF EXISTS "+Bound); err != nil {
		return err
	}
	return tx.Commit(ctx)
}
