package migrations

import (
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/textcut"
)

//go:embed stream/*.sql
var streamFS embed.FS

var streamNameRE = regexp.MustCompile(`\boutbox_event_fxoutbox\b|\boutbox_event\b`)

// renderStream rewrites SQL written for the default table outbox_event so
// that it names table instead: outbox_event_fxoutbox becomes the quoted
// [outbox.Table.Publication], and outbox_event the table, schema-qualified
// and quoted.
func renderStream(sql string, table outbox.Table) string {
	return streamNameRE.ReplaceAllStringFunc(sql, func(s string) string {
		switch s {
		case "outbox_event_fxoutbox":
			return pgx.Identifier{table.Publication()}.Sanitize()
		}
		return sqlname.Ident(table)
	})
}

func (s Set) upStream(ctx context.Context, db DB, table outbox.Table) error {
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
			return fmt.Errorf("migrations: publication of %s: %w", table, err)
		}
		p, err := ReadPublication(ctx, tx, table)
		if err != nil {
			return err
		}
		if !p.Exists {
			for _, m := range all {
				if _, err := tx.Exec(ctx, m.Up); err != nil {
					return fmt.Errorf("migrations: create publication %s for %s (as the table's owner, with CREATE on the database): %w", p.Name, table, err)
				}
			}
			return nil
		}
		if problems := p.Problems(); len(problems) > 0 {
			return fmt.Errorf("%w: publication %s %s; fix it with: %s", ErrPublicationMismatch, p.Name, strings.Join(problems, "; "), p.Fix(table))
		}
		return nil
	})
}

// checkStream reports a missing or wrong publication.
func (s Set) checkStream(ctx context.Context, db interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, table outbox.Table) error {
	if err := Outbox.exists(ctx, db, table); err != nil {
		return fmt.Errorf("migrations: publication of %s: %w", table, err)
	}
	p, err := ReadPublication(ctx, db, table)
	if err != nil {
		return err
	}
	if problems := p.Problems(); len(problems) > 0 {
		return fmt.Errorf("%w: publication %s %s: %s; or run as the table's owner: %s", ErrPublicationMismatch, p.Name, strings.Join(problems, "; "), s.hint(), p.Fix(table))
	}
	return nil
}

// Publication is what the catalog says of a table's publication
// ([outbox.Table.Publication]).
type Publication struct {
	Name   string `json:"name"`
	Exists bool   `json:"exists"`
	Owner  string `json:"owner,omitempty"`
	// AllTables says it was created FOR ALL TABLES.
	AllTables bool `json:"all_tables"`
	// The operations it publishes.
	Insert   bool `json:"insert"`
	Update   bool `json:"update"`
	Delete   bool `json:"delete"`
	Truncate bool `json:"truncate"`
	// IncludesTable says the outbox table is in it (by name, by its schema,
	// or FOR ALL TABLES).
	IncludesTable bool `json:"includes_table"`
	// OtherTables counts the other tables it publishes (0 for FOR ALL
	// TABLES, where they are not counted); OtherTableNames names up to 10.
	OtherTables     int      `json:"other_tables"`
	OtherTableNames []string `json:"other_table_names,omitempty"`
	// RowFilter is the table's row filter (PostgreSQL 15 and later), which
	// would hide events from the relay; empty when none.
	RowFilter string `json:"row_filter,omitempty"`
	// MissingColumns are the table's columns its column list leaves out
	// (PostgreSQL 15 and later).
	MissingColumns []string `json:"missing_columns,omitempty"`
}

// Problems says, one item each, how p differs from FOR TABLE <the table>
// WITH (publish = 'insert'); none when it does not. A publication that does
// not exist has the single problem "does not exist".
func (p Publication) Problems() []string {
	if !p.Exists {
		return []string{"does not exist"}
	}
	var out []string
	if p.AllTables {
		out = append(out, "is FOR ALL TABLES (the relay would decode every table's changes)")
	} else if !p.IncludesTable {
		out = append(out, "does not include the outbox table")
	}
	if p.OtherTables > 0 {
		out = append(out, fmt.Sprintf("also publishes %d other table(s) (%s)", p.OtherTables, strings.Join(p.OtherTableNames, ", ")))
	}
	if !p.Insert {
		out = append(out, "does not publish inserts")
	}
	var ops []string
	for _, o := range []struct {
		on   bool
		name string
	}{{p.Update, "update"}, {p.Delete, "delete"}, {p.Truncate, "truncate"}} {
		if o.on {
			ops = append(ops, o.name)
		}
	}
	if len(ops) > 0 {
		out = append(out, "also publishes "+strings.Join(ops, ", ")+" (the relay would decode its own marks and retention's deletes)")
	}
	if p.RowFilter != "" {
		out = append(out, "has a row filter, which would hide events from the relay: WHERE "+textcut.Clip(p.RowFilter, 200))
	}
	if len(p.MissingColumns) > 0 {
		out = append(out, "has a column list without "+strings.Join(p.MissingColumns, ", "))
	}
	return out
}

