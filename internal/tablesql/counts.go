// Package tablesql holds the SQL over an outbox table that the relay and
// package admin share, so that admin's public API does not constrain the
// relay's internals: the counts behind the relay's gauges and Stats and
// admin.ReadStatus.
package tablesql

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

// Querier runs statements: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// ErrNotFound is admin.ErrNotFound: no such event or parked record.
var ErrNotFound = errors.New("no such event")

// DefaultLimit is admin.DefaultLimit: the rows a listing returns when its
// limit is 0.
const DefaultLimit = 100

// BacklogCap is the most unpublished events ReadCounts counts, so a huge
// backlog costs a bounded scan (admin.Status.Backlog stops there too).
const BacklogCap = 1000000

// Counts is what the partial indexes say of a table: its backlog, the
// oldest waiting event and its parked events.
type Counts struct {
	// Backlog is the number of unpublished, unparked events, counted up
	// to BacklogCap; BacklogCapped says the count stopped there.
	Backlog       int64 `json:"backlog"`
	BacklogCapped bool  `json:"backlog_capped"`
	// OldestCreatedAt is when the oldest unpublished, unparked event (by
	// id, the one the relays take first) was written; nil when there is none.
	OldestCreatedAt *time.Time `json:"oldest_created_at"`
	// OldestAge is its age, 0 when there is none and never negative (a
	// created_at in the future, from clocks or a hand-written row, counts
	// as 0: compare OldestCreatedAt with the time to find one).
	OldestAge time.Duration `json:"-"`
	// OldestInFuture says OldestCreatedAt is ahead of the database's clock.
	OldestInFuture bool `json:"oldest_in_future"`
	// Parked is the number of parked events.
	Parked int64 `json:"parked"`
	// PartitionsKept are, for a partitioned table, the partitions past
	// their upper bound that the relay keeps, with why.
	PartitionsKept []PartitionKept `json:"partitions_kept,omitempty"`
}

// ReadCounts reads a table's Counts in one statement that reads only the
// partial indexes on unpublished and on parked rows, or, for a table in
// cursor mode (see InCursorMode), the rows the lanes' positions say are
// waiting, through the (txid, id) index, and the parked table (see
// ParkedIn). The relay's Stats and
// backlog gauges use it, as does admin.ReadStatus.
func ReadCounts(ctx context.Context, db Querier, table outbox.Table) (Counts, error) {
	if err := table.Validate(); err != nil {
		return Counts{}, err
	}
	c, err := readCounts(ctx, db, table)
	if err == nil {
		c.PartitionsKept, err = readPartitionsKept(ctx, db, table)
	}
	if err != nil {
		return c, fmt.Errorf("counts of %s: %w", table, err)
	}
	return c, nil
}

func readCounts(ctx context.Context, db Querier, table outbox.Table) (Counts, error) {
	if cursor, err := InCursorMode(ctx, db, table); err != nil {
		return Counts{}, err
	} else if cursor {
		return readCursorCounts(ctx, db, table)
	}
	var c Counts
	var ageSec float64
	t := sqlname.Ident(table)
	rows, err := db.Query(ctx, "SELECT (SELECT count(*) FROM (SELECT 1 FROM "+t+" WHERE published_at IS NULL AND parked_at IS NULL LIMIT @cap) b),"+
		" o.created_at, coalesce(extract(epoch FROM now() - o.created_at)::float8, 0),"+
		" (SELECT count(*) FROM "+t+" WHERE parked_at IS NOT NULL)"+
		" FROM (SELECT 1) one LEFT JOIN LATERAL (SELECT created_at FROM "+t+
		" WHERE published_at IS NULL AND parked_at IS NULL ORDER BY id LIMIT 1) o ON true",
		pgx.NamedArgs{"cap": BacklogCap})
	if err != nil {
		return c, err
	}
	if _, err := pgx.ForEachRow(rows, []any{&c.Backlog, &c.OldestCreatedAt, &ageSec, &c.Parked}, func() error { return nil }); err != nil {
		return c, err
	}
	c.finish(ageSec)
	return c, nil
}

// finish sets the fields that follow from the backlog and the oldest
// waiting event's age (seconds, negative when it is in the future).
func (c *Counts) finish(ageSec float64) {
	c.BacklogCapped = c.Backlog >= BacklogCap
	c.OldestInFuture = ageSec < 0
	c.OldestAge = time.Duration(max(0, ageSec) * float64(time.Second))
}

// ErrorTypeSQL is the cause the relay records at the start of last_error,
// "[<error.type>] <message>", or _OTHER.
const ErrorTypeSQL = "coalesce(substring(last_error FROM '^\\[([a-z0-9_.]{1,64})\\] '), '" + ErrorTypeOther + "')"

// ErrorTypeOf is ErrorTypeSQL on the column col (a parked table's reason).
func ErrorTypeOf(col string) string {
	return "coalesce(substring(" + col + " FROM '^\\[([a-z0-9_.]{1,64})\\] '), '" + ErrorTypeOther + "')"
}

// ErrorTypeOther is the error type of parked events whose error was
// recorded without one (by older versions, or by hand).
const ErrorTypeOther = "_OTHER"

// ParkedCount is the number of parked events of one topic and error type.
type ParkedCount struct {
	Topic     string `json:"topic"`
	ErrorType string `json:"error_type"`
	Count     int64  `json:"count"`
}

// CountParkedByType counts a table's parked events by topic and error type,
// largest first, at most limit groups, reading only the partial index on
// parked rows, or in cursor mode the parked table (see ParkedIn). The
// relay's parked gauge uses it.
func CountParkedByType(ctx context.Context, db Querier, table outbox.Table, limit int) ([]ParkedCount, error) {
	if err := table.Validate(); err != nil {
		return nil, err
	}
	p, err := ParkedIn(ctx, db, table)
	if err != nil {
		return nil, fmt.Errorf("count parked events of %s: %w", table, err)
	}
	rows, err := db.Query(ctx, "SELECT coalesce(topic, ''), "+ErrorTypeOf(p.Reason)+", count(*) FROM "+sqlname.Ident(p.Table)+
		" WHERE "+p.Where+" GROUP BY 1, 2 ORDER BY 3 DESC, 1, 2 LIMIT $1", limit)
	if err != nil {
		return nil, fmt.Errorf("count parked events of %s: %w", table, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ParkedCount, error) {
		var p ParkedCount
		err := r.Scan(&p.Topic, &p.ErrorType, &p.Count)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("count parked events of %s: %w", table, err)
	}
	return out, nil
}
