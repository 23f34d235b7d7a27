package tooltest_test

import (
	"context"
	"errors"
	"io/fs"
	"testing"

	gomigrate "github.com/golang-migrate/migrate/v4"
	migratepgx "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/nestjs"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/migrations"
)

// Each tool takes over a table created with the NestJS design's DDL holding
// 100 rows, 49 of them published: nothing lost or rewritten, every row's
// columns as they were, ids going on after the last one (see
// nestjs.RequireAdopted), and a second run has nothing to do.
func TestToolsAdoptNestJSTable(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	ctx := context.Background()
	for _, tc := range []struct {
		tool string
		up   func(t *testing.T, s string) // applies every migration; called twice
	}{
		// golang-migrate reads the up/down files as they are, for outbox_event
		// in the connection's search_path, with a version table of their own.
		{"golang-migrate", func(t *testing.T, s string) {
			db := stdlib.OpenDBFromPool(nestjs.Pool(t, pool, s))
			defer db.Close()
			src, err := iofs.New(migrations.Outbox.FS(), ".")
			if err != nil {
				t.Fatal(err)
			}
			drv, err := migratepgx.WithInstance(db, &migratepgx.Config{MigrationsTable: "outbox_event_migrate_version"})
			if err != nil {
				t.Fatal(err)
			}
			m, err := gomigrate.NewWithInstance("iofs", src, "pgx5", drv)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if err := m.Up(); err != nil && !errors.Is(err, gomigrate.ErrNoChange) {
				t.Fatalf("golang-migrate up: %v", err)
			}
			if v, dirty, err := m.Version(); err != nil || v != 3 || dirty {
				t.Fatalf("golang-migrate version %d, dirty %v (%v)", v, dirty, err)
			}
		}},
		{"goose", func(t *testing.T, s string) {
			fsys, versions, err := migrations.Outbox.Goose(outbox.Table{Schema: s})
			if err != nil {
				t.Fatal(err)
			}
			db := stdlib.OpenDBFromPool(pool)
			defer db.Close()
			p, err := goose.NewProvider(goose.DialectPostgres, db, fsys, goose.WithTableName(versions))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := p.Up(ctx); err != nil {
				t.Fatalf("goose up: %v", err)
			}
			if v, err := p.GetDBVersion(ctx); err != nil || v != 3 {
				t.Fatalf("goose version %d, %v", v, err)
			}
		}},
		{"tern", func(t *testing.T, s string) {
			fsys, versions, err := migrations.Outbox.Tern(outbox.Table{Schema: s})
			if err != nil {
				t.Fatal(err)
			}
			pc, err := pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer pc.Release()
			m := migrator(t, pc.Conn(), versions, fsys)
			if err := m.Migrate(ctx); err != nil {
				t.Fatalf("tern migrate: %v", err)
			}
			if v, err := m.GetCurrentVersion(ctx); err != nil || v != 3 {
				t.Fatalf("tern version %d, %v", v, err)
			}
		}},
	} {
		t.Run(tc.tool, func(t *testing.T) {
			t.Parallel()
			tbl := outbox.Table{Schema: testenv.Name("nest_")}
			nest := nestjs.Create(t, pool, tbl.Schema)
			nestjs.Fill(t, nest, 100, 7, 49, "order-service.order.confirmed")
			before, node := nestjs.Snapshot(t, pool, tbl)
			tc.up(t, tbl.Schema)
			tc.up(t, tbl.Schema)
			if err := migrations.Outbox.Check(ctx, pool, tbl); err != nil {
				t.Fatal(err)
			}
			nestjs.RequireAdopted(t, pool, nest, tbl, before, node)
		})
	}
}

// The streaming relay's publication, with goose and tern, on an adopted
// table: it is what the relay reads. (The file golang-migrate reads names
// the default table's publication, one per database, so it is not run
// here beside the other tests; migrations.Stream.Up on an adopted table is
// exercised in internal/nestjs.)
func TestStreamOnAdoptedNestJSTable(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	ctx := context.Background()
	tbl := outbox.Table{Schema: testenv.Name("nest_")}
	nestjs.Create(t, pool, tbl.Schema)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP PUBLICATION IF EXISTS "+pgx.Identifier{tbl.Publication()}.Sanitize())
	})
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	var stream *goose.Provider
	for _, render := range []func(outbox.Table) (fs.FS, string, error){migrations.Outbox.Goose, migrations.Stream.Goose} {
		fsys, versions, err := render(tbl)
		if err != nil {
			t.Fatal(err)
		}
		p, err := goose.NewProvider(goose.DialectPostgres, db, fsys, goose.WithTableName(versions))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Up(ctx); err != nil {
			t.Fatalf("goose up (%s): %v", versions, err)
		}
		stream = p
	}
	published := func(want bool) {
		t.Helper()
		p, err := migrations.ReadPublication(ctx, pool, tbl)
		if err != nil || p.Exists != want || (want && len(p.Problems()) > 0) {
			t.Fatalf("publication %+v (problems %v, %v), want it to exist: %v", p, p.Problems(), err, want)
		}
	}
	published(true)
	if _, err := stream.DownTo(ctx, 0); err != nil {
		t.Fatal(err)
	}
	published(false)
	fsys, versions, err := migrations.Stream.Tern(tbl)
	if err != nil {
		t.Fatal(err)
	}
	pc, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Release()
	if err := migrator(t, pc.Conn(), versions, fsys).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	published(true)
}
