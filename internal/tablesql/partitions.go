package tablesql

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
)

// PartitionKept is a partition of a partitioned table
// (migrations.Partitioned) that stays past its upper bound, and why: the relay's
// last word on it (its comment, which the relay's upkeep writes), or a
// detach left pending.
type PartitionKept struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// partitionNote is the prefix of the comments the relay's upkeep writes
// on the partitions it keeps (relay/internal/partition).
const partitionNote = "fxoutbox: "

// readPartitionsKept lists the partitions of table that the relay keeps,
// from the catalog: nothing for a table that is not partitioned.
func readPartitionsKept(ctx context.Context, db Querier, table outbox.Table) ([]PartitionKept, error) {
	rows, err := db.Query(ctx, "SELECT c.relname, i.inhdetachpending, coalesce(obj_description(c.oid, 'pg_class'), '')"+
		" FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"+
		" WHERE i.inhparent = to_regclass($1) AND (i.inhdetachpending OR obj_description(c.oid, 'pg_class') LIKE $2)"+
		" ORDER BY pg_get_expr(c.relpartbound, c.oid) LIKE '%MINVALUE%' DESC, pg_get_expr(c.relpartbound, c.oid)", sqlname.Ident(table), partitionNote+"%")
	if err != nil {
		return nil, fmt.Errorf("partitions: %w", err)
	}
	var out []PartitionKept
	var name, note string
	var pending bool
	_, err = pgx.ForEachRow(rows, []any{&name, &pending, &note}, func() error {
		reason, _ := strings.CutPrefix(note, partitionNote)
		if pending {
			reason = "detach_pending: a DETACH PARTITION ... CONCURRENTLY stopped half-way: finish it with ALTER TABLE " + sqlname.Ident(table) +
				" DETACH PARTITION " + pgx.Identifier{name}.Sanitize() + " FINALIZE, then drop or attach it again"
		}
		out = append(out, PartitionKept{Name: name, Reason: reason})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("partitions: %w", err)
	}
	return out, nil
}
