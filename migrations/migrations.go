package migrations

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
)

// FS holds the migration files, NNNNNN_name.up.sql and NNNNNN_name.down.sql,
// and roles.example.sql.
//
//go:embed *.sql
var FS embed.FS

// InboxFS holds the inbox's migration files, in the folder inbox/
// (inbox/000001_create_outbox_inbox.up.sql, ...): point golang-migrate at
// that folder, or call [UpInbox].
//
//go:embed inbox/*.sql
var InboxFS embed.FS

// DefaultInboxTableName is the inbox table the inbox migrations create when
// none is configured. Its parked records live in <name>_parked.
const DefaultInboxTableName = "outbox_inbox"

// InboxTable returns t with an empty Name set to DefaultInboxTableName: the
// inbox's default, where [outbox.Table.WithDefaults] gives the outbox's.
func InboxTable(t outbox.Table) outbox.Table {
	if t.Name == "" {
		t.Name = DefaultInboxTableName
	}
	return t
}

// set is one family of migrations: the outbox's or the inbox's.
type set struct {
	fsys     fs.FS
	dir      string
	defaults func(outbox.Table) outbox.Table
	render   func(string, outbox.Table) string
	hint     string // how to apply them, for errors
	// versions goes between the table's name and the tool's in the name
	// of goose's and tern's version table: <name>_<versions><tool>_version.
	versions string
}

var (
	outboxSet = set{fsys: FS, dir: ".", defaults: outbox.Table.WithDefaults, render: Render,
		hint: "apply the migrations (migrations.Up, OUTBOX_MIGRATE=true with fxoutbox, or the SQL files in migrations/)"}
	inboxSet = set{fsys: InboxFS, dir: "inbox", defaults: InboxTable, render: RenderInbox,
		hint: "apply the inbox migrations (migrations.UpInbox, OUTBOX_INBOX_MIGRATE=true or InboxConfig.Migrate with fxoutbox, or the SQL files in migrations/inbox/)"}
)

// DB begins transactions: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Migration is one versioned schema change.
type Migration struct {
	Version int
	Name    string
	Up      string // SQL, for the table it was rendered for
	Down    string
}

var fileRE = regexp.MustCompile(`^(\d+)_(\w+)\.(up|down)\.sql$`)

// All returns the migrations rendered for table, in version order.
func All(table outbox.Table) ([]Migration, error) { return outboxSet.all(table) }

// AllInbox returns the inbox migrations rendered for the inbox table (default
// outbox_inbox, see [InboxTable]), in version order.
func AllInbox(table outbox.Table) ([]Migration, error) { return inboxSet.all(table) }

func (k set) all(table outbox.Table) ([]Migration, error) {
	table = k.defaults(table)
	if err := table.Validate(); err != nil {
		return nil, err
	}
	entries, err := fs.ReadDir(k.fsys, k.dir)
	if err != nil {
		return nil, err
	}
	byVersion := map[int]*Migration{}
	for _, e := range entries {
		m := fileRE.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		v, _ := strconv.Atoi(m[1])
		b, err := fs.ReadFile(k.fsys, path.Join(k.dir, e.Name()))
		if err != nil {
			return nil, err
		}
		mig := byVersion[v]
		if mig == nil {
			mig = &Migration{Version: v, Name: m[2]}
			byVersion[v] = mig
		}
		if m[3] == "up" {
			mig.Up = k.render(string(b), table)
		} else {
			mig.Down = k.render(string(b), table)
		}
	}
	out := make([]Migration, 0, len(byVersion))
	for _, m := range byVersion {
		out = append(out, *m)
	}
	slices.SortFunc(out, func(a, b Migration) int { return a.Version - b.Version })
	return out, nil
}

var nameRE = regexp.MustCompile(`\boutbox_event(_\w+)?\b`)

// Render rewrites SQL written for the default table outbox_event so that it
// names table instead: the table itself schema-qualified and quoted, objects
// named outbox_event_<suffix> (indexes) as <name>_<suffix>, quoted.
func Render(sql string, table outbox.Table) string {
	return nameRE.ReplaceAllStringFunc(sql, func(s string) string {
		if suffix, ok := strings.CutPrefix(s, outbox.DefaultTableName+"_"); ok {
			return sqlname.Derived(table, suffix)
		}
		return sqlname.Ident(table)
	})
}

var inboxNameRE = regexp.MustCompile(`\boutbox_inbox(_\w+)?\b`)

