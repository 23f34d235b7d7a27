package migrations_test

import (
	"context"
	"fmt"
	"io/fs"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/migrations"
)

// Up creates the outbox table of any name and schema, or brings it to the
// latest version; a second call, as at every start, changes nothing.
// CheckTable is what a relay runs when it does not migrate.
func ExampleUp() {
	pool, table, cleanup := testenv.ExampleDB() // a fresh schema on DATABASE_URL
	defer cleanup()
	ctx := context.Background()
	audit := outbox.Table{Schema: table.Schema, Name: "audit_outbox"}

	fmt.Println("up:", migrations.Up(ctx, pool, audit))
	fmt.Println("again:", migrations.Up(ctx, pool, audit))
	fmt.Println("check:", migrations.CheckTable(ctx, pool, audit))
	fmt.Println("another table:", migrations.CheckTable(ctx, pool, outbox.Table{Schema: table.Schema, Name: "missing"}) != nil)
	// Output:
	// up: <nil>
	// again: <nil>
	// check: <nil>
	// another table: true
}

// Goose renders the migrations for a table and names a version table of
// their own, to pass to goose.NewProvider with goose.WithTableName.
func ExampleGoose() {
	fsys, versions, err := migrations.Goose(outbox.Table{Schema: "billing", Name: "payment_outbox"})
	if err != nil {
		panic(err)
	}
	files, _ := fs.Glob(fsys, "*.sql")
	fmt.Println(versions)
	fmt.Println(files[0])
	// Output:
	// billing.payment_outbox_goose_version
	// 00001_create_outbox_event.sql
}

// Tern does the same for tern's migrate.NewMigrator and LoadMigrations.
func ExampleTern() {
	_, versions, err := migrations.Tern(outbox.Table{})
	if err != nil {
		panic(err)
	}
	fmt.Println(versions)
	// Output: outbox_event_tern_version
}
