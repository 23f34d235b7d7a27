package migrations_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/migrations"
)

// dropPublication drops the table's publication when the test ends:
// dropping the test's schema leaves publications behind.
func dropPublication(t *testing.T, pool *pgxpool.Pool, tbl outbox.Table) {
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP PUBLICATION IF EXISTS "+pgx.Identifier{tbl.Publication()}.Sanitize())
	})
}

// Stream.Up creates exactly FOR TABLE <table> WITH (publish = 'insert'),
// accepts it when run again, Check finds it, and Stream.Down drops it
// (twice is fine), after which Check says what to run.
func TestStreamUpDown(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	ctx := context.Background()
	tbl := testenv.Table(t, pool)
	dropPublication(t, pool, tbl)
	for range 2 {
		if err := migrations.Stream.Up(ctx, pool, tbl); err != nil {
			t.Fatal(err)
		}
	}
	if err := migrations.Stream.Check(ctx, pool, tbl); err != nil {
		t.Fatalf("Check after Up: %v", err)
	}
	p, err := migrations.ReadPublication(ctx, pool, tbl)
	if err != nil || !p.Exists || len(p.Problems()) > 0 || p.Fix(tbl) != "" {
		t.Fatalf("after Stream.Up: %+v, %v; problems %v", p, err, p.Problems())
	}
	var insert, update, del, trunc bool
	var tables []string
	err = pool.QueryRow(ctx, "SELECT pubinsert, pubupdate, pubdelete, pubtruncate, (SELECT array_agg(schemaname || '.' || tablename) FROM pg_publication_tables WHERE pubname = $1) FROM pg_publication WHERE pubname = $1",
		tbl.Publication()).Scan(&insert, &update, &del, &trunc, &tables)
	if err != nil || !insert || update || del || trunc || len(tables) != 1 || tables[0] != tbl.String() {
		t.Fatalf("publication: insert %v update %v delete %v truncate %v tables %v (%v)", insert, update, del, trunc, tables, err)
	}
	for range 2 {
		if err := migrations.Stream.Down(ctx, pool, tbl, 0); err != nil {
			t.Fatal(err)
		}
	}
	if p, err := migrations.ReadPublication(ctx, pool, tbl); err != nil || p.Exists || !slices.Equal(p.Problems(), []string{"does not exist"}) || !strings.HasPrefix(p.Fix(tbl), "CREATE PUBLICATION") {
		t.Fatalf("after Stream.Down: %+v, %v", p, err)
	}
	if err := migrations.Stream.Check(ctx, pool, tbl); !errors.Is(err, migrations.ErrPublicationMismatch) || !strings.Contains(err.Error(), "does not exist") || !strings.Contains(err.Error(), "migrations.Stream.Up") {
		t.Fatalf("Check after Down = %v, want ErrPublicationMismatch saying it does not exist and what to run", err)
	}
	// Without the table: an error that says to run the migrations.
	missing := outbox.Table{Schema: tbl.Schema, Name: "no_such_table"}
	if err := migrations.Stream.Up(ctx, pool, missing); !errors.Is(err, migrations.ErrNoTable) {
		t.Fatalf("Stream.Up without the table: %v, want ErrNoTable", err)
	}
}

// An existing publication of that name that is not what the relay reads is
// an error saying what differs and how to fix it; the fix it names works.
func TestStreamUpRefusesAWrongPublication(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name, create, want string
	}{
		{"updates", "CREATE PUBLICATION $P FOR TABLE $T WITH (publish = 'insert, update, delete')", "also publishes update, delete"},
		{"truncate", "CREATE PUBLICATION $P FOR TABLE $T", "also publishes update, delete, truncate"},
		{"no inserts", "CREATE PUBLICATION $P FOR TABLE $T WITH (publish = 'truncate')", "does not publish inserts"},
		{"other table", "CREATE PUBLICATION $P FOR TABLE $T, $O WITH (publish = 'insert')", "also publishes 1 other table(s) ($S.other)"},
		{"without the table", "CREATE PUBLICATION $P FOR TABLE $O WITH (publish = 'insert')", "does not include the outbox table"},
		{"empty", "CREATE PUBLICATION $P", "does not include the outbox table"},
		{"row filter", "CREATE PUBLICATION $P FOR TABLE $T WHERE (topic <> 'x') WITH (publish = 'insert')", "has a row filter"},
		{"column list", "CREATE PUBLICATION $P FOR TABLE $T (id, event_id, payload) WITH (publish = 'insert')", "has a column list without aggregate_type"},
		{"all tables", "CREATE PUBLICATION $P FOR ALL TABLES WITH (publish = 'insert')", "is FOR ALL TABLES"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tbl := testenv.Table(t, pool)
			dropPublication(t, pool, tbl)
			other := pgx.Identifier{tbl.Schema, "other"}.Sanitize()
			if _, err := pool.Exec(ctx, "CREATE TABLE "+other+" (id int PRIMARY KEY)"); err != nil {
				t.Fatal(err)
			}
			r := strings.NewReplacer("$P", pgx.Identifier{tbl.Publication()}.Sanitize(), "$T", sqlname.Ident(tbl), "$O", other, "$S", tbl.Schema)
			if _, err := pool.Exec(ctx, r.Replace(tc.create)); err != nil {
				t.Fatal(err)
			}
			upErr := migrations.Stream.Up(ctx, pool, tbl)
			if !errors.Is(upErr, migrations.ErrPublicationMismatch) || !strings.Contains(upErr.Error(), r.Replace(tc.want)) {
				t.Fatalf("Stream.Up = %v, want ErrPublicationMismatch saying %q", upErr, r.Replace(tc.want))
			}
			p, err := migrations.ReadPublication(ctx, pool, tbl)
			if err != nil {
				t.Fatal(err)
			}
			fix := p.Fix(tbl)
			if fix == "" || !strings.Contains(upErr.Error(), fix) {
				t.Fatalf("Stream.Up's error %q does not name the fix %q", upErr, fix)
			}
			if _, err := pool.Exec(ctx, fix); err != nil {
				t.Fatalf("the fix %q fails: %v", fix, err)
			}
			if err := migrations.Stream.Up(ctx, pool, tbl); err != nil {
				t.Fatalf("after the fix %q: %v", fix, err)
			}
		})
	}
}

func TestStreamAll(t *testing.T) {
	tbl := outbox.Table{Schema: "app", Name: "Ev"}
	all, err := migrations.Stream.All(tbl)
	if err != nil || len(all) != 1 || !strings.Contains(all[0].Up, `FOR TABLE "app"."Ev" WITH (publish = 'insert')`) || !strings.Contains(all[0].Down, "DROP PUBLICATION IF EXISTS") {
		t.Fatalf("Stream.All = %+v, %v", all, err)
	}
}