// RenderInbox rewrites SQL written for the default inbox table outbox_inbox
// so that it names table instead: outbox_inbox and outbox_inbox_parked
// (tables) schema-qualified and quoted, other objects named
// outbox_inbox_<suffix> (indexes) as <name>_<suffix>, quoted.
func RenderInbox(sql string, table outbox.Table) string {
	table = InboxTable(table)
	return inboxNameRE.ReplaceAllStringFunc(sql, func(s string) string {
		suffix, ok := strings.CutPrefix(s, DefaultInboxTableName+"_")
		switch {
		case !ok:
			return sqlname.Ident(table)
		case suffix == "parked":
			return sqlname.Ident(outbox.Table{Schema: table.Schema, Name: table.Name + "_parked"})
		}
		return sqlname.Derived(table, suffix)
	})
}

// Up applies, in one transaction, every migration that the table's
// migrations record does not list yet. It creates the schema if one is
// configured and missing.
func Up(ctx context.Context, db DB, table outbox.Table) error { return outboxSet.up(ctx, db, table) }

// UpInbox applies the inbox migrations to the inbox table (default
// outbox_inbox, see [InboxTable]) as [Up] does to the outbox's, recording
// them in <name>_migrations.
func UpInbox(ctx context.Context, db DB, table outbox.Table) error {
	return inboxSet.up(ctx, db, table)
}

// DownInbox reverts the inbox migrations newer than version (0 drops the
// inbox tables), as [Down] does for the outbox's.
func DownInbox(ctx context.Context, db DB, table outbox.Table, version int) error {
	return inboxSet.down(ctx, db, table, version)
}

func (k set) up(ctx context.Context, db DB, table outbox.Table) error {
	table = k.defaults(table)
	all, err := k.all(table)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		applied, err := prepare(ctx, tx, table)
		if err != nil {
			return err
		}
		if k.dir == outboxSet.dir {
			if done, err := adoptPartitioned(ctx, tx, table, all, applied); err != nil || done {
				return err
			}
		}
		for _, m := range all {
			if applied[m.Version] {
				continue
			}
			if _, err := tx.Exec(ctx, m.Up); err != nil {
				return fmt.Errorf("migrations: apply %06d_%s to %s: %w", m.Version, m.Name, table, err)
			}
			if _, err := tx.Exec(ctx, "INSERT INTO "+versions(table)+" (version, name) VALUES ($1, $2)", m.Version, m.Name); err != nil {
				return fmt.Errorf("migrations: record %06d_%s: %w", m.Version, m.Name, err)
			}
		}
		return nil
	})
}

// Down reverts, in one transaction, every applied migration newer than
// version (0 reverts all of them, dropping the table).
func Down(ctx context.Context, db DB, table outbox.Table, version int) error {
	return outboxSet.down(ctx, db, table, version)
}

func (k set) down(ctx context.Context, db DB, table outbox.Table, version int) error {
	table = k.defaults(table)
	all, err := k.all(table)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		applied, err := prepare(ctx, tx, table)
		if err != nil {
			return err
		}
		for _, m := range slices.Backward(all) {
			if m.Version <= version || !applied[m.Version] {
				continue
			}
			if _, err := tx.Exec(ctx, m.Down); err != nil {
				return fmt.Errorf("migrations: revert %06d_%s on %s: %w", m.Version, m.Name, table, err)
			}
			if _, err := tx.Exec(ctx, "DELETE FROM "+versions(table)+" WHERE version = $1", m.Version); err != nil {
				return err
			}
		}
		return nil
	})
}

// Applied lists the versions applied to table, in order.
func Applied(ctx context.Context, db DB, table outbox.Table) ([]int, error) {
	if err := table.Validate(); err != nil {
		return nil, err
	}
	var out []int
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		applied, err := prepare(ctx, tx, table)
		for v := range applied {
			out = append(out, v)
		}
		return err
	})
	slices.Sort(out)
	return out, err
}

func versions(t outbox.Table) string {
	t = t.WithDefaults()
	return sqlname.Ident(outbox.Table{Schema: t.Schema, Name: t.Name + "_migrations"})
}

// lock takes the table's migration lock for the rest of tx: Up, the
// inbox's and the publication's migrations of one table never run at once.
func lock(ctx context.Context, tx pgx.Tx, table outbox.Table) error {
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext($1))", "fxoutbox.migrations:"+table.WithDefaults().String()); err != nil {
		return fmt.Errorf("migrations: lock: %w", err)
	}
	return nil
}

