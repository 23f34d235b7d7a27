package admin

import (
	"context"
	"fmt"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/tablesql"
)

// FindTables returns the outbox tables of db's database, whatever their
// schemas and names: the tables (partitioned ones whole, not their
// partitions) that have every column of an outbox table, in schema and
// name order, each with its Schema set. It reads only the catalog, which
// any role may.
func FindTables(ctx context.Context, db Querier) ([]outbox.Table, error) {
	tables, err := tablesql.FindTables(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("admin: %w", err)
	}
	return tables, nil
}
