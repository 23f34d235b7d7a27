package tooltest_test

import (
	"context"
	"io/fs"
	"testing"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/migrations"
)

// The inbox migrations run under goose and tern beside the outbox's in one
// schema, each family with its own version table, and go down again.
func TestInboxWithGooseAndTern(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	ctx := context.Background()
	s := schema(t, pool, "inbox_tools_")
	outboxTable, inboxTable := outbox.Table{Schema: s}, outbox.Table{Schema: s, Name: "billing_inbox"}
	exists := func(name string) bool {
		var ok bool
		if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", ident(outbox.Table{Schema: s, Name: name})).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}

	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	var providers []*goose.Provider
	for _, render := range []func() (fs.FS, string, error){
		func() (fs.FS, string, error) { return migrations.Outbox.Goose(outboxTable) },
		func() (fs.FS, string, error) { return migrations.Inbox.Goose(inboxTable) },
	} {
		fsys, versions, err := render()
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
		providers = append(providers, p)
	}
	if !exists("outbox_event") || !exists("billing_inbox") || !exists("billing_inbox_parked") || !exists("billing_inbox_goose_version") {
		t.Fatal("goose did not create the outbox and the inbox tables")
	}
	if _, err := providers[1].DownTo(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if exists("billing_inbox") || exists("billing_inbox_parked") || !exists("outbox_event") {
		t.Fatal("goose down of the inbox must drop its tables only")
	}

	fsys, versions, err := migrations.Inbox.Tern(inboxTable)
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
		t.Fatal(err)
	}
	if !exists("billing_inbox") || !exists("billing_inbox_parked") {
		t.Fatal("tern did not create the inbox tables")
	}
	if err := m.MigrateTo(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if exists("billing_inbox") {
		t.Fatal("tern migrate to 0 left the inbox table")
	}
}
