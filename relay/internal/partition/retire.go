package partition

import (
	"context"
	"errors"
	"fmt"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/tablesql"
	"time"

	"github.com/jackc/pgx/v5"
)

// Retire drops the oldest partitions, in order, while each is past
// Retention since its upper bound and every lane delivered every row of it
// (none parked): one transaction detaches it, checks it again (a row found
// undelivered rolls the detach back, which re-attaches it), widens the head
// to its upper bound (the ids below the oldest partition keep one: events
// inserted again with their old ids go there) and drops it. It returns the
// partitions it dropped and, for each partition whose upper bound has
// passed and that stays, why; it writes that reason as the partition's
// comment, which status reads.
//
// DETACH ... CONCURRENTLY is not used: the head cannot be widened without
// a plain DETACH (a lock on the table for the length of a catalog change),
// and between a concurrent detach and that widening the detached range
// would have no partition. One transaction keeps every id covered.
func Retire(ctx context.Context, db DB, e Env, now time.Time) (dropped []string, kept []Kept, err error) {
	defer func() { err = e.explain(err) }()
	if e.Retention < 0 {
		return nil, nil, nil
	}
	l, err := loadTx(ctx, db, e.Table)
	if err != nil || !l.Partitioned {
		return nil, nil, err
	}
	older := ""
	for _, p := range l.Parts {
		if p.Head() || p.Tail() || p.Hi.After(now) {
			continue
		}
		reason := ""
		switch {
		case p.Hi.Add(e.Retention).After(now):
			reason = fmt.Sprintf("%s: Retention (%s) has not passed since its upper bound; it goes after %s", ReasonRetention, e.Retention, p.Hi.Add(e.Retention).Format(time.RFC3339))
		case older != "":
			reason = fmt.Sprintf("%s: the older partition %s stays, and partitions go oldest first", ReasonOlder, older)
		default:
			err = e.run(ctx, db, func(tx pgx.Tx) (err error) {
				reason, err = e.blocker(ctx, tx, l.Ident(p.Name))
				return err
			})
			if err != nil {
				return dropped, kept, fmt.Errorf("partitions of %s: check %s: %w", e.Table, p.Name, err)
			}
			if reason == "" {
				reason, err = e.drop(ctx, db, p)
				if errors.Is(err, ErrBusy) {
					return dropped, kept, nil
				}
				if err != nil {
					return dropped, kept, fmt.Errorf("partitions of %s: drop %s: %w", e.Table, p.Name, err)
				}
				if reason == "" {
					dropped = append(dropped, p.Name)
					continue
				}
			}
		}
		older = p.Name
		kept = append(kept, Kept{p.Name, reason})
		if err := e.noteTx(ctx, db, l, p, reason); err != nil {
			return dropped, kept, err
		}
	}
	return dropped, kept, nil
}

func (e Env) noteTx(ctx context.Context, db DB, l Layout, p Part, note string) error {
	return e.run(ctx, db, func(tx pgx.Tx) error { return Note(ctx, tx, l, p, note) })
}

// blocker says why the rows of partition ident (qualified) keep it, "" when
// nothing does. A row is delivered when its lane's done snapshot sees its
// transaction: every row of a transaction below the lowest xmin of the
// lanes' done snapshots is, so only the rest is read, through the (txid,
// id) index.
func (e Env) blocker(ctx context.Context, q Querier, ident string) (string, error) {
	c := sqlname.Ident(e.Cursor)
	var parked int64
	var lane *int64
	err := q.QueryRow(ctx, "WITH k AS MATERIALIZED (SELECT min(pg_snapshot_xmin(done)) AS xmin, max(lanes) AS lanes FROM "+c+")"+
		" SELECT (SELECT count(*) FROM "+ident+" WHERE parked_at IS NOT NULL),"+
		" (SELECT coalesce("+tablesql.Lane("e.partition_key", "(SELECT lanes FROM k)")+", -1) FROM "+ident+" e"+
		" WHERE (e.txid IS NULL OR e.txid >= coalesce((SELECT xmin FROM k), '0'::xid8)) AND e.parked_at IS NULL AND NOT "+e.Delivered+" ORDER BY e.id LIMIT 1)"+
		" FROM (SELECT 1) one").Scan(&parked, &lane)
	if errors.Is(err, pgx.ErrNoRows) {
		err = nil
	}
	switch {
	case err != nil:
		return "", err
	case parked > 0:
		return fmt.Sprintf("%s: it holds %d parked events: requeue or delete them (outboxctl parked)", ReasonParked, parked), nil
	case lane == nil:
		return "", nil
	case *lane < 0:
		return fmt.Sprintf("%s: no lane has a position yet (no cursor relay has run)", ReasonUndelivered), nil
	default:
		return fmt.Sprintf("%s: rows of lane %d are not delivered yet", ReasonUndelivered, *lane), nil
	}
}

