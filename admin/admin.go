package admin

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/tablesql"
)

// Querier runs statements: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

var (
	// ErrNotFound is returned by GetParked for an event id that is not in
	// the table (never written, or already deleted).
	ErrNotFound = tablesql.ErrNotFound
	// ErrNotParked is returned by GetParked for an event that exists but is
	// not parked: waiting to be published, or published.
	ErrNotParked = errors.New("event is not parked")
	// ErrNoFilter is returned by Requeue, Delete and Replay when the filter
	// has no condition and All is not set: acting on every row needs saying
	// so.
	ErrNoFilter = errors.New("no filter: name event ids or conditions, or set Filter.All to act on every row")
)

// DefaultLimit is the number of events ListParked returns when
// Filter.Limit is 0.
const DefaultLimit = tablesql.DefaultLimit

// Filter selects events. Conditions combine with AND; the zero Filter
// matches every row of the state the function works on (parked, or
// published for Replay), which Requeue, Delete and Replay accept only with
// All set.
type Filter struct {
	// EventIDs matches these events only. Default: any.
	EventIDs []uuid.UUID
	// Topic matches the event's topic exactly. Default: any.
	Topic string
	// Type matches the event type exactly (e.g. "order.created.v1").
	// Default: any.
	Type string
	// Key matches the partition key exactly. Default: any.
	Key string
	// Since matches events written (created_at) at or after it. Default: any.
	Since time.Time
	// Until matches events written before it. Default: any.
	Until time.Time
	// Error matches events whose last error contains it, ignoring case.
	// Default: any.
	Error string
	// FromID and ToID bound the table's row ids (the id column, in write
	// order), both inclusive; zero means unbounded. Default 0.
	FromID, ToID int64
	// After is the paging cursor: only rows whose id is greater. To get the
	// next page of ListParked, set it to the last event's ID. Default 0.
	After int64
	// Limit is the most events to return (ListParked; default DefaultLimit)
	// or to change (Requeue, Delete, Replay; default 0, no limit).
	Limit int
	// All lets Requeue, Delete and Replay act without any other condition.
	// Default false.
	All bool
}

// Empty reports whether f has no condition (Limit and All are not
// conditions): Requeue, Delete and Replay then need All.
func (f Filter) Empty() bool {
	return len(f.EventIDs) == 0 && f.Topic == "" && f.Type == "" && f.Key == "" && f.Since.IsZero() &&
		f.Until.IsZero() && f.Error == "" && f.FromID == 0 && f.ToID == 0 && f.After == 0
}

func (f Filter) validate() error {
	switch {
	case f.Limit < 0:
		return &outbox.ConfigError{Field: "Filter.Limit", Reason: fmt.Sprintf("is %d: use 0 (the default) or more", f.Limit)}
	case f.FromID < 0 || f.ToID < 0 || f.After < 0:
		return &outbox.ConfigError{Field: "Filter.FromID/ToID/After", Reason: "must not be negative"}
	case f.ToID != 0 && f.FromID > f.ToID:
		return &outbox.ConfigError{Field: "Filter.FromID", Reason: fmt.Sprintf("%d is above ToID %d", f.FromID, f.ToID)}
	case !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until):
		return &outbox.ConfigError{Field: "Filter.Since", Reason: fmt.Sprintf("%s is not before Until %s", f.Since.Format(time.RFC3339), f.Until.Format(time.RFC3339))}
	}
	return nil
}

// where returns the filter's conditions, each preceded by " AND ", and
// sets their arguments.
func (f Filter) where(args pgx.NamedArgs) string { return f.whereErr(args, "last_error") }

// whereErr is where with errExpr the text that Filter.Error searches.
func (f Filter) whereErr(args pgx.NamedArgs, errExpr string) string {
	return f.conditions().Where(args, errExpr)
}

// conditions are f's conditions on the rows, as SQL builds them.
func (f Filter) conditions() tablesql.Filter {
	return tablesql.Filter{EventIDs: f.EventIDs, Topic: f.Topic, Type: f.Type, Key: f.Key, Since: f.Since, Until: f.Until,
		Error: f.Error, FromID: f.FromID, ToID: f.ToID}
}

// BulkOptions tunes Requeue, Delete and Replay. A nil *BulkOptions means
// the defaults.
type BulkOptions struct {
	// ChunkSize is the most rows one statement changes, 1-100000. Default
	// 1000.
	ChunkSize int
	// Progress, if set, is called after each chunk with the number of rows
	// changed so far. Default nil.
	Progress func(done int)
}

func (o *BulkOptions) withDefaults() (BulkOptions, error) {
	var c BulkOptions
	if o != nil {
		c = *o
	}
	if c.ChunkSize == 0 {
		c.ChunkSize = 1000
	}
	if c.ChunkSize < 1 || c.ChunkSize > 100000 {
		return c, &outbox.ConfigError{Field: "BulkOptions.ChunkSize", Reason: fmt.Sprintf("is %d: use 1 to 100000 (default 1000)", c.ChunkSize)}
	}
	return c, nil
}