// Fix returns the SQL that turns p into what the streaming relay reads, to
// run as the table's owner; "" when nothing is to be done.
func (p Publication) Fix(table outbox.Table) string {
	name := pgx.Identifier{p.Name}.Sanitize()
	create := "CREATE PUBLICATION " + name + " FOR TABLE " + sqlname.Ident(table) + " WITH (publish = 'insert')"
	if !p.Exists {
		return create
	}
	if p.AllTables {
		return "DROP PUBLICATION " + name + "; " + create
	}
	var fix []string
	if !p.IncludesTable || p.OtherTables > 0 || p.RowFilter != "" || len(p.MissingColumns) > 0 {
		fix = append(fix, "ALTER PUBLICATION "+name+" SET TABLE "+sqlname.Ident(table))
	}
	if !p.Insert || p.Update || p.Delete || p.Truncate {
		fix = append(fix, "ALTER PUBLICATION "+name+" SET (publish = 'insert')")
	}
	return strings.Join(fix, "; ")
}

// ReadPublication reads table's publication from the catalog (readable by
// any role). The table must exist.
func ReadPublication(ctx context.Context, db interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, table outbox.Table) (Publication, error) {
	table = table.WithDefaults()
	p := Publication{Name: table.Publication()}
	if err := table.Validate(); err != nil {
		return p, err
	}
	wrap := func(err error) error { return fmt.Errorf("migrations: read publication %s: %w", p.Name, err) }
	rows, err := db.Query(ctx, "SELECT pg_get_userbyid(pubowner), puballtables, pubinsert, pubupdate, pubdelete, pubtruncate FROM pg_publication WHERE pubname = $1", p.Name)
	if err != nil {
		return p, wrap(err)
	}
	n, err := pgx.ForEachRow(rows, []any{&p.Owner, &p.AllTables, &p.Insert, &p.Update, &p.Delete, &p.Truncate}, func() error { return nil })
	if err != nil {
		return p, wrap(err)
	}
	if p.Exists = n.RowsAffected() == 1; !p.Exists {
		return p, nil
	}
	// The table's own row in pg_publication_tables (to_jsonb: its columns
	// differ between versions), its columns, and the other tables.
	var (
		entry []byte
		cols  []string
	)
	rows, err = db.Query(ctx, `WITH t AS (SELECT n.nspname, c.relname, c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($2))
		SELECT (SELECT to_jsonb(pt) FROM pg_publication_tables pt, t WHERE pt.pubname = $1 AND pt.schemaname = t.nspname AND pt.tablename = t.relname),
			(SELECT coalesce(array_agg(attname::text ORDER BY attnum), '{}') FROM pg_attribute, t WHERE attrelid = t.oid AND attnum > 0 AND NOT attisdropped),
			(SELECT count(*) FROM pg_publication_tables pt, t WHERE $3 AND pt.pubname = $1 AND (pt.schemaname, pt.tablename) <> (t.nspname, t.relname)),
			(SELECT coalesce((array_agg(quote_ident(pt.schemaname) || '.' || quote_ident(pt.tablename) ORDER BY pt.schemaname, pt.tablename))[1:10], '{}')
				FROM pg_publication_tables pt, t WHERE $3 AND pt.pubname = $1 AND (pt.schemaname, pt.tablename) <> (t.nspname, t.relname))`,
		p.Name, sqlname.Ident(table), !p.AllTables)
	if err != nil {
		return p, wrap(err)
	}
	if _, err := pgx.ForEachRow(rows, []any{&entry, &cols, &p.OtherTables, &p.OtherTableNames}, func() error { return nil }); err != nil {
		return p, wrap(err)
	}
	if entry == nil {
		return p, nil
	}
	p.IncludesTable = true
	var e struct {
		RowFilter *string  `json:"rowfilter"`
		AttNames  []string `json:"attnames"`
	}
	if err := json.Unmarshal(entry, &e); err != nil {
		return p, wrap(err)
	}
	if e.RowFilter != nil {
		p.RowFilter = *e.RowFilter
	}
	if e.AttNames != nil {
		for _, c := range cols {
			if !slices.Contains(e.AttNames, c) {
				p.MissingColumns = append(p.MissingColumns, c)
			}
		}
	}
	return p, nil
}
