package tooltest_test

import (
	"context"
	"database/sql"
	"errors"
	"io/fs"
	"sync"
	"testing"

	gomigrate "github.com/golang-migrate/migrate/v4"
	migratepgx "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/nestjs"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/migrations"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// The partitioned migration and the cursor migration on top of it, with
// each tool (twice: the second run has nothing to do): the table is
// partitioned, a cursor relay delivers an event, and reverting both (cursor
// first) leaves no outbox table.
func TestPartitionedWithEachTool(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	ctx := context.Background()
	type steps struct{ up, down func(t *testing.T) }
	for _, tc := range []struct {
		tool string
		run  func(t *testing.T, s string) steps
	}{
		// golang-migrate reads the folders as they are, for outbox_event in
		// the connection's search_path, each with a version table of its own.
		{"golang-migrate", func(t *testing.T, s string) steps {
			db := stdlib.OpenDBFromPool(nestjs.Pool(t, pool, s))
			t.Cleanup(func() { _ = db.Close() })
			part := gomigrateOn(t, db, migrations.Partitioned.FS(), ".", "outbox_event_partitioned_migrations")
			cur := gomigrateOn(t, db, migrations.Cursor.FS(), ".", "outbox_event_cursor_migrations")
			up := func(t *testing.T) {
				for _, m := range []*gomigrate.Migrate{part, cur} {
					if err := m.Up(); err != nil && !errors.Is(err, gomigrate.ErrNoChange) {
						t.Fatalf("golang-migrate up: %v", err)
					}
				}
			}
			down := func(t *testing.T) {
				for _, m := range []*gomigrate.Migrate{cur, part} {
					if err := m.Down(); err != nil {
						t.Fatalf("golang-migrate down: %v", err)
					}
				}
			}
			return steps{up, down}
		}},
		{"goose", func(t *testing.T, s string) steps {
			db := stdlib.OpenDBFromPool(pool)
			t.Cleanup(func() { _ = db.Close() })
			var ps []*goose.Provider
			for _, render := range []func(outbox.Table) (fs.FS, string, error){migrations.Partitioned.Goose, migrations.Cursor.Goose} {
				fsys, versions, err := render(outbox.Table{Schema: s})
				if err != nil {
					t.Fatal(err)
				}
				p, err := goose.NewProvider(goose.DialectPostgres, db, fsys, goose.WithTableName(versions))
				if err != nil {
					t.Fatal(err)
				}
				ps = append(ps, p)
			}
			return steps{func(t *testing.T) {
				for _, p := range ps {
					if _, err := p.Up(ctx); err != nil {
						t.Fatalf("goose up: %v", err)
					}
				}
			}, func(t *testing.T) {
				for _, p := range []*goose.Provider{ps[1], ps[0]} {
					if _, err := p.DownTo(ctx, 0); err != nil {
						t.Fatalf("goose down: %v", err)
					}
				}
			}}
		}},
		{"tern", func(t *testing.T, s string) steps {
			pc, err := pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pc.Release)
			fsys, versions, err := migrations.Partitioned.Tern(outbox.Table{Schema: s})
			if err != nil {
				t.Fatal(err)
			}
			part := migrator(t, pc.Conn(), versions, fsys)
			if fsys, versions, err = migrations.Cursor.Tern(outbox.Table{Schema: s}); err != nil {
				t.Fatal(err)
			}
			cur := migrator(t, pc.Conn(), versions, fsys)
			return steps{func(t *testing.T) {
				for _, m := range []interface{ Migrate(context.Context) error }{part, cur} {
					if err := m.Migrate(ctx); err != nil {
						t.Fatalf("tern migrate: %v", err)
					}
				}
			}, func(t *testing.T) {
				if err := cur.MigrateTo(ctx, 0); err != nil {
					t.Fatal(err)
				}
				if err := part.MigrateTo(ctx, 0); err != nil {
					t.Fatal(err)
				}
			}}
		}},
	} {
		t.Run(tc.tool, func(t *testing.T) {
			t.Parallel()
			s := schema(t, pool, "part_")
			tbl := outbox.Table{Schema: s}
			st := tc.run(t, s)
			st.up(t)
			st.up(t)
			var kind string
			if err := pool.QueryRow(ctx, "SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)", ident(tbl)).Scan(&kind); err != nil || kind != "p" {
				t.Fatalf("relkind %q (%v), want p", kind, err)
			}
			if err := migrations.Cursor.Check(ctx, pool, tbl); err != nil {
				t.Fatal(err)
			}
			checkCursorWorks(t, pool, tbl)
			st.down(t)
			if err := migrations.Outbox.Check(ctx, pool, tbl); !errors.Is(err, migrations.ErrNoTable) {
				t.Fatalf("after down: %v, want no table", err)
			}
		})
	}
}

func gomigrateOn(t *testing.T, db *sql.DB, fsys fs.FS, dir, versions string) *gomigrate.Migrate {
	t.Helper()
	src, err := iofs.New(fsys, dir)
	if err != nil {
		t.Fatal(err)
	}
	drv, err := migratepgx.WithInstance(db, &migratepgx.Config{MigrationsTable: versions})
	if err != nil {
		t.Fatal(err)
	}
	m, err := gomigrate.NewWithInstance("iofs", src, "pgx5", drv)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = m.Close() }) // it holds a connection of db
	return m
}

// checkCursorWorks writes an event through unitofwork into table and has a
// cursor relay publish it once.
func checkCursorWorks(t *testing.T, pool *pgxpool.Pool, table outbox.Table) {
	t.Helper()
	ctx := context.Background()
	uow, err := unitofwork.New(pool, &unitofwork.Config{Service: "payment-service", Table: table})
	if err != nil {
		t.Fatal(err)
	}
	err = uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		return tx.Add(ctx, outbox.Event{AggregateType: "payment", AggregateID: "p-1", Type: "payment.captured.v1", Payload: map[string]int{"cents": 1250}})
	})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		msgs []relay.Message
	)
	r, err := relay.New(pool, relay.PublisherFunc(func(_ context.Context, batch []relay.Message) error {
		mu.Lock()
		defer mu.Unlock()
		msgs = append(msgs, batch...)
		return nil
	}), &relay.Config{Table: table, Progress: relay.ProgressCursor})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := r.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(msgs) != 1 || string(msgs[0].Key) != "p-1" {
		t.Fatalf("published %+v, want the one event", msgs)
	}
}