// prepare takes the migration lock, creates the schema and the versions
// table if needed, and returns the applied versions.
func prepare(ctx context.Context, tx pgx.Tx, table outbox.Table) (map[int]bool, error) {
	table = table.WithDefaults()
	if err := lock(ctx, tx, table); err != nil {
		return nil, err
	}
	if table.Schema != "" {
		// Only when missing: CREATE SCHEMA IF NOT EXISTS needs CREATE on the
		// database even when the schema exists, which a migration role that
		// owns its schema does not have (see roles.example.sql).
		var exists bool
		if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)", table.Schema).Scan(&exists); err != nil {
			return nil, fmt.Errorf("migrations: look up schema %s: %w", table.Schema, err)
		}
		if !exists {
			if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{table.Schema}.Sanitize()); err != nil {
				return nil, fmt.Errorf("migrations: create schema %s: %w", table.Schema, err)
			}
		}
	}
	if _, err := tx.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+versions(table)+
		" (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"); err != nil {
		return nil, fmt.Errorf("migrations: create versions table: %w", err)
	}
	rows, err := tx.Query(ctx, "SELECT version FROM "+versions(table))
	if err != nil {
		return nil, err
	}
	vs, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return nil, err
	}
	applied := make(map[int]bool, len(vs))
	for _, v := range vs {
		applied[v] = true
	}
	return applied, nil
}

// ErrNoTable is returned by CheckTable (and CheckInbox) when the table does
// not exist.
var ErrNoTable = errors.New("table does not exist")

// CheckTable reports whether table exists and has the columns every
// migration adds, with an error (ErrNoTable, ErrOutdatedTable) that says to
// run the migrations when not.
func CheckTable(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, table outbox.Table) error {
	return outboxSet.check(ctx, db, table)
}

// CheckInbox is CheckTable for an inbox table (default outbox_inbox, see
// [InboxTable]) and the table of its parked records (<name>_parked).
func CheckInbox(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, table outbox.Table) error {
	table = InboxTable(table)
	if err := inboxSet.check(ctx, db, table); err != nil {
		return err
	}
	return inboxSet.exists(ctx, db, outbox.Table{Schema: table.Schema, Name: table.Name + "_parked"})
}

func (k set) check(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, table outbox.Table) error {
	table = k.defaults(table)
	if err := k.exists(ctx, db, table); err != nil {
		return err
	}
	return k.checkColumns(ctx, db, table)
}

func (k set) exists(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, table outbox.Table) error {
	if err := table.Validate(); err != nil {
		return err
	}
	var ok bool
	if err := db.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", sqlname.Ident(table)).Scan(&ok); err != nil {
		return fmt.Errorf("migrations: check table %s: %w", table, err)
	}
	if !ok {
		return fmt.Errorf("%w: %s: %s", ErrNoTable, table, k.hint)
	}
	return nil
}

// ErrOutdatedTable is returned by CheckTable when the outbox table lacks
// what a later migration adds.
var ErrOutdatedTable = errors.New("outbox table is behind the latest migration")

var addColumnRE = regexp.MustCompile(`(?i)ADD\s+COLUMN\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)`)

// checkColumns looks up, in the catalog (readable by any role), the columns
// the migrations add to the table, and names the first migration whose
// columns are missing.
func (k set) checkColumns(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, table outbox.Table) error {
	all, err := k.all(table)
	if err != nil {
		return err
	}
	var cols []string
	var from []string // the migration of each column
	for _, m := range all {
		for _, c := range addColumnRE.FindAllStringSubmatch(m.Up, -1) {
			cols, from = append(cols, c[1]), append(from, fmt.Sprintf("%06d_%s", m.Version, m.Name))
		}
	}
	if len(cols) == 0 {
		return nil
	}
	var missing []string
	err = db.QueryRow(ctx, `SELECT coalesce(array_agg(c ORDER BY n), '{}') FROM unnest($2::text[]) WITH ORDINALITY AS u(c, n)
		WHERE NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = u.c AND NOT attisdropped)`,
		sqlname.Ident(table), cols).Scan(&missing)
	if err != nil {
		return fmt.Errorf("migrations: check columns of %s: %w", table, err)
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s has no column %s (migration %s): %s",
		ErrOutdatedTable, table, strings.Join(missing, ", "), from[slices.Index(cols, missing[0])], k.hint)
}
