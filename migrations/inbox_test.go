package migrations_test

import (
	"context"
	"errors"
	"io/fs"
	"strings"
	"testing"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/migrations"
)

func TestInboxUpDown(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	ctx := context.Background()
	for _, tbl := range []outbox.Table{{Schema: testenv.Name("mi_")}, {Schema: testenv.Name("mi_"), Name: "Inbox"}} {
		t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA "`+tbl.Schema+`" CASCADE`) })
		for range 2 { // idempotent
			if err := migrations.Inbox.Up(ctx, pool, tbl); err != nil {
				t.Fatal(err)
			}
		}
		name := sqlname.Inbox(tbl).Name
		if err := migrations.Inbox.Check(ctx, pool, tbl); err != nil {
			t.Fatalf("after Inbox.Up: %v", err)
		}
		var versions bool
		if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", sqlname.Ident(outbox.Table{Schema: tbl.Schema, Name: name + "_migrations"})).Scan(&versions); err != nil || !versions {
			t.Fatalf("after Inbox.Up: no versions table (%v)", err)
		}
		// The outbox's migrations are not mixed in: the inbox's versions are its own.
		if err := migrations.Outbox.Check(ctx, pool, outbox.Table{Schema: tbl.Schema}); err == nil {
			t.Fatal("Inbox.Up created the outbox table")
		}
		if err := migrations.Inbox.Down(ctx, pool, tbl, 0); err != nil {
			t.Fatal(err)
		}
		if err := migrations.Inbox.Check(ctx, pool, tbl); !errors.Is(err, migrations.ErrNoTable) {
			t.Fatalf("after Inbox.Down: Inbox.Check = %v, want ErrNoTable", err)
		}
	}
}

func TestInboxToolLayouts(t *testing.T) {
	tbl := outbox.Table{Schema: "billing"}
	for _, tc := range []struct {
		fn            func(outbox.Table) (fs.FS, string, error)
		file, version string
	}{
		{migrations.Inbox.Goose, "00001_create_outbox_inbox.sql", "billing.outbox_inbox_goose_version"},
		{migrations.Inbox.Tern, "001_create_outbox_inbox.sql", "billing.outbox_inbox_tern_version"},
	} {
		fsys, version, err := tc.fn(tbl)
		if err != nil {
			t.Fatal(err)
		}
		if version != tc.version {
			t.Errorf("version table %q, want %q", version, tc.version)
		}
		b, err := fs.ReadFile(fsys, tc.file)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{`CREATE TABLE "billing"."outbox_inbox" (`, `CREATE TABLE "billing"."outbox_inbox_parked" (`, `DROP TABLE IF EXISTS "billing"."outbox_inbox_parked"`} {
			if !strings.Contains(string(b), want) {
				t.Errorf("%s lacks %q:\n%s", tc.file, want, b)
			}
		}
	}
}
