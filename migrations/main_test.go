package migrations_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// applied lists, in order, the versions that table's <name>_migrations
// records: none when it does not exist.
func applied(t *testing.T, pool *pgxpool.Pool, table outbox.Table) ([]int, error) {
	t.Helper()
	table = table.WithDefaults()
	versions := sqlname.Ident(outbox.Table{Schema: table.Schema, Name: table.Name + "_migrations"})
	ctx := context.Background()
	var exists bool
	if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", versions).Scan(&exists); err != nil || !exists {
		return nil, err
	}
	rows, err := pool.Query(ctx, "SELECT version FROM "+versions+" ORDER BY version")
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int])
}
