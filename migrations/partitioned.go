package migrations

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
)

// PartitionedFS holds the partitioned table's migration, in the folder
// partitioned/ (golang-migrate's layout, for the default table), with
// partitioned/goose and partitioned/tern beside it. It creates the outbox
// table partitioned by range of event_id (UUIDv7, so by time), with the
// columns of the outbox migrations 1 to 3 and the cursor migration's txid:
// for new installs that relay with cursor progress (relay.ProgressCursor)
// and retire whole partitions instead of deleting rows. Run the cursor
// migration (migrations/cursor/, [UpCursor]) after it: it adds the lanes'
// positions and whatever the cursor set gains later. Point golang-migrate at
// the folder with a version table of its own (e.g.
// x-migrations-table=outbox_event_partitioned_migrations), or call
// [UpPartitioned]. docs/partitions.md says more.
//
//go:embed partitioned/*.sql
var PartitionedFS embed.FS

var partitionedSet = set{fsys: PartitionedFS, dir: "partitioned", defaults: outbox.Table.WithDefaults, render: Render,
	hint: "apply the partitioned migration (migrations.UpPartitioned, or the SQL files in migrations/partitioned/ and then migrations/cursor/)", versions: "partitioned_"}

// DefaultPartitionInterval is the span of one partition that the
// partitioned migration creates when it is given none.
const DefaultPartitionInterval = 24 * time.Hour

// intervalMarker is the line of the partitioned migration that holds its
// interval: [UpPartitioned] replaces it.
const intervalMarker = "interval '1 day'; -- fxoutbox:interval"

// AllPartitioned returns the partitioned migration rendered for table.
func AllPartitioned(table outbox.Table) ([]Migration, error) { return partitionedSet.all(table) }

// GoosePartitioned is [Goose] for the partitioned migration: its version
// table is <name>_partitioned_goose_version. Run [GooseCursor] after it.
func GoosePartitioned(table outbox.Table) (fsys fs.FS, versionTable string, err error) {
	return renderSet(partitionedSet, table, "goose", gooseFile)
}

// TernPartitioned is [Tern] for the partitioned migration: its version
// table is <name>_partitioned_tern_version. Run [TernCursor] after it.
func TernPartitioned(table outbox.Table) (fsys fs.FS, versionTable string, err error) {
	return renderSet(partitionedSet, table, "tern", ternFile)
}

// UpPartitioned creates table partitioned (see [PartitionedFS]), one
// partition per interval (0: [DefaultPartitionInterval]; a whole number of
// minutes, at least one), records the outbox migrations 1 to 3 as applied
// in <name>_migrations (the table has their columns, so [Up] finds nothing
// to do), and applies the cursor migration ([UpCursor]). It is idempotent:
// a partitioned table of that name is kept as it is (its interval too). A
// table of that name that is not partitioned is an error: see
// docs/partitions.md, "An existing table".
func UpPartitioned(ctx context.Context, db DB, table outbox.Table, interval time.Duration) error {
	table = table.WithDefaults()
	if interval == 0 {
		interval = DefaultPartitionInterval
	}
	if interval < time.Minute || interval%time.Minute != 0 {
		return &outbox.ConfigError{Field: "interval", Reason: fmt.Sprintf("%s is not a whole number of minutes of at least one: partitions are named by the minute", interval)}
	}
	all, err := partitionedSet.all(table)
	if err != nil {
		return err
	}
	outboxAll, err := outboxSet.all(table)
	if err != nil {
		return err
	}
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		applied, err := prepare(ctx, tx, table)
		if err != nil {
			return err
		}
		for _, m := range all {
			up := strings.Replace(m.Up, intervalMarker, fmt.Sprintf("interval '%d minutes';", interval/time.Minute), 1)
			if _, err := tx.Exec(ctx, up); err != nil {
				return fmt.Errorf("migrations: apply %06d_%s (partitioned) to %s: %w", m.Version, m.Name, table, err)
			}
		}
		return recordOutboxVersions(ctx, tx, table, outboxAll, applied)
	})
	if err != nil {
		return err
	}
	return UpCursor(ctx, db, table)
}

// recordOutboxVersions records the outbox migrations as applied to a
// partitioned table, which has their columns.
func recordOutboxVersions(ctx context.Context, tx pgx.Tx, table outbox.Table, all []Migration, applied map[int]bool) error {
	for _, m := range all {
		if applied[m.Version] {
			continue
		}
		if _, err := tx.Exec(ctx, "INSERT INTO "+versions(table)+" (version, name) VALUES ($1, $2)", m.Version, m.Name); err != nil {
			return fmt.Errorf("migrations: record %06d_%s: %w", m.Version, m.Name, err)
		}
	}
	return nil
}

// adoptPartitioned is called by [Up] when the table's migrations record
// nothing: a partitioned table, created by the partitioned migration through
// golang-migrate, goose or tern, has the columns of the outbox migrations,
// which are then recorded as applied rather than run (their first one would
// refuse it: its id is not unique by itself).
func adoptPartitioned(ctx context.Context, tx pgx.Tx, table outbox.Table, all []Migration, applied map[int]bool) (bool, error) {
	if len(applied) > 0 {
		return false, nil
	}
	var partitioned bool
	if err := tx.QueryRow(ctx, "SELECT coalesce((SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass($1)), false)", sqlname.Ident(table)).Scan(&partitioned); err != nil {
		return false, fmt.Errorf("migrations: look up %s: %w", table, err)
	}
	if !partitioned {
		return false, nil
	}
	if err := outboxSet.checkColumns(ctx, tx, table); err != nil {
		return false, err
	}
	return true, recordOutboxVersions(ctx, tx, table, all, applied)
}