// drop retires partition p, the oldest, in one transaction; it returns why
// not when p stays.
func (e Env) drop(ctx context.Context, db DB, p Part) (string, error) {
	if err := e.boundHead(ctx, db); err != nil {
		if lockTimedOut(err) {
			return fmt.Sprintf("%s: the head's CHECK constraint waited longer than %s for its lock; tried again next round", ReasonLockTimeout, e.LockTimeout), nil
		}
		return "", err
	}
	tx, err := e.begin(ctx, db)
	if err != nil {
		return "", err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	l, err := Load(ctx, tx, e.Table)
	if err != nil {
		return "", err
	}
	head := l.Head()
	if head.Name == "" || len(l.Parts) < 2 || l.Parts[1].Name != p.Name || head.HiID != p.LoID {
		return "", ErrBusy // not the oldest any more: changed meanwhile
	}
	if _, err := tx.Exec(ctx, "ALTER TABLE "+l.parent()+" DETACH PARTITION "+l.Ident(p.Name)); err != nil {
		if lockTimedOut(err) {
			return fmt.Sprintf("%s: DETACH PARTITION waited longer than %s for the table's lock (a long transaction on the table?); tried again next round", ReasonLockTimeout, e.LockTimeout), nil
		}
		return "", err
	}
	// Detached, it takes no row: check it again, with its rows final.
	reason, err := e.blocker(ctx, tx, l.Ident(p.Name))
	if err != nil || reason != "" {
		return reason, err // the rollback attaches it again
	}
	for _, s := range []string{
		"ALTER TABLE " + l.parent() + " DETACH PARTITION " + l.Ident(head.Name),
		"ALTER TABLE " + l.parent() + " ATTACH PARTITION " + l.Ident(head.Name) + " FOR VALUES FROM (MINVALUE) TO (" + quote(p.HiID) + ")",
		"ALTER TABLE " + l.Ident(head.Name) + " DROP CONSTRAINT IF EXISTS " + Bound + ", ADD CONSTRAINT " + Bound + " CHECK (event_id < " + quote(p.HiID) + ") NOT VALID",
		"DROP TABLE " + l.Ident(p.Name),
	} {
		if _, err := tx.Exec(ctx, s); err != nil {
			return "", err
		}
	}
	return "", tx.Commit(ctx)
}

// boundHead gives the head a valid CHECK constraint equal to its bound, so
// that attaching it with a wider bound reads none of its rows: added NOT
// VALID (a short lock on the head only), then validated (a scan that
// blocks no writer).
func (e Env) boundHead(ctx context.Context, db DB) error {
	l, err := loadTx(ctx, db, e.Table)
	if err != nil {
		return err
	}
	head := l.Head()
	if head.Name == "" {
		return fmt.Errorf("no partition from MINVALUE: make one (docs/partitions.md)")
	}
	var def *string
	var valid bool
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, "SELECT pg_get_constraintdef(oid), convalidated FROM pg_constraint WHERE conrelid = to_regclass($1) AND conname = $2",
			l.Ident(head.Name), Bound).Scan(&def, &valid)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return err
	})
	if err != nil {
		return err
	}
	for _, s := range []string{
		"ALTER TABLE " + l.Ident(head.Name) + " DROP CONSTRAINT IF EXISTS " + Bound + ", ADD CONSTRAINT " + Bound + " CHECK (event_id < " + quote(head.HiID) + ") NOT VALID",
		"ALTER TABLE " + l.Ident(head.Name) + " VALIDATE CONSTRAINT " + Bound,
	} {
		if def != nil && (valid || s[len(s)-9:] == "NOT VALID") {
			continue // there (and valid): nothing to add, or to validate
		}
		tx, err := e.begin(ctx, db)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, s); err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
	}
	return nil
}
