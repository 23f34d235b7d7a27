package tooltest_test

import (
	"context"
	"io/fs"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/migrations"
)

// The streaming relay's publication, under goose and then tern, beside the
// outbox's migrations with a version table of its own: up creates exactly
// what the relay reads, down drops it and leaves the table.
func TestStreamWithGooseAndTern(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	ctx := context.Background()
	s := schema(t, pool, "stream_tools_")
	table := outbox.Table{Schema: s, Name: "payment_outbox"}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP PUBLICATION IF EXISTS "+pgx.Identifier{table.Publication()}.Sanitize())
	})
	published := func(want bool) {
		t.Helper()
		p, err := migrations.ReadPublication(ctx, pool, table)
		if err != nil {
			t.Fatal(err)
		}
		if p.Exists != want || (want && len(p.Problems()) > 0) {
			t.Fatalf("publication %+v (problems %v), want it to exist: %v", p, p.Problems(), want)
		}
	}

	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	var stream *goose.Provider
	for i, render := range []func(outbox.Table) (fs.FS, string, error){migrations.Outbox.Goose, migrations.Stream.Goose} {
		fsys, versions, err := render(table)
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
		if i == 1 {
			if versions != s+".payment_outbox_stream_goose_version" {
				t.Fatalf("version table %q", versions)
			}
			stream = p
		}
	}
	published(true)
	if _, err := stream.DownTo(ctx, 0); err != nil {
		t.Fatal(err)
	}
	published(false)
	if err := migrations.Outbox.Check(ctx, pool, table); err != nil {
		t.Fatalf("goose down of the publication touched the table: %v", err)
	}

	fsys, versions, err := migrations.Stream.Tern(table)
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
	published(true)
	if err := m.MigrateTo(ctx, 0); err != nil {
		t.Fatal(err)
	}
	published(false)
}
