package migrations

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
)

// CursorFS holds the migrations that cursor progress (relay.ProgressCursor)
// needs, in the folder cursor/ (000001_outbox_event_cursor and
// 000002_outbox_event_parked, .up.sql and .down.sql), for the default table:
// the writing transaction's id on each row (txid, with its index), the
// lanes' positions (outbox_event_cursor) and the parked events
// (outbox_event_parked). Point golang-migrate at that folder with a version
// table of its own (e.g. x-migrations-table=outbox_event_cursor_migrations),
// or call [UpCursor].
//
//go:embed cursor/*.sql
var CursorFS embed.FS

var cursorSet = set{fsys: CursorFS, dir: "cursor", defaults: outbox.Table.WithDefaults, render: RenderCursor,
	hint: "apply the cursor migration (migrations.UpCursor, OUTBOX_MIGRATE=true with OUTBOX_PROGRESS=cursor, or the SQL files in migrations/cursor/)", versions: "cursor_"}

// AllCursor returns the cursor migration rendered for table.
func AllCursor(table outbox.Table) ([]Migration, error) { return cursorSet.all(table) }

// GooseCursor is [Goose] for the cursor migration: its version table is
// <name>_cursor_goose_version.
func GooseCursor(table outbox.Table) (fsys fs.FS, versionTable string, err error) {
	return renderSet(cursorSet, table, "goose", gooseFile)
}

// TernCursor is [Tern] for the cursor migration: its version table is
// <name>_cursor_tern_version.
func TernCursor(table outbox.Table) (fsys fs.FS, versionTable string, err error) {
	return renderSet(cursorSet, table, "tern", ternFile)
}

var cursorNameRE = regexp.MustCompile(`\boutbox_event(_\w+)?\b`)

// CursorTable names the table that holds the lanes' positions of table:
// <name>_cursor, in the table's schema.
func CursorTable(table outbox.Table) outbox.Table {
	table = table.WithDefaults()
	return outbox.Table{Schema: table.Schema, Name: table.Name + "_cursor"}
}

// ParkedTable names the table that holds the parked events of a table in
// cursor mode: <name>_parked, in the table's schema. (A table in marks mode
// parks its events in their rows.)
func ParkedTable(table outbox.Table) outbox.Table {
	table = table.WithDefaults()
	return outbox.Table{Schema: table.Schema, Name: table.Name + "_parked"}
}

// RenderCursor rewrites SQL written for the default table outbox_event so
// that it names table instead: outbox_event, outbox_event_cursor and
// outbox_event_parked (tables) schema-qualified and quoted, other objects
// named outbox_event_<suffix> (indexes) as <name>_<suffix>, quoted.
func RenderCursor(sql string, table outbox.Table) string {
	return cursorNameRE.ReplaceAllStringFunc(sql, func(s string) string {
		suffix, ok := strings.CutPrefix(s, outbox.DefaultTableName+"_")
		switch {
		case !ok:
			return sqlname.Ident(table)
		case suffix == "cursor":
			return sqlname.Ident(CursorTable(table))
		case suffix == "parked":
			return sqlname.Ident(ParkedTable(table))
		}
		return sqlname.Derived(table, suffix)
	})
}

// UpCursor makes table ready for cursor progress: it adds the txid column
// (no rewrite: the rows already there keep it NULL) and its index, creates
// the lanes' positions table <name>_cursor and the parked events' table
// <name>_parked (and the column first_failed_at, which a failed event's row
// keeps while it is retried). It is idempotent; the
// table must exist (run [Up] first). It takes the same advisory lock as
// [Up]. Building the index locks writes for as long as it takes: on a large
// table, create it first with CREATE INDEX CONCURRENTLY <name>_txid_idx ON
// <table> (txid, id) (after the column is added), and UpCursor finds it.
//
// Nothing records it in a version table: the catalog is the record.
func UpCursor(ctx context.Context, db DB, table outbox.Table) error {
	table = table.WithDefaults()
	all, err := cursorSet.all(table)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := lock(ctx, tx, table); err != nil {
			return err
		}
		if err := outboxSet.exists(ctx, tx, table); err != nil {
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

// DownCursor reverts [UpCursor]: it moves the parked events back into the
// table (parked in their rows, as marks mode keeps them), drops the parked
// and the positions tables and the columns txid and first_failed_at. Read
// the down files' comments first: events the cursor delivered are not
// marked published.
func DownCursor(ctx context.Context, db DB, table outbox.Table) error {
	table = table.WithDefaults()
	all, err := cursorSet.all(table)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := lock(ctx, tx, table); err != nil {
			return err
		}
		for _, m := range slices.Backward(all) {
			if _, err := tx.Exec(ctx, m.Down); err != nil {
				return fmt.Errorf("migrations: revert %06d_%s (cursor) on %s: %w", m.Version, m.Name, table, err)
			}
		}
		return nil
	})
}

// CheckCursor reports, wrapping [ErrNoTable] with what to do, a table that
// cursor progress cannot run on yet: its positions table <name>_cursor does
// not exist.
func CheckCursor(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, table outbox.Table) error {
	return cursorSet.exists(ctx, db, CursorTable(table))
}
