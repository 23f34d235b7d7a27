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
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
)

//go:embed *.sql
var outboxFS embed.FS

//go:embed inbox/*.sql
var inboxFS embed.FS

// Set is one family of migrations, embedded in this package: the outbox
// table's ([Outbox]), the inbox's ([Inbox]), the streaming relay's
// publication ([Stream]), cursor progress ([Cursor]) and the partitioned
// table ([Partitioned]). Each renders its SQL for any [outbox.Table]
// (names validated and quoted), applies and reverts it ([Set.Up],
// [Set.Down]), checks that it was applied ([Set.Check]), and hands it to
// golang-migrate ([Set.FS]), goose ([Set.Goose]) or tern ([Set.Tern]).
//
// A zero Set has no migrations; use the package's values.
type Set struct {
	kind     kind
	fsys     fs.FS
	dir      string
	interval time.Duration // Partitioned only: see WithInterval
}

type kind int

const (
	kindNone kind = iota
	kindOutbox
	kindInbox
	kindStream
	kindCursor
	kindPartitioned
)

// The migration sets. An empty [outbox.Table] names the default table:
// outbox_event, or outbox_inbox for [Inbox].
var (
	// Outbox creates the outbox table, in the folder migrations/
	// (000001_create_outbox_event.up.sql, ...). Its Up records the applied
	// versions in <name>_migrations, and takes over a table created by
	// [Partitioned] (or the NestJS relay's table of the same design)
	// without rewriting it.
	Outbox = Set{kind: kindOutbox, fsys: outboxFS, dir: "."}
	// Inbox creates the inbox (package inbox) tables, in the folder
	// migrations/inbox/: outbox_inbox (one row per event a consumer
	// applied) and outbox_inbox_parked. Its Up records the applied versions
	// in <name>_migrations.
	Inbox = Set{kind: kindInbox, fsys: inboxFS, dir: "inbox"}
	// Stream creates the publication the streaming relay (relay.Stream)
	// reads, [outbox.Table.Publication], in the folder migrations/stream/.
	// The outbox table must exist. Nothing records it in a version table:
	// the catalog is the record.
	Stream = Set{kind: kindStream, fsys: streamFS, dir: "stream"}
	// Cursor makes an outbox table ready for cursor progress
	// (relay.ProgressCursor), in the folder migrations/cursor/: the
	// writing transaction's id on each row (txid, with its index), the
	// lanes' positions (<name>_cursor) and the parked events
	// (<name>_parked). The outbox table must exist. Nothing records it in
	// a version table: the catalog is the record.
	Cursor = Set{kind: kindCursor, fsys: cursorFS, dir: "cursor"}
	// Partitioned creates the outbox table partitioned by range of
	// event_id (UUIDv7, so by time), one partition a day (see
	// [Set.WithInterval]), in the folder migrations/partitioned/: for new
	// installs that relay with cursor progress and retire whole partitions
	// instead of deleting rows. It has the columns of the outbox
	// migrations 1 to 3 and the cursor migration's txid; its Up records the
	// outbox migrations as applied and applies [Cursor] after it.
	// docs/partitions.md says more.
	Partitioned = Set{kind: kindPartitioned, fsys: partitionedFS, dir: "partitioned"}
)

func (s Set) name() string {
	switch s.kind {
	case kindOutbox:
		return "outbox"
	case kindInbox:
		return "inbox"
	case kindStream:
		return "stream"
	case kindCursor:
		return "cursor"
	case kindPartitioned:
		return "partitioned"
	}
	return "none"
}

// hint says how to apply the set's migrations, for errors.
func (s Set) hint() string {
	switch s.kind {
	case kindInbox:
		return "apply the inbox migrations (migrations.Inbox.Up, OUTBOX_INBOX_MIGRATE=true or InboxConfig.Migrate with fxoutbox, or the SQL files in migrations/inbox/)"
	case kindStream:
		return "create the publication (migrations.Stream.Up, or the SQL files in migrations/stream/)"
	case kindCursor:
		return "apply the cursor migration (migrations.Cursor.Up, OUTBOX_MIGRATE=true with OUTBOX_PROGRESS=cursor, or the SQL files in migrations/cursor/)"
	case kindPartitioned:
		return "apply the partitioned migration (migrations.Partitioned.Up, or the SQL files in migrations/partitioned/ and then migrations/cursor/)"
	}
	return "apply the migrations (migrations.Outbox.Up, OUTBOX_MIGRATE=true with fxoutbox, or the SQL files in migrations/)"
}

// defaults names the default table when table's name is empty.
func (s Set) defaults(table outbox.Table) outbox.Table {
	if s.kind == kindInbox {
		return sqlname.Inbox(table)
	}
	return table.WithDefaults()
}

// render rewrites SQL written for the default table.
func (s Set) render(sql string, table outbox.Table) string {
	switch s.kind {
	case kindInbox:
		return renderInbox(sql, table)
	case kindStream:
		return renderStream(sql, table)
	case kindCursor:
		return renderCursor(sql, table)
	}
	return render(sql, table)
}

