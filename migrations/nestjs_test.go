package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/nestjs"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/migrations"
)

// Up takes over a table created with the NestJS design's DDL, holding 100
// rows of which 49 are published: every row stays as it was (same columns,
// same place, never updated, the table not rewritten), the table gains
// headers, attempts, last_error, parked_at and the BRIN index, keeps its own
// partial index instead of getting a second one, and ids go on after the
// last row. A second Up has nothing to do.
func TestUpAdoptsNestJSTable(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	ctx := context.Background()
	tbl := outbox.Table{Schema: testenv.Name("nest_")}
	nest := nestjs.Create(t, pool, tbl.Schema)
	nestjs.Fill(t, nest, 100, 7, 49, "order-service.order.confirmed")
	before, node := nestjs.Snapshot(t, pool, tbl)
	if err := migrations.Outbox.Check(ctx, pool, tbl); !errors.Is(err, migrations.ErrOutdatedTable) || !strings.Contains(err.Error(), "no column headers") {
		t.Fatalf("Outbox.Check on the NestJS table = %v, want ErrOutdatedTable naming headers", err)
	}
	for range 2 {
		if err := migrations.Outbox.Up(ctx, pool, tbl); err != nil {
			t.Fatal(err)
		}
	}
	if v, err := applied(t, pool, tbl); err != nil || !slices.Equal(v, []int{1, 2, 3}) {
		t.Fatalf("Applied = %v, %v", v, err)
	}
	if err := migrations.Outbox.Check(ctx, pool, tbl); err != nil {
		t.Fatal(err)
	}
	var published int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+sqlname.Ident(tbl)+" WHERE published_at IS NOT NULL").Scan(&published); err != nil || published != 49 {
		t.Fatalf("%d published rows (%v), want 49", published, err)
	}
	nestjs.RequireAdopted(t, pool, nest, tbl, before, node)
}

