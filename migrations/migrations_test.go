package migrations_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/migrations"
)

func TestUpDownCustomTable(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	ctx := context.Background()
	tbl := outbox.Table{Schema: testenv.Name("m_"), Name: "Events"} // mixed case: must be quoted everywhere
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA "`+tbl.Schema+`" CASCADE`) })

	if err := migrations.Outbox.Check(ctx, pool, tbl); !errors.Is(err, migrations.ErrNoTable) || !strings.Contains(err.Error(), "migrations") {
		t.Fatalf("Outbox.Check before Up = %v, want ErrNoTable telling to migrate", err)
	}
	for range 2 { // idempotent
		if err := migrations.Outbox.Up(ctx, pool, tbl); err != nil {
			t.Fatal(err)
		}
	}
	if err := migrations.Outbox.Check(ctx, pool, tbl); err != nil {
		t.Fatal(err)
	}
	if v, err := applied(t, pool, tbl); err != nil || !slices.Equal(v, []int{1, 2, 3}) {
		t.Fatalf("Applied = %v, %v", v, err)
	}
	var def string
	err := pool.QueryRow(ctx, "SELECT indexdef FROM pg_indexes WHERE schemaname = $1 AND indexname = $2", tbl.Schema, "Events_unpublished_idx").Scan(&def)
	if err != nil || !strings.Contains(def, "WHERE (published_at IS NULL)") {
		t.Fatalf("partial index: %q, %v", def, err)
	}
	var unique bool
	err = pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_indexes WHERE schemaname = $1 AND tablename = 'Events' AND indexdef LIKE 'CREATE UNIQUE INDEX%(event_id)')`, tbl.Schema).Scan(&unique)
	if err != nil || !unique {
		t.Fatalf("event_id is not unique: %v", err)
	}
	if err := migrations.Outbox.Down(ctx, pool, tbl, 0); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Outbox.Check(ctx, pool, tbl); !errors.Is(err, migrations.ErrNoTable) {
		t.Fatalf("Outbox.Check after Down = %v", err)
	}
}

func TestRejectsUnsafeNames(t *testing.T) {
	for _, tbl := range []outbox.Table{{Name: `x"; DROP TABLE users; --`}, {Schema: "public; drop"}} {
		if err := migrations.Outbox.Up(context.Background(), nil, tbl); !errors.Is(err, outbox.ErrInvalidConfig) {
			t.Errorf("Up(%+v) = %v, want ErrInvalidConfig", tbl, err)
		}
	}
}