// state is the condition that selects the rows an operation works on.
type state string

const (
	parked    state = "parked_at IS NOT NULL"
	published state = "published_at IS NOT NULL"
)

// rel is the rows an operation works on: those of table in state, whose
// Filter.Error searches errExpr.
type rel struct {
	table   outbox.Table
	st      state
	errExpr string
}

// in is the rows of table in state st.
func in(table outbox.Table, st state) rel { return rel{table: table, st: st, errExpr: "last_error"} }

// parkedRel is the parked events of a table, where they are (in their rows,
// or in cursor mode in the parked table: see tablesql.ParkedIn).
func parkedRel(p tablesql.ParkedRows) rel {
	r := rel{table: p.Table, st: state(p.Where), errExpr: p.LastError}
	if p.Moved {
		r.errExpr = "coalesce(reason, '') || ' ' || coalesce(last_error, '')"
	}
	return r
}

// count returns how many rows of r match f (at most f.Limit, when set).
func count(ctx context.Context, db Querier, r rel, f Filter) (int, error) {
	if err := r.table.Validate(); err != nil {
		return 0, err
	}
	if err := f.validate(); err != nil {
		return 0, err
	}
	args := pgx.NamedArgs{"after": f.After}
	sql := "SELECT id FROM " + sqlname.Ident(r.table) + " WHERE " + string(r.st) + " AND id > @after" + f.whereErr(args, r.errExpr)
	if f.Limit > 0 {
		sql += " LIMIT @limit"
		args["limit"] = f.Limit
	}
	rows, err := db.Query(ctx, "SELECT count(*) FROM ("+sql+") m", args)
	if err != nil {
		return 0, err
	}
	return pgx.CollectExactlyOneRow(rows, pgx.RowTo[int])
}

// cursorState returns st as it reads on a table in cursor mode
// (relay.ProgressCursor): the rows are never marked published, so
// published means delivered (its lane's done snapshot holds it).
//
// On such a table a row behind the lanes' positions is never read again:
// Replay gives it the operation's own transaction id (txid =
// pg_current_xact_id()), and Requeue writes it back into the table with a
// new id (and that txid), so that the next window of its lane takes it.
func cursorState(table outbox.Table, st state) state {
	if st == published {
		return state(tablesql.Delivered(table))
	}
	return st
}

// updateRows is bulk's change of the chunk's rows (c, ids only) of r by
// the SET clause change; "" deletes them. The statement re-checks the state
// on each row it changes, so a row that changed state meanwhile (requeued
// and published, say) is left alone.
func updateRows(r rel, change string) string {
	if change == "" {
		return "u AS (DELETE FROM " + sqlname.Ident(r.table) + " e USING c WHERE e.id = c.id AND " + string(r.st) + " RETURNING 1)"
	}
	return "u AS (UPDATE " + sqlname.Ident(r.table) + " e SET " + change + " FROM c WHERE e.id = c.id AND " + string(r.st) + " RETURNING 1)"
}

// bulk changes the rows of r that match f, ChunkSize at a time in id
// order, with change, the statements (CTEs, the last one named u) that
// change a chunk: the chunk's ids are in c, and u returns a row per row
// changed (see updateRows). It returns how many rows it changed; on an error,
// those changed before it.
func bulk(ctx context.Context, db Querier, r rel, change string, f Filter, opts *BulkOptions) (int, error) {
	if err := r.table.Validate(); err != nil {
		return 0, err
	}
	if err := f.validate(); err != nil {
		return 0, err
	}
	if f.Empty() && !f.All {
		return 0, ErrNoFilter
	}
	o, err := opts.withDefaults()
	if err != nil {
		return 0, err
	}
	args := pgx.NamedArgs{}
	// c picks the next chunk; c's last id moves the cursor on.
	sql := "WITH c AS (SELECT id FROM " + sqlname.Ident(r.table) + " WHERE " + string(r.st) + " AND id > @after" + f.whereErr(args, r.errExpr) +
		" ORDER BY id LIMIT @chunk), " + change +
		" SELECT (SELECT max(id) FROM c), (SELECT count(*) FROM u)::int"
	done := 0
	after := f.After
	for f.Limit == 0 || done < f.Limit {
		if err := ctx.Err(); err != nil {
			return done, err
		}
		chunk := o.ChunkSize
		if f.Limit > 0 {
			chunk = min(chunk, f.Limit-done)
		}
		args["after"], args["chunk"] = after, chunk
		var last *int64
		var n int
		rows, err := db.Query(ctx, sql, args)
		if err != nil {
			return done, err
		}
		if _, err := pgx.ForEachRow(rows, []any{&last, &n}, func() error { return nil }); err != nil {
			return done, err
		}
		if last == nil {
			break
		}
		after = *last
		done += n
		if o.Progress != nil {
			o.Progress(done)
		}
	}
	return done, nil
}
