package admin

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/locks"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/tablesql"
)

// Rebased is what RebaseCursor did.
type Rebased struct {
	// Marked is the number of rows the old positions had delivered, now
	// marked published so that they are not sent again.
	Marked int64 `json:"marked"`
	// Rewritten is the number of rows not delivered yet whose txid came
	// from the old cluster: they now carry the rebase's own, so the next
	// window delivers them.
	Rewritten int64 `json:"rewritten"`
}

// RebaseCursor carries a cursor table (relay.ProgressCursor) over to the
// cluster it now lives in, after a pg_dump and pg_restore or a move by
// logical replication, when the relay stops with relay.ErrCursorCluster
// (the server's transaction ids are behind the lanes' positions). In one
// transaction, holding every lane's lock (it waits for running relays'
// batches):
//
//   - the rows the old positions had delivered are marked published: the
//     positions' snapshots are the old cluster's, and so are those rows'
//     txids, so the comparison still holds for them. Rows written in the
//     new cluster have higher ids than every id the positions reached, and
//     are left alone;
//   - the rows not delivered whose txid is the old cluster's get the
//     rebase's transaction id, which the next window sees (ids, and so each
//     key's order, are kept);
//   - the positions are dropped; the next relay makes them anew from the
//     first waiting row, as on a first start.
//
// Nothing is lost and nothing delivered is sent again. A pg_upgrade and a
// physical failover keep the transaction ids and need no rebase.
func RebaseCursor(ctx context.Context, db interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}, table outbox.Table) (Rebased, error) {
	var r Rebased
	if err := table.Validate(); err != nil {
		return r, err
	}
	table = table.WithDefaults()
	t, c := sqlname.Ident(table), sqlname.Ident(sqlname.Cursor(table))
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		cursor, err := tablesql.InCursorMode(ctx, tx, table)
		if err != nil {
			return err
		}
		if !cursor {
			return fmt.Errorf("%s has no lanes' positions (%s is missing or empty): nothing to rebase", table, c)
		}
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1, g) FROM generate_series(0, (SELECT max(lanes) FROM "+c+") - 1) g", locks.Namespace(table.String())); err != nil {
			return fmt.Errorf("lock the lanes: %w", err)
		}
		// The highest id the old positions reached: every row at or below
		// it was restored.
		const high = "(SELECT max(greatest(base, pos, top)) FROM " + "%s" + ")"
		top := fmt.Sprintf(high, c)
		delivered := "EXISTS (SELECT FROM " + c + " c WHERE c.lane = " + tablesql.Lane("e.partition_key", "c.lanes") + " AND (pg_visible_in_snapshot(e.txid, c.done)" +
			" OR (c.upto IS NOT NULL AND pg_visible_in_snapshot(e.txid, c.upto) AND (e.id <= greatest(c.pos, c.floor - 1) OR e.id = ANY(c.skip)))))"
		tag, err := tx.Exec(ctx, "UPDATE "+t+" e SET published_at = now() WHERE e.id <= "+top+" AND e.published_at IS NULL AND e.parked_at IS NULL AND "+delivered)
		if err != nil {
			return fmt.Errorf("mark the delivered rows: %w", err)
		}
		r.Marked = tag.RowsAffected()
		tag, err = tx.Exec(ctx, "UPDATE "+t+" e SET txid = pg_current_xact_id() WHERE e.published_at IS NULL AND e.parked_at IS NULL"+
			" AND (e.id <= "+top+" OR e.txid >= pg_snapshot_xmax(pg_current_snapshot()))")
		if err != nil {
			return fmt.Errorf("rewrite the txids of the rows to deliver: %w", err)
		}
		r.Rewritten = tag.RowsAffected()
		if _, err := tx.Exec(ctx, "DELETE FROM "+c); err != nil {
			return fmt.Errorf("drop the positions: %w", err)
		}
		return nil
	})
	if err != nil {
		return r, fmt.Errorf("admin: rebase the cursor of %s: %w", table, err)
	}
	return r, nil
}
