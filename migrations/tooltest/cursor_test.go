package tooltest_test

import (
	"context"
	"errors"
	"testing"

	gomigrate "github.com/golang-migrate/migrate/v4"
	migratepgx "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/nestjs"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/migrations"
)

// The cursor set (txid, the positions table, the parked table) under
// golang-migrate (the folder migrations/cursor as it is), goose and tern,
// each beside the outbox's migrations with a version table of its own: up
// creates what the cursor relay needs, down drops it and leaves the table
// as the outbox's migrations made it.
func TestCursorWithEachTool(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	ctx := context.Background()
	type run func(t *testing.T, s string, up bool)
	for _, tc := range []struct {
		tool string
		run  run
	}{
		{"golang-migrate", func(t *testing.T, s string, up bool) {
			db := stdlib.OpenDBFromPool(nestjs.Pool(t, pool, s))
			defer db.Close()
			src, err := iofs.New(migrations.Cursor.FS(), ".")
			if err != nil {
				t.Fatal(err)
			}
			drv, err := migratepgx.WithInstance(db, &migratepgx.Config{MigrationsTable: "outbox_event_cursor_migrations"})
			if err != nil {
				t.Fatal(err)
			}
			m, err := gomigrate.NewWithInstance("iofs", src, "pgx5", drv)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if !up {
				if err := m.Down(); err != nil {
					t.Fatalf("golang-migrate down: %v", err)
				}
				return
			}
			if err := m.Up(); err != nil && !errors.Is(err, gomigrate.ErrNoChange) {
				t.Fatalf("golang-migrate up: %v", err)
			}
			if v, dirty, err := m.Version(); err != nil || v != 2 || dirty {
				t.Fatalf("golang-migrate version %d, dirty %v (%v)", v, dirty, err)
			}
		}},
		{"goose", func(t *testing.T, s string, up bool) {
			fsys, versions, err := migrations.Cursor.Goose(outbox.Table{Schema: s})
			if err != nil {
				t.Fatal(err)
			}
			db := stdlib.OpenDBFromPool(pool)
			defer db.Close()
			p, err := goose.NewProvider(goose.DialectPostgres, db, fsys, goose.WithTableName(versions))
			if err != nil {
				t.Fatal(err)
			}
			if !up {
				if _, err := p.DownTo(ctx, 0); err != nil {
					t.Fatalf("goose down: %v", err)
				}
				return
			}
			if _, err := p.Up(ctx); err != nil {
				t.Fatalf("goose up: %v", err)
			}
			if v, err := p.GetDBVersion(ctx); err != nil || v != 2 {
				t.Fatalf("goose version %d, %v", v, err)
			}
		}},
		{"tern", func(t *testing.T, s string, up bool) {
			fsys, versions, err := migrations.Cursor.Tern(outbox.Table{Schema: s})
			if err != nil {
				t.Fatal(err)
			}
			pc, err := pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer pc.Release()
			m := migrator(t, pc.Conn(), versions, fsys)
			target := int32(0)
			if up {
				target = 2
			}
			if err := m.MigrateTo(ctx, target); err != nil {
				t.Fatalf("tern to %d: %v", target, err)
			}
		}},
	} {
		t.Run(tc.tool, func(t *testing.T) {
			t.Parallel()
			s := schema(t, pool, "cursor_tools_")
			table := outbox.Table{Schema: s}
			if err := migrations.Outbox.Up(ctx, pool, table); err != nil {
				t.Fatal(err)
			}
			tc.run(t, s, true)
			tc.run(t, s, true) // nothing more to do
			checkCursorSet(t, pool, table, true)
			tc.run(t, s, false)
			checkCursorSet(t, pool, table, false)
			if err := migrations.Outbox.Check(ctx, pool, table); err != nil {
				t.Fatalf("%s down of the cursor set broke the table: %v", tc.tool, err)
			}
		})
	}
}

// checkCursorSet checks that the cursor set's objects exist (want) or not.
func checkCursorSet(t *testing.T, pool *pgxpool.Pool, table outbox.Table, want bool) {
	t.Helper()
	var positions, parked, txid, firstFailed bool
	err := pool.QueryRow(context.Background(), "SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL,"+
		" EXISTS (SELECT FROM pg_attribute WHERE attrelid = $3::regclass AND attname = 'txid' AND NOT attisdropped),"+
		" EXISTS (SELECT FROM pg_attribute WHERE attrelid = $3::regclass AND attname = 'first_failed_at' AND NOT attisdropped)",
		ident(sqlname.Cursor(table)), ident(sqlname.Parked(table)), ident(table)).Scan(&positions, &parked, &txid, &firstFailed)
	if err != nil {
		t.Fatal(err)
	}
	if positions != want || parked != want || txid != want || firstFailed != want {
		t.Errorf("positions table %v, parked table %v, txid %v, first_failed_at %v; want all %v", positions, parked, txid, firstFailed, want)
	}
}
