package tooltest_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/jackc/tern/v2/migrate"
	"github.com/pressly/goose/v3"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/migrations"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// schema creates a schema for one test and drops it when the test ends.
func schema(t *testing.T, pool *pgxpool.Pool, prefix string) string {
	t.Helper()
	s := testenv.Name(prefix)
	if _, err := pool.Exec(context.Background(), "CREATE SCHEMA "+s); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA "+s+" CASCADE") })
	return s
}

// appMigrations are an application's own migrations, versions 1 to 3 like
// the outbox's, creating app_1 to app_3 in schema, with text that renders
// them in the tool's layout.
func appMigrations(schema string, file func(v int, up, down string) (string, string)) fstest.MapFS {
	fsys := fstest.MapFS{}
	for v := 1; v <= 3; v++ {
		name, content := file(v, fmt.Sprintf("CREATE TABLE %s.app_%d (id int);", schema, v), fmt.Sprintf("DROP TABLE %s.app_%d;", schema, v))
		fsys[name] = &fstest.MapFile{Data: []byte(content)}
	}
	return fsys
}

// checkWorks writes an event through unitofwork into table and has the
// relay publish it once to a recording publisher.
func checkWorks(t *testing.T, pool *pgxpool.Pool, table outbox.Table) {
	t.Helper()
	ctx := context.Background()
	if err := migrations.Outbox.Check(ctx, pool, table); err != nil {
		t.Fatal(err)
	}
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
	}), &relay.Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := r.RunOnce(ctx); err != nil || n != 1 {
		t.Fatalf("RunOnce = %d, %v: want the event published", n, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(msgs) != 1 || msgs[0].Topic != "payment-service.payment.captured" || string(msgs[0].Key) != "p-1" {
		t.Fatalf("published %+v", msgs)
	}
	var published bool
	if err := pool.QueryRow(ctx, "SELECT published_at IS NOT NULL FROM "+ident(table)).Scan(&published); err != nil || !published {
		t.Fatalf("the row is not marked published (%v)", err)
	}
}

func checkAppTables(t *testing.T, pool *pgxpool.Pool, schema string, want bool) {
	t.Helper()
	for v := 1; v <= 3; v++ {
		var ok bool
		if err := pool.QueryRow(context.Background(), "SELECT to_regclass($1) IS NOT NULL", fmt.Sprintf("%s.app_%d", schema, v)).Scan(&ok); err != nil || ok != want {
			t.Fatalf("table %s.app_%d exists: %v (%v), want %v", schema, v, ok, err, want)
		}
	}
}

// goose applies the outbox migrations, for a table of another name and
// schema, in a version table of their own beside the application's
// migrations 1 to 3, and reverts them to nothing.
func TestGoose(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	ctx := context.Background()
	s := schema(t, pool, "goose_")
	table := outbox.Table{Schema: s, Name: "payment_outbox"}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()

	app, err := goose.NewProvider(goose.DialectPostgres, db, appMigrations(s, func(v int, up, down string) (string, string) {
		return fmt.Sprintf("%05d_app_%d.sql", v, v), "-- +goose Up\n" + up + "\n-- +goose Down\n" + down + "\n"
	}), goose.WithTableName(s+".goose_db_version"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := app.Up(ctx); err != nil {
		t.Fatal(err)
	}

	fsys, versions, err := migrations.Outbox.Goose(table)
	if err != nil {
		t.Fatal(err)
	}
	if versions != s+".payment_outbox_goose_version" {
		t.Fatalf("version table %q", versions)
	}
	outboxMigrations, err := goose.NewProvider(goose.DialectPostgres, db, fsys, goose.WithTableName(versions))
	if err != nil {
		t.Fatal(err)
	}
	res, err := outboxMigrations.Up(ctx)
	if err != nil || len(res) != 3 {
		t.Fatalf("goose up: %d applied, %v", len(res), err)
	}
	if res, err := outboxMigrations.Up(ctx); err != nil || len(res) != 0 {
		t.Fatalf("goose up again: %d applied, %v", len(res), err)
	}
	if v, err := outboxMigrations.GetDBVersion(ctx); err != nil || v != 3 {
		t.Fatalf("outbox version %d, %v", v, err)
	}
	checkWorks(t, pool, table)
	checkAppTables(t, pool, s, true)

	if _, err := outboxMigrations.DownTo(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Outbox.Check(ctx, pool, table); !errors.Is(err, migrations.ErrNoTable) {
		t.Fatalf("after goose down-to 0: %v, want no table", err)
	}
	// Only goose's own tables are left (with their sequences and keys).
	rows, _ := pool.Query(ctx, "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relkind = 'r'", s)
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	slices.Sort(left)
	if err != nil || !slices.Equal(left, []string{"app_1", "app_2", "app_3", "goose_db_version", "payment_outbox_goose_version"}) {
		t.Fatalf("tables left after down: %v (%v), want the application's and the version tables", left, err)
	}
	if v, err := outboxMigrations.GetDBVersion(ctx); err != nil || v != 0 {
		t.Fatalf("outbox version after down %d, %v", v, err)
	}
	if v, err := app.GetDBVersion(ctx); err != nil || v != 3 {
		t.Fatalf("the application's version is %d (%v), want 3 untouched", v, err)
	}
	checkAppTables(t, pool, s, true)
}

// tern does the same, with a mixed-case table name (quoted in the SQL, the
// version table lower-case).
func TestTern(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	ctx := context.Background()
	s := schema(t, pool, "tern_")
	table := outbox.Table{Schema: s, Name: "PaymentOutbox"}
	pc, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Release()
	conn := pc.Conn()

	app := migrator(t, conn, s+".schema_version", appMigrations(s, func(v int, up, down string) (string, string) {
		return fmt.Sprintf("%03d_app_%d.sql", v, v), up + "\n---- create above / drop below ----\n" + down + "\n"
	}))
	if err := app.Migrate(ctx); err != nil {
		t.Fatal(err)
	}

	fsys, versions, err := migrations.Outbox.Tern(table)
	if err != nil {
		t.Fatal(err)
	}
	if versions != s+".paymentoutbox_tern_version" {
		t.Fatalf("version table %q", versions)
	}
	m := migrator(t, conn, versions, fsys)
	if len(m.Migrations) != 3 {
		t.Fatalf("tern loaded %d migrations", len(m.Migrations))
	}
	for range 2 { // the second run has nothing to do
		if err := m.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if v, err := m.GetCurrentVersion(ctx); err != nil || v != 3 {
		t.Fatalf("outbox version %d, %v", v, err)
	}
	checkWorks(t, pool, table)
	checkAppTables(t, pool, s, true)

	if err := m.MigrateTo(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Outbox.Check(ctx, pool, table); !errors.Is(err, migrations.ErrNoTable) {
		t.Fatalf("after tern migrate to 0: %v, want no table", err)
	}
	rows, _ := pool.Query(ctx, "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1", s)
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	slices.Sort(left)
	if err != nil || !slices.Equal(left, []string{"app_1", "app_2", "app_3", "paymentoutbox_tern_version", "schema_version"}) {
		t.Fatalf("relations left after down: %v (%v), want the application's and the version tables", left, err)
	}
	if v, err := app.GetCurrentVersion(ctx); err != nil || v != 3 {
		t.Fatalf("the application's version is %d (%v), want 3 untouched", v, err)
	}
}

func migrator(t *testing.T, conn *pgx.Conn, versions string, fsys fs.FS) *migrate.Migrator {
	t.Helper()
	m, err := migrate.NewMigrator(context.Background(), conn, versions)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.LoadMigrations(fsys); err != nil {
		t.Fatal(err)
	}
	return m
}

// ident quotes t's schema-qualified name for SQL text.
func ident(t outbox.Table) string {
	t = t.WithDefaults()
	if t.Schema == "" {
		return pgx.Identifier{t.Name}.Sanitize()
	}
	return pgx.Identifier{t.Schema, t.Name}.Sanitize()
}
