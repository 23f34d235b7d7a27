package tablesql

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
)

// InCursorMode reports whether table's relays record cursor progress
// (relay.ProgressCursor): its positions table exists and holds the lanes'
// rows. Its rows are then never marked published, and what was delivered is
// read from the positions.
func InCursorMode(ctx context.Context, db Querier, table outbox.Table) (bool, error) {
	exists, err := hasCursor(ctx, db, table)
	if err != nil || !exists {
		return false, err
	}
	rows, err := db.Query(ctx, "SELECT EXISTS (SELECT FROM "+sqlname.Ident(sqlname.Cursor(table))+")")
	if err != nil {
		return false, err
	}
	return pgx.CollectExactlyOneRow(rows, pgx.RowTo[bool])
}

// hasCursor reports whether table has the cursor migration: its
// positions table exists.
func hasCursor(ctx context.Context, db Querier, table outbox.Table) (bool, error) {
	if err := table.Validate(); err != nil {
		return false, err
	}
	rows, err := db.Query(ctx, "SELECT to_regclass($1) IS NOT NULL", sqlname.Ident(sqlname.Cursor(table)))
	if err != nil {
		return false, err
	}
	return pgx.CollectExactlyOneRow(rows, pgx.RowTo[bool])
}

// ForCursor reports whether table has the cursor migration (migrated)
// and whether relay.ProgressAuto records cursor progress on it (cursor):
// migrated, and either a relay recorded cursor progress on it
// (InCursorMode), or migrations.Install made it with the migration
// (sqlname.CursorFromStart), or it is partitioned (its relays record
// cursor progress only). A table that was given the cursor migration
// later, and has had no cursor relay yet, is left to marks: its marks
// relays may still be delivering the events written before it.
func ForCursor(ctx context.Context, db Querier, table outbox.Table) (migrated, cursor bool, err error) {
	if migrated, err = hasCursor(ctx, db, table); err != nil || !migrated {
		return migrated, false, err
	}
	c := sqlname.Ident(sqlname.Cursor(table))
	rows, err := db.Query(ctx, "SELECT EXISTS (SELECT FROM "+c+") OR coalesce(obj_description($1::regclass, 'pg_class') = $2, false)"+
		" OR (SELECT relkind = 'p' FROM pg_class WHERE oid = $3::regclass)", c, sqlname.CursorFromStart, sqlname.Ident(table))
	if err != nil {
		return true, false, err
	}
	cursor, err = pgx.CollectExactlyOneRow(rows, pgx.RowTo[bool])
	return true, cursor, err
}

// ParkedRows says where a table's parked events are, for the statements
// that read or change them: in cursor mode, once the parked table exists
// (sqlname.Parked), each is a row of that table; otherwise a row of
// the table itself with parked_at set.
type ParkedRows struct {
	// Table is the table that holds them.
	Table outbox.Table
	// Where is the condition that selects them in Table.
	Where string
	// Reason is the column of their stable reason ("[<error.type>] ..."),
	// and LastError the column of their last error (in place, the same).
	Reason, LastError string
	// Moved says they are in the parked table (cursor mode).
	Moved bool
}

// ParkedIn returns where table's parked events are (see ParkedRows).
func ParkedIn(ctx context.Context, db Querier, table outbox.Table) (ParkedRows, error) {
	inPlace := ParkedRows{Table: table, Where: "parked_at IS NOT NULL", Reason: "last_error", LastError: "last_error"}
	cursor, err := InCursorMode(ctx, db, table)
	if err != nil || !cursor {
		return inPlace, err
	}
	p := sqlname.Parked(table)
	rows, err := db.Query(ctx, "SELECT to_regclass($1) IS NOT NULL", sqlname.Ident(p))
	if err != nil {
		return inPlace, err
	}
	exists, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[bool])
	if err != nil || !exists {
		// The cursor migration's parked table is missing: relays of an
		// older version park in place.
		return inPlace, err
	}
	return ParkedRows{Table: p, Where: "true", Reason: "reason", LastError: "last_error", Moved: true}, nil
}

// Delivered is the condition, on a row of table (unqualified columns), that
// its lane's done snapshot holds it, or that it is marked published. It
// errs on the side of "not yet": a row delivered in its lane's open window
// is not counted.
func Delivered(table outbox.Table) string {
	return "(published_at IS NOT NULL OR EXISTS (SELECT FROM " + sqlname.Ident(sqlname.Cursor(table)) + " c" +
		" WHERE c.lane = " + Lane("partition_key", "c.lanes") + " AND pg_visible_in_snapshot(txid, c.done)))"
}

