package migrations

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
)

//go:embed cursor/*.sql
var cursorFS embed.FS

var cursorNameRE = regexp.MustCompile(`\boutbox_event(_\w+)?\b`)

// renderCursor rewrites SQL written for the default table outbox_event so
// that it names table instead: outbox_event, outbox_event_cursor and
// outbox_event_parked (tables) schema-qualified and quoted, other objects
// named outbox_event_<suffix> (indexes) as <name>_<suffix>, quoted.
func renderCursor(sql string, table outbox.Table) string {
	return cursorNameRE.ReplaceAllStringFunc(sql, func(s string) string {
		suffix, ok := strings.CutPrefix(s, outbox.DefaultTableName+"_")
		switch {
		case !ok:
			return sqlname.Ident(table)
		case suffix == "cursor":
			return sqlname.Ident(sqlname.Cursor(table))
		case suffix == "parked":
			return sqlname.Ident(sqlname.Parked(table))
		}
		return sqlname.Derived(table, suffix)
	})
}

// upCursor applies the cursor migrations, whose SQL is idempotent (IF NOT
// EXISTS, and an index found by its definition).
func (s Set) upCursor(ctx context.Context, db DB, table outbox.Table) error {
	table = table.WithDefaults()
	all, err := s.All(table)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := lock(ctx, tx, table); err != nil {
			return err
		}
		if err := Outbox.exists(ctx, tx, table); err != nil {
			return fmt.Errorf("migrations: cursor of %s: %w", table, err)
		}
		for _, m := range all {
			if _, err := tx.Exec(ctx, m.Up); err != nil {
				return fmt.Errorf("migrations: apply %06d_%s (cursor) to %s (as the table's owner): %w", m.Version, m.Name, table, err)
			}
		}
		return nil
	})
}

// downUnrecorded reverts the migrations newer than version of a set that no
// version table records (Cursor, Stream): their down files are written to
// run on what is there.
func (s Set) downUnrecorded(ctx context.Context, db DB, table outbox.Table, version int) error {
	table = table.WithDefaults()
	all, err := s.All(table)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := lock(ctx, tx, table); err != nil {
			return err
		}
		for i := len(all) - 1; i >= 0; i-- {
			m := all[i]
			if m.Version <= version {
				continue
			}
			if _, err := tx.Exec(ctx, m.Down); err != nil {
				if s.kind == kindStream {
					return fmt.Errorf("migrations: drop publication %s of %s (as its owner): %w", table.Publication(), table, err)
				}
				return fmt.Errorf("migrations: revert %06d_%s (%s) on %s: %w", m.Version, m.Name, s.name(), table, err)
			}
		}
		return nil
	})
}

// Install is what a new install gets by default: it applies [Outbox] to
// table and, when that creates the table, [Cursor] with it, in one
// transaction under the table's migration lock, and marks the positions
// table with a comment as cursor from the start. Relays with
// relay.ProgressAuto then record cursor progress on the new table from
// their first batch, while a table that exists keeps the progress it has
// (moving it to cursor is the online step of docs/progress.md). created
// reports whether the table was made.
// Pods starting at once serialize on the lock: none of them sees the table
// without its cursor migration. fxoutbox's OUTBOX_MIGRATE runs it under
// relay.ProgressAuto.
func Install(ctx context.Context, db DB, table outbox.Table) (created bool, err error) {
	table = table.WithDefaults()
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := lock(ctx, tx, table); err != nil {
			return err
		}
		switch err := Outbox.exists(ctx, tx, table); {
		case errors.Is(err, ErrNoTable):
			created = true
		case err != nil:
			return err
		}
		if err := Outbox.Up(ctx, tx, table); err != nil {
			return err
		}
		if !created {
			return nil
		}
		if err := Cursor.Up(ctx, tx, table); err != nil {
			return err
		}
		// The mark relay.ProgressAuto chooses cursor by on a table no relay
		// ran on yet (its table's relays check for it).
		if _, err := tx.Exec(ctx, "COMMENT ON TABLE "+sqlname.Ident(sqlname.Cursor(table))+" IS '"+sqlname.CursorFromStart+"'"); err != nil {
			return fmt.Errorf("migrations: mark %s as cursor from the start: %w", table, err)
		}
		return nil
	})
	return created && err == nil, err
}
