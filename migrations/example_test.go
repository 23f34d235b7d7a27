package migrations_test

import (
	"context"
	"fmt"
	"io/fs"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/migrations"
)

// Outbox.Up creates the outbox table of any name and schema, or brings it
// to the latest version; a second call, as at every start, changes nothing.
// Check is what a relay runs when it does not migrate.
func ExampleSet_Up() {
	pool, table, cleanup := testenv.ExampleDB() // a fresh schema on DATABASE_URL
	defer cleanup()
	ctx := context.Background()
	audit := outbox.Table{Schema: table.Schema, Name: "audit_outbox"}

	fmt.Println("up:", migrations.Outbox.Up(ctx, pool, audit))
	fmt.Println("again:", migrations.Outbox.Up(ctx, pool, audit))
	fmt.Println("check:", migrations.Outbox.Check(ctx, pool, audit))
	fmt.Println("another table:", migrations.Outbox.Check(ctx, pool, outbox.Table{Schema: table.Schema, Name: "missing"}) != nil)
	// Output:
	// up: <nil>
	// again: <nil>
	// check: <nil>
	// another table: true
}

// Goose renders the migrations for a table and names a version table of
// their own, to pass to goose.NewProvider with goose.WithTableName.
func ExampleSet_Goose() {
	fsys, versions, err := migrations.Outbox.Goose(outbox.Table{Schema: "billing", Name: "payment_outbox"})
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

// Tern does the same for tern's migrate.NewMigrator and LoadMigrations;
// each set has a version table of its own.
func ExampleSet_Tern() {
	for _, set := range []migrations.Set{migrations.Outbox, migrations.Cursor} {
		_, versions, err := set.Tern(outbox.Table{})
		if err != nil {
			panic(err)
		}
		fmt.Println(versions)
	}
	// Output:
	// outbox_event_tern_version
	// outbox_event_cursor_tern_version
}
