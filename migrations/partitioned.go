package migrations

import (
	"context"
	"embed"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
)

//go:embed partitioned/*.sql
var partitionedFS embed.FS

// defaultInterval is the span of one partition that the partitioned
// migration creates when it is given none: a day.
const defaultInterval = 24 * time.Hour

// intervalMarker is the line of the partitioned migration that holds its
// interval: WithInterval replaces it.
const intervalMarker = "interval '1 day'; -- fxoutbox:interval"

// WithInterval returns [Partitioned] with partitions of d instead of a day
// (0 keeps the day): a whole number of minutes, at least one. Up, All,
// Goose and Tern render it; on an existing partitioned table it changes
// nothing. On another set, they return an error.
func (s Set) WithInterval(d time.Duration) Set {
	s.interval = d
	return s
}

// checkInterval refuses an interval that partitions cannot be named by, or
// one given to a set other than Partitioned.
func (s Set) checkInterval() error {
	switch {
	case s.interval == 0:
		return nil
	case s.kind != kindPartitioned:
		return &outbox.ConfigError{Field: "interval", Reason: "only migrations.Partitioned has partitions: call WithInterval on it"}
	case s.interval < time.Minute || s.interval%time.Minute != 0:
		return &outbox.ConfigError{Field: "interval", Reason: fmt.Sprintf("%s is not a whole number of minutes of at least one: partitions are named by the minute", s.interval)}
	}
	return nil
}

// setInterval writes the set's interval into the partitioned migration's
// up SQL; without one, the SQL keeps its day.
func (s Set) setInterval(up string) string {
	if s.kind != kindPartitioned || s.interval == 0 {
		return up
	}
	return strings.Replace(up, intervalMarker, fmt.Sprintf("interval '%d minutes';", s.interval/time.Minute), 1)
}

func (s Set) upPartitioned(ctx context.Context, db DB, table outbox.Table) error {
	table = table.WithDefaults()
	all, err := s.All(table)
	if err != nil {
		return err
	}
	outboxAll, err := Outbox.All(table)
	if err != nil {
		return err
	}
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		applied, err := prepare(ctx, tx, table)
		if err != nil {
			return err
		}
		for _, m := range all {
			if _, err := tx.Exec(ctx, m.Up); err != nil {
				return fmt.Errorf("migrations: apply %06d_%s (partitioned) to %s: %w", m.Version, m.Name, table, err)
			}
		}
		return recordOutboxVersions(ctx, tx, table, outboxAll, applied)
	})
	if err != nil {
		return err
	}
	return Cursor.Up(ctx, db, table)
}

// downPartitioned reverts Cursor, drops the partitioned table and removes
// the outbox versions that upPartitioned recorded, in one transaction.
func (s Set) downPartitioned(ctx context.Context, db DB, table outbox.Table, version int) error {
	if version != 0 {
		return &outbox.ConfigError{Field: "version", Reason: fmt.Sprintf("%d: the partitioned migration is one step, which Down reverts with 0", version)}
	}
	table = table.WithDefaults()
	all, err := s.All(table)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := prepare(ctx, tx, table); err != nil {
			return err
		}
		// The cursor's tables go with the table; its columns with it.
		if _, err := tx.Exec(ctx, "DROP TABLE IF EXISTS "+sqlname.Ident(sqlname.Cursor(table))+", "+sqlname.Ident(sqlname.Parked(table))); err != nil {
			return fmt.Errorf("migrations: drop the cursor tables of %s: %w", table, err)
		}
		for _, m := range slices.Backward(all) {
			if _, err := tx.Exec(ctx, m.Down); err != nil {
				return fmt.Errorf("migrations: revert %06d_%s (partitioned) on %s: %w", m.Version, m.Name, table, err)
			}
		}
		if _, err := tx.Exec(ctx, "DELETE FROM "+versions(table)); err != nil {
			return fmt.Errorf("migrations: forget the outbox versions of %s: %w", table, err)
		}
		return nil
	})
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

// adoptPartitioned is called by Outbox.Up when the table's migrations record
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
	if err := Outbox.checkColumns(ctx, tx, table); err != nil {
		return false, err
	}
	return true, recordOutboxVersions(ctx, tx, table, all, applied)
}
