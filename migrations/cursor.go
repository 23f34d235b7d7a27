package migrations

import (
	"context"
	"embed"
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
