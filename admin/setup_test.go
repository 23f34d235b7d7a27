package admin_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
)

type setup struct {
	ctx   context.Context
	pool  *pgxpool.Pool
	table outbox.Table
}

func newSetup(t *testing.T) *setup {
	t.Helper()
	pool := testenv.Pool(t)
	return &setup{ctx: context.Background(), pool: pool, table: testenv.Table(t, pool)}
}

// seed inserts n rows with generate_series g = 1..n; the expressions (SQL
// over g) give each column. published and parked are SQL expressions too
// ("NULL" for none).
type rows struct {
	n                           int
	topic, typ, key, createdAgo string // createdAgo: an interval expression, e.g. "interval '5 min'"
	published, parked, lastErr  string
	attempts                    string
	payload                     string
}

func (s *setup) seed(t *testing.T, r rows) {
	t.Helper()
	def := func(v, d string) string {
		if v == "" {
			return d
		}
		return v
	}
	_, err := s.pool.Exec(s.ctx, "INSERT INTO "+sqlname.Ident(s.table)+
		" (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, headers, created_at, published_at, parked_at, last_error, attempts)"+
		" SELECT gen_random_uuid(), 'order', "+def(r.key, "'k' || (g % 50)")+", "+def(r.typ, "'order.created.v1'")+", "+def(r.payload, `jsonb_build_object('n', g)`)+", "+
		def(r.topic, "'orders'")+", "+def(r.key, "'k' || (g % 50)")+`, '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}', now() - `+def(r.createdAgo, "interval '0'")+", "+
		def(r.published, "NULL")+", "+def(r.parked, "NULL")+", "+def(r.lastErr, "NULL")+", "+def(r.attempts, "0")+
		" FROM generate_series(1, $1) g", r.n)
	if err != nil {
		t.Fatalf("seed: %v", err)
	}
}

func (s *setup) count(t *testing.T, where string) int {
	t.Helper()
	var n int
	if err := s.pool.QueryRow(s.ctx, "SELECT count(*) FROM "+sqlname.Ident(s.table)+" WHERE "+where).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