// cursorWaiting selects the ids of the rows some lane has yet to deliver:
// those not in the lane's done snapshot, less those its open window
// delivered (at or below its start, or in its skip list). The candidates
// come from the (txid, id) index: rows of the transactions past the lowest
// xmax of the done snapshots (up to the statement's own, a range the
// planner takes the index for), and, one index probe each, those of the
// transactions below it in a done snapshot's xip list, so that no row is
// selected twice. The rows' unpublished condition is written so that the
// planner cannot match it to the unpublished partial index: in cursor mode
// that index holds every row the table keeps, delivered or not, and
// reading it whole cost every read of the counts (the relay's gauges, once
// a second) the table's size.
func cursorWaiting(table outbox.Table) string {
	t, c := sqlname.Ident(table), sqlname.Ident(sqlname.Cursor(table))
	// Each row meets its lane's position by a join on the lane (computed
	// once per row), not by subscripts into arrays of the positions.
	waiting := func(from, txid string) string {
		return "(SELECT e.id FROM " + from + " JOIN c ON c.lane = " + Lane("e.partition_key", "(SELECT lanes FROM k)") +
			" WHERE " + txid + " AND NOT pg_visible_in_snapshot(e.txid, c.done)" +
			" AND NOT coalesce(pg_visible_in_snapshot(e.txid, c.upto) AND (e.id <= c.start OR e.id = ANY(c.skip)), false)" +
			" AND coalesce(e.published_at, e.parked_at) IS NULL)"
	}
	// A probe is written as a range of one value: the planner prices a
	// range of parameters by a default selectivity and takes the index,
	// where "txid = x.xid" is priced by the table's statistics, and on a
	// table whose rows came from a few large transactions (a bulk load)
	// became a scan of the table per probe
	// (TestCursorCountsReadOnlyTheWaitingRows: 2,678 buffers).
	byXip := "unnest((SELECT xips FROM k)::xid8[]) x(xid) CROSS JOIN LATERAL (SELECT * FROM " + t + " e WHERE e.txid >= x.xid AND e.txid <= x.xid OFFSET 0) e"
	return "WITH c AS MATERIALIZED (SELECT lane, lanes, done, upto, greatest(pos, floor - 1) AS start, skip FROM " + c + ")," +
		" k AS MATERIALIZED (SELECT (SELECT max(lanes) FROM c) AS lanes," +
		" coalesce((SELECT array_agg(DISTINCT x) FROM c, pg_snapshot_xip(c.done) x), '{}') AS xips," +
		" (SELECT min(pg_snapshot_xmax(done)) FROM c) AS xmax)" +
		" " + waiting(t+" e", "e.txid >= (SELECT xmax FROM k) AND e.txid < pg_snapshot_xmax(pg_current_snapshot())") +
		" UNION ALL " + waiting(byXip, "x.xid < (SELECT xmax FROM k)")
}

// readCursorCounts is readCounts for a table in cursor mode.
func readCursorCounts(ctx context.Context, db Querier, table outbox.Table) (Counts, error) {
	var c Counts
	var ageSec float64
	p, err := ParkedIn(ctx, db, table)
	if err != nil {
		return c, err
	}
	// The waiting rows' ids only: their count, and the lowest, whose row
	// gives the oldest age.
	rows, err := db.Query(ctx, "WITH w AS MATERIALIZED (SELECT id FROM ("+cursorWaiting(table)+") u)"+
		" SELECT (SELECT count(*) FROM (SELECT 1 FROM w LIMIT @cap) b),"+
		" o.created_at, coalesce(extract(epoch FROM now() - o.created_at)::float8, 0),"+
		" (SELECT count(*) FROM "+sqlname.Ident(p.Table)+" WHERE "+p.Where+")"+
		" FROM (SELECT 1) one LEFT JOIN LATERAL (SELECT created_at FROM "+sqlname.Ident(table)+" WHERE id = (SELECT min(id) FROM w)) o ON true",
		pgx.NamedArgs{"cap": BacklogCap})
	if err != nil {
		return c, err
	}
	if _, err := pgx.ForEachRow(rows, []any{&c.Backlog, &c.OldestCreatedAt, &ageSec, &c.Parked}, func() error { return nil }); err != nil {
		return c, fmt.Errorf("cursor counts: %w", err)
	}
	c.finish(ageSec)
	return c, nil
}

// Lane is the SQL expression of the lane of partition key key among lanes
// lanes, the one lane function of the relay, the cursor's positions, the
// partitions' upkeep and admin (hashtext is stable across servers and
// versions, PostgreSQL 12+).
func Lane(key, lanes string) string {
	return "((hashtext(" + key + ") & 2147483647) % " + lanes + ")"
}
