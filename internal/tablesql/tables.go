package tablesql

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
)

// outboxColumns are the columns of an outbox table of this design (the
// first migration's, so that a table behind a later one is found too, and
// an adopted NestJS-design table): what FindTables recognises one by.
var outboxColumns = []string{"event_id", "aggregate_type", "aggregate_id", "event_type", "payload", "topic", "partition_key", "created_at", "published_at"}

// inboxColumns are those of an inbox table (its <name>_parked table has no
// processed_at).
var inboxColumns = []string{"consumer", "event_id", "topic", "partition", "offset", "processed_at"}

// FindTables (admin.FindTables) returns the outbox tables of db's database, whatever their
// schemas and names: the tables (partitioned ones whole, not their
// partitions) that have every column of an outbox table, in schema and
// name order, each with its Schema set. It reads only the catalog, which
// any role may.
func FindTables(ctx context.Context, db Querier) ([]outbox.Table, error) {
	return findByShape(ctx, db, outboxColumns)
}

// FindInboxTables returns the inbox tables (package inbox) of db's
// database, found by their columns as FindTables finds outbox tables.
// Their parked records are in <name>_parked.
func FindInboxTables(ctx context.Context, db Querier) ([]outbox.Table, error) {
	return findByShape(ctx, db, inboxColumns)
}

func findByShape(ctx context.Context, db Querier, columns []string) ([]outbox.Table, error) {
	rows, err := db.Query(ctx, `SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
		  AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\_%'
		  AND (SELECT count(*) FROM pg_attribute a
		        WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attname = ANY($1::text[])) = cardinality($1::text[])
		ORDER BY 1, 2`, columns)
	if err != nil {
		return nil, fmt.Errorf("find tables: %w", err)
	}
	tables, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (outbox.Table, error) {
		var t outbox.Table
		err := r.Scan(&t.Schema, &t.Name)
		return t, err
	})
	if err != nil {
		return nil, fmt.Errorf("find tables: %w", err)
	}
	return tables, nil
}

// InboxConsumers returns the consumer names of an inbox table (default
// outbox_inbox): those that applied at least one record, in name order. It
// walks the primary key's index one name at a time, so it reads a few
// pages per consumer, not the table.
func InboxConsumers(ctx context.Context, db Querier, table outbox.Table) ([]string, error) {
	table = sqlname.Inbox(table)
	if err := table.Validate(); err != nil {
		return nil, err
	}
	t := sqlname.Ident(table)
	rows, err := db.Query(ctx, `WITH RECURSIVE c(consumer) AS (
		    (SELECT consumer FROM `+t+` ORDER BY consumer LIMIT 1)
		  UNION ALL
		    SELECT (SELECT i.consumer FROM `+t+` i WHERE i.consumer > c.consumer ORDER BY i.consumer LIMIT 1) FROM c WHERE c.consumer IS NOT NULL
		) SELECT consumer FROM c WHERE consumer IS NOT NULL`)
	if err != nil {
		return nil, fmt.Errorf("consumers of %s: %w", table, err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("consumers of %s: %w", table, err)
	}
	return names, nil
}