// Tables that differ from the NestJS DDL in ways the outbox does not mind
// are adopted too: TypeORM's own schema for the design's entity (varchar
// columns, a bigserial id), and a table without the partial index (which
// gets the outbox's).
func TestUpAdoptsCompatibleShapes(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name, ddl string
		index     string // the partial index after Up
	}{
		{"typeorm synchronize", `CREATE TABLE outbox_event (
			id bigserial PRIMARY KEY, event_id uuid NOT NULL, aggregate_type character varying NOT NULL,
			aggregate_id character varying NOT NULL, event_type character varying NOT NULL, payload jsonb NOT NULL,
			topic character varying(255) NOT NULL, partition_key character varying NOT NULL,
			created_at timestamptz NOT NULL DEFAULT now(), published_at timestamptz,
			note text, CONSTRAINT "UQ_outbox_event_event_id" UNIQUE (event_id))`, "outbox_event_unpublished_idx"},
		{"no partial index", strings.Split(nestjs.DDL, "CREATE INDEX")[0], "outbox_event_unpublished_idx"},
		{"partial index with another name", strings.Replace(nestjs.DDL, "ix_outbox_event_unpublished", "pending", 1), "pending"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tbl := outbox.Table{Schema: testenv.Name("nest_")}
			nest := create(t, pool, tbl.Schema, tc.ddl)
			nestjs.Fill(t, nest, 20, 3, 5, "t")
			if err := migrations.Outbox.Up(ctx, pool, tbl); err != nil {
				t.Fatal(err)
			}
			var idx []string
			// The schema's indexes first (MATERIALIZED), their definitions
			// after: pg_get_indexdef on an index that a parallel test is
			// dropping fails with "could not open relation".
			rows, _ := pool.Query(ctx, `WITH x AS MATERIALIZED (SELECT indexname, schemaname FROM pg_indexes WHERE schemaname = $1)
				SELECT indexname FROM x WHERE pg_get_indexdef(format('%I.%I', schemaname, indexname)::regclass) LIKE '%WHERE (published_at IS NULL)'`, tbl.Schema)
			idx, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil || !slices.Equal(idx, []string{tc.index}) {
				t.Fatalf("partial indexes %v (%v), want [%s]", idx, err, tc.index)
			}
			if err := migrations.Outbox.Check(ctx, pool, tbl); err != nil {
				t.Fatal(err)
			}
			if _, err := nestjs.Write(ctx, nest, nestjs.NewEvent(21, "order-1", "t")); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// create makes schema with ddl run in it (unqualified names) and returns a
// pool whose search_path is schema.
func create(t *testing.T, pool *pgxpool.Pool, schema, ddl string) *pgxpool.Pool {
	t.Helper()
	if _, err := pool.Exec(context.Background(), "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
	nest := nestjs.Pool(t, pool, schema)
	if _, err := nest.Exec(context.Background(), ddl); err != nil {
		t.Fatal(err)
	}
	return nest
}

// A table of that name that the outbox cannot use is not half-adopted: Up
// fails before changing anything, with an error naming the column and what
// to do about it.
func TestUpRefusesIncompatibleTable(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name, change string
		want         []string
	}{
		{"missing column", "ALTER TABLE outbox_event DROP COLUMN topic", []string{"has no column topic (text)", "add the column, or configure another table name"}},
		{"event_id text", "ALTER TABLE outbox_event ALTER COLUMN event_id TYPE text", []string{"column event_id is text, the outbox needs uuid", "ALTER COLUMN event_id TYPE uuid USING event_id::uuid"}},
		{"payload json", "ALTER TABLE outbox_event ALTER COLUMN payload TYPE json", []string{"column payload is json, the outbox needs jsonb"}},
		{"integer id", "ALTER TABLE outbox_event ALTER COLUMN id TYPE integer", []string{"column id is integer, the outbox needs bigint"}},
		{"timestamp without time zone", "ALTER TABLE outbox_event ALTER COLUMN created_at TYPE timestamp", []string{"column created_at is timestamp without time zone, the outbox needs timestamp with time zone"}},
		{"nullable key", "ALTER TABLE outbox_event ALTER COLUMN partition_key DROP NOT NULL", []string{"column partition_key allows NULL", "ALTER COLUMN partition_key SET NOT NULL"}},
		{"published_at not null", "ALTER TABLE outbox_event ALTER COLUMN published_at SET NOT NULL", []string{"column published_at is NOT NULL", "ALTER COLUMN published_at DROP NOT NULL"}},
		{"created_at without default", "ALTER TABLE outbox_event ALTER COLUMN created_at DROP DEFAULT", []string{"column created_at has no default", "SET DEFAULT now()"}},
		{"id without identity", "ALTER TABLE outbox_event ALTER COLUMN id DROP IDENTITY", []string{"column id has no default (or identity)", "ADD GENERATED BY DEFAULT AS IDENTITY"}},
		{"event_id not unique", "ALTER TABLE outbox_event DROP CONSTRAINT outbox_event_event_id_key", []string{"column event_id is not unique", "ADD UNIQUE (event_id)"}},
		{"headers of another type", "ALTER TABLE outbox_event ADD COLUMN headers text", []string{"column headers is text, the outbox needs jsonb"}},
		{"NOT NULL column of its own", "ALTER TABLE outbox_event ADD COLUMN tenant text NOT NULL", []string{"column tenant is NOT NULL without a default", "SET DEFAULT"}},
		{"migrated before", "ALTER TABLE outbox_event ADD COLUMN headers jsonb, ADD COLUMN attempts integer NOT NULL DEFAULT 0", []string{"already has the column attempts of a later outbox migration", "record the migrations it has as applied"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tbl := outbox.Table{Schema: testenv.Name("nest_")}
			nest := nestjs.Create(t, pool, tbl.Schema)
			if _, err := nest.Exec(ctx, tc.change); err != nil {
				t.Fatal(err)
			}
			cols := func() string {
				var s string
				if err := pool.QueryRow(ctx, "SELECT string_agg(attname || ' ' || format_type(atttypid, atttypmod), ', ' ORDER BY attnum) FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped", sqlname.Ident(tbl)).Scan(&s); err != nil {
					t.Fatal(err)
				}
				return s
			}
			was := cols()
			err := migrations.Outbox.Up(ctx, pool, tbl)
			if err == nil {
				t.Fatal("Up adopted the table")
			}
			msg := err.Error()
			want := append([]string{fmt.Sprintf("cannot adopt the existing table %s: ", tbl)}, tc.want...)
			for _, w := range want {
				if !strings.Contains(msg, w) {
					t.Errorf("Up = %v\nwant it to say %q", err, w)
				}
			}
			if now := cols(); now != was {
				t.Errorf("the table changed:\n before %s\n after  %s", was, now)
			}
			if v, err := applied(t, pool, tbl); err != nil || len(v) != 0 {
				t.Errorf("Applied = %v, %v: want nothing recorded", v, err)
			}
		})
	}
}

// released000001 is the first migration as released before it adopted
// existing tables.
const released000001 = `CREATE TABLE outbox_event (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id       uuid        NOT NULL UNIQUE,
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    event_type     text        NOT NULL,
    payload        jsonb       NOT NULL,
    topic          text        NOT NULL,
    partition_key  text        NOT NULL,
    headers        jsonb,
    created_at     timestamptz NOT NULL DEFAULT now(),
    published_at   timestamptz
);
CREATE INDEX outbox_event_unpublished_idx
    ON outbox_event (id)
    WHERE published_at IS NULL;`

// On an empty schema the first migration creates exactly what it created
// before it learned to adopt tables: the same columns in the same order,
// the same defaults, constraints and indexes. Users who applied it have the
// same schema as those who apply it now.
func TestUpCreatesTheReleasedSchema(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	ctx := context.Background()
	all, err := migrations.Outbox.All(outbox.Table{})
	if err != nil {
		t.Fatal(err)
	}
	schemas := [2]string{testenv.Name("released_"), testenv.Name("now_")}
	for i, s := range schemas {
		if _, err := pool.Exec(ctx, "CREATE SCHEMA "+s); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA "+s+" CASCADE") })
		db := nestjs.Pool(t, pool, s)
		sqls := []string{all[0].Up}
		if i == 0 {
			sqls[0] = released000001
		}
		for _, m := range all[1:] {
			sqls = append(sqls, m.Up)
		}
		for _, sql := range sqls {
			if _, err := db.Exec(ctx, sql); err != nil {
				t.Fatal(err)
			}
		}
	}
	describe := func(s string) string {
		var out string
		err := pool.QueryRow(ctx, `SELECT
			(SELECT string_agg(format('%s %s notnull=%s default=%s identity=%s', attname, format_type(atttypid, atttypmod), attnotnull,
				pg_get_expr(d.adbin, d.adrelid), attidentity), E'\n' ORDER BY attnum)
			   FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
			  WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped) || E'\n' ||
			(SELECT string_agg(replace(indexdef, $2, 'S'), E'\n' ORDER BY indexname) FROM pg_indexes WHERE schemaname = $2) || E'\n' ||
			(SELECT string_agg(conname || ' ' || pg_get_constraintdef(oid), E'\n' ORDER BY conname) FROM pg_constraint WHERE conrelid = $1::regclass)`,
			s+".outbox_event", s).Scan(&out)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	if released, now := describe(schemas[0]), describe(schemas[1]); released != now {
		t.Errorf("the migrations create another schema than released:\nreleased:\n%s\nnow:\n%s", released, now)
	}
}