// versions goes between the table's name and the tool's in the name of
// goose's and tern's version table: <name>_<versions><tool>_version.
func (s Set) versions() string {
	switch s.kind {
	case kindStream, kindCursor, kindPartitioned:
		return s.name() + "_"
	}
	return ""
}

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

// All returns the set's migrations rendered for table, in version order:
// the SQL that [Set.Up] runs, for those who apply it another way.
func (s Set) All(table outbox.Table) ([]Migration, error) {
	table = s.defaults(table)
	if err := table.Validate(); err != nil {
		return nil, err
	}
	if err := s.checkInterval(); err != nil {
		return nil, err
	}
	if s.kind == kindNone {
		return nil, &outbox.ConfigError{Field: "migrations.Set", Reason: "the zero Set has no migrations: use migrations.Outbox, Inbox, Stream, Cursor or Partitioned"}
	}
	entries, err := fs.ReadDir(s.fsys, s.dir)
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
		b, err := fs.ReadFile(s.fsys, path.Join(s.dir, e.Name()))
		if err != nil {
			return nil, err
		}
		mig := byVersion[v]
		if mig == nil {
			mig = &Migration{Version: v, Name: m[2]}
			byVersion[v] = mig
		}
		if m[3] == "up" {
			mig.Up = s.setInterval(s.render(string(b), table))
		} else {
			mig.Down = s.render(string(b), table)
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

// render rewrites SQL written for the default table outbox_event so that it
// names table instead: the table itself schema-qualified and quoted, objects
// named outbox_event_<suffix> (indexes) as <name>_<suffix>, quoted.
func render(sql string, table outbox.Table) string {
	return nameRE.ReplaceAllStringFunc(sql, func(s string) string {
		if suffix, ok := strings.CutPrefix(s, outbox.DefaultTableName+"_"); ok {
			return sqlname.Derived(table, suffix)
		}
		return sqlname.Ident(table)
	})
}

var inboxNameRE = regexp.MustCompile(`\boutbox_inbox(_\w+)?\b`)

// renderInbox rewrites SQL written for the default inbox table outbox_inbox
// so that it names table instead: outbox_inbox and outbox_inbox_parked
// (tables) schema-qualified and quoted, other objects named
// outbox_inbox_<suffix> (indexes) as <name>_<suffix>, quoted.
func renderInbox(sql string, table outbox.Table) string {
	table = sqlname.Inbox(table)
	return inboxNameRE.ReplaceAllStringFunc(sql, func(s string) string {
		suffix, ok := strings.CutPrefix(s, sqlname.DefaultInbox+"_")
		switch {
		case !ok:
			return sqlname.Ident(table)
		case suffix == "parked":
			return sqlname.Ident(sqlname.Parked(table))
		}
		return sqlname.Derived(table, suffix)
	})
}

// Up applies the set's migrations to table, in one transaction, under an
// advisory lock per table (several pods starting at once serialize on it).
// It is idempotent: what is applied already is left alone.
//
//   - [Outbox] and [Inbox] apply every migration that <name>_migrations
//     does not list yet, and list it there; they create the table's schema
//     when it is configured and missing.
//   - [Stream] creates the publication FOR TABLE table WITH (publish =
//     'insert'); one of that name that differs (other operations, other
//     tables, FOR ALL TABLES, a row filter or column list) is an error
//     wrapping [ErrPublicationMismatch] that says what differs and the SQL
//     that fixes it. Run it as the table's owner, with CREATE on the
//     database.
//   - [Cursor] adds the column txid (no rewrite: the rows already there
//     keep it NULL) and its index, and creates <name>_cursor and
//     <name>_parked (and the column first_failed_at). Building the index
//     locks writes for as long as it takes: on a large table, create it
//     first with CREATE INDEX CONCURRENTLY <name>_txid_idx ON <table>
//     (txid, id) after adding the column, and Up finds it.
//   - [Partitioned] creates the table partitioned, records the outbox
//     migrations 1 to 3 as applied in <name>_migrations (the table has
//     their columns, so Outbox.Up finds nothing to do) and applies
//     [Cursor]. A partitioned table of that name is kept as it is (its
//     interval too); one that is not partitioned is an error: see
//     docs/partitions.md, "An existing table".
//
// Stream and Cursor need the outbox table: run Outbox.Up first.
func (s Set) Up(ctx context.Context, db DB, table outbox.Table) error {
	switch s.kind {
	case kindStream:
		return s.upStream(ctx, db, table)
	case kindCursor:
		return s.upCursor(ctx, db, table)
	case kindPartitioned:
		return s.upPartitioned(ctx, db, table)
	}
	return s.up(ctx, db, table)
}

func (s Set) up(ctx context.Context, db DB, table outbox.Table) error {
	table = s.defaults(table)
	all, err := s.All(table)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		applied, err := prepare(ctx, tx, table)
		if err != nil {
			return err
		}
		if s.kind == kindOutbox {
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

// Down reverts, in one transaction, the set's migrations newer than
// version: 0 reverts all of them. [Outbox] and [Inbox] revert those that
// <name>_migrations lists (Outbox.Down with 0 drops the table). [Stream]
// drops the publication (it leaves the streaming relay's replication slot
// alone: a slot keeps WAL on the server's disk until it is dropped, so drop
// it once the streaming relays are stopped, with admin.DropSlot or
// `outboxctl stream drop-slot`). [Cursor] moves the parked events back
// into the table (parked in their rows, as marks mode keeps them) and
// drops the positions and parked tables and the columns txid and
// first_failed_at: read the down files' comments first, since the events
// the cursor delivered are not marked published. [Partitioned] takes 0
// only: it drops the table and its partitions, <name>_cursor and
// <name>_parked (parked events included), and removes the outbox versions
// it recorded.
func (s Set) Down(ctx context.Context, db DB, table outbox.Table, version int) error {
	switch s.kind {
	case kindStream, kindCursor:
		return s.downUnrecorded(ctx, db, table, version)
	case kindPartitioned:
		return s.downPartitioned(ctx, db, table, version)
	}
	return s.down(ctx, db, table, version)
}

func (s Set) down(ctx context.Context, db DB, table outbox.Table, version int) error {
	table = s.defaults(table)
	all, err := s.All(table)
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

// applied lists the versions applied to table, in order.
func applied(ctx context.Context, db DB, table outbox.Table) ([]int, error) {
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

// The errors of [Set.Check] and [Set.Up], wrapped with what was found and
// what to do.
var (
	// ErrNoTable: the table (or, for Stream and Cursor, the outbox table;
	// for Cursor.Check, <name>_cursor) does not exist.
	ErrNoTable = errors.New("table does not exist")
	// ErrOutdatedTable: the table lacks what a later migration adds.
	ErrOutdatedTable = errors.New("outbox table is behind the latest migration")
	// ErrPublicationMismatch: the table's publication exists but is not
	// what the streaming relay reads (Stream.Up), or is missing or not it
	// (Stream.Check).
	ErrPublicationMismatch = errors.New("the outbox publication differs from what the streaming relay needs")
)

// Check reports, with an error that says to run the migrations and how, a
// table the set was not applied to: for [Outbox] and [Inbox], the table (and
// the inbox's <name>_parked) is missing ([ErrNoTable]) or lacks a column a
// migration adds ([ErrOutdatedTable]); for [Cursor], <name>_cursor is
// missing; for [Stream], the publication is missing or differs
// ([ErrPublicationMismatch]); for [Partitioned], what Outbox.Check and
// Cursor.Check report. It reads only the catalog, which any role may read:
// it is what a relay or consumer runs when it does not migrate.
func (s Set) Check(ctx context.Context, db interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, table outbox.Table) error {
	table = s.defaults(table)
	switch s.kind {
	case kindStream:
		return s.checkStream(ctx, db, table)
	case kindCursor:
		return s.exists(ctx, db, sqlname.Cursor(table))
	case kindPartitioned:
		if err := Outbox.Check(ctx, db, table); err != nil {
			return err
		}
		return Cursor.Check(ctx, db, table)
	}
	if err := s.exists(ctx, db, table); err != nil {
		return err
	}
	if err := s.checkColumns(ctx, db, table); err != nil {
		return err
	}
	if s.kind == kindInbox {
		return s.exists(ctx, db, sqlname.Parked(table))
	}
	return nil
}

func (s Set) exists(ctx context.Context, db interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, table outbox.Table) error {
	if err := table.Validate(); err != nil {
		return err
	}
	ok, err := queryOne[bool](ctx, db, "SELECT to_regclass($1) IS NOT NULL", sqlname.Ident(table))
	if err != nil {
		return fmt.Errorf("migrations: check table %s: %w", table, err)
	}
	if !ok {
		return fmt.Errorf("%w: %s: %s", ErrNoTable, table, s.hint())
	}
	return nil
}

var addColumnRE = regexp.MustCompile(`(?i)ADD\s+COLUMN\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)`)

// checkColumns looks up, in the catalog (readable by any role), the columns
// the migrations add to the table, and names the first migration whose
// columns are missing.
func (s Set) checkColumns(ctx context.Context, db interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, table outbox.Table) error {
	all, err := s.All(table)
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
	missing, err := queryOne[[]string](ctx, db, `SELECT coalesce(array_agg(c ORDER BY n), '{}') FROM unnest($2::text[]) WITH ORDINALITY AS u(c, n)
		WHERE NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = u.c AND NOT attisdropped)`,
		sqlname.Ident(table), cols)
	if err != nil {
		return fmt.Errorf("migrations: check columns of %s: %w", table, err)
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s has no column %s (migration %s): %s",
		ErrOutdatedTable, table, strings.Join(missing, ", "), from[slices.Index(cols, missing[0])], s.hint())
}

// queryOne returns the one value of the one row sql returns.
func queryOne[T any](ctx context.Context, db interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, sql string, args ...any) (T, error) {
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		var zero T
		return zero, err
	}
	return pgx.CollectExactlyOneRow(rows, pgx.RowTo[T])
}
