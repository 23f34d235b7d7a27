package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/nestjs"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/migrations"
	"github.com/fxoutbox/outbox/relay/internal/cursor"
)

// The relay's statements must read the partial indexes in id order, never
// scan or sort the table: with 200k published rows and a 20k backlog, every
// plan is checked for sequential scans of the outbox table and for sorts of
// its rows. The same holds on a table taken over from the NestJS relay,
// whose own partial index of unpublished rows the migrations keep.
func TestPlansUsePartialIndexes(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	t.Run("fresh", func(t *testing.T) {
		t.Parallel()
		checkPlans(t, pool, testenv.Table(t, pool), "outbox_event_unpublished_idx")
	})
	t.Run("adopted NestJS table", func(t *testing.T) {
		t.Parallel()
		tbl := outbox.Table{Schema: testenv.Name("nestjs_")}
		nestjs.Create(t, pool, tbl.Schema)
		if err := migrations.Outbox.Up(context.Background(), pool, tbl); err != nil {
			t.Fatal(err)
		}
		checkPlans(t, pool, tbl, "ix_outbox_event_unpublished")
	})
}

// checkPlans checks the plans on tbl, whose partial index of unpublished
// rows is unpublished: the claim and the window must walk it.
func checkPlans(t *testing.T, pool *pgxpool.Pool, tbl outbox.Table, unpublished string) {
	ctx := context.Background()
	_, err := pool.Exec(ctx, "INSERT INTO "+sqlname.Ident(tbl)+
		" (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, published_at, created_at)"+
		" SELECT gen_random_uuid(), 'a', 'k' || (g % 500), 'a.b', '{}', 't', 'k' || (g % 500),"+
		" CASE WHEN g <= 200000 THEN now() END, now() - interval '1 day' + g * interval '1 ms'"+
		" FROM generate_series(1, 220000) g")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "UPDATE "+sqlname.Ident(tbl)+" SET parked_at = now(), attempts = 5 WHERE id % 1000 = 7 AND published_at IS NULL"); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE "+sqlname.Ident(tbl)); err != nil {
		t.Fatal(err)
	}
	r, err := New(pool, PublisherFunc(func(context.Context, []Message) error { return nil }), nil)
	if err != nil {
		t.Fatal(err)
	}
	r.q = newQueries(tbl)
	var ids []int64
	if err := pool.QueryRow(ctx, "SELECT array_agg(id) FROM (SELECT id FROM "+sqlname.Ident(tbl)+" WHERE published_at IS NULL AND id % 3 = 0 ORDER BY id LIMIT 600) x").Scan(&ids); err != nil {
		t.Fatal(err)
	}
	for name, q := range map[string]struct {
		sql  string
		args pgx.NamedArgs
	}{
		"claim":   {r.q.Claim, pgx.NamedArgs{"n": 500}},
		"window":  {r.q.Window, pgx.NamedArgs{"window": 1000, "lanes": r.cfg.Lanes, "n": 500, "ns": r.q.ns}},
		"read":    {r.q.Read, pgx.NamedArgs{"ids": ids, "n": 500}},
		"cleanup": {"SELECT * FROM " + sqlname.Ident(tbl) + " WHERE id IN (SELECT id FROM " + sqlname.Ident(tbl) + " WHERE created_at < now() - interval '3 days' AND published_at < now() - interval '3 days' LIMIT 1000)", nil},
	} {
		var plan []byte
		args := []any{}
		if q.args != nil {
			args = append(args, q.args)
		}
		sql := "EXPLAIN (FORMAT JSON) " + q.sql
		if err := pool.QueryRow(ctx, sql, args...).Scan(&plan); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var nodes []map[string]any
		_ = json.Unmarshal(plan, &nodes)
		var bad []string
		walksPartial := false
		walk(nodes[0]["Plan"].(map[string]any), func(n map[string]any) {
			typ, _ := n["Node Type"].(string)
			rel, _ := n["Relation Name"].(string)
			if idx, _ := n["Index Name"].(string); idx == unpublished {
				walksPartial = true
			}
			if typ == "Seq Scan" && rel == tbl.WithDefaults().Name {
				bad = append(bad, "Seq Scan on "+rel)
			}
			if typ == "Sort" && name != "window" { // window sorts its few lanes, not rows
				bad = append(bad, "Sort")
			}
		})
		if (name == "claim" || name == "window") && !walksPartial {
			bad = append(bad, "no scan of the partial index "+unpublished)
		}
		if len(bad) > 0 {
			t.Errorf("%s plan has %s:\n%s", name, strings.Join(bad, ", "), plan)
		}
	}
}

func walk(n map[string]any, f func(map[string]any)) {
	f(n)
	if kids, ok := n["Plans"].([]any); ok {
		for _, k := range kids {
			walk(k.(map[string]any), f)
		}
	}
}

// Under cursor progress the late rows (transactions that were running at a
// lane's done snapshot) are found through the (txid, id) index, whatever
// the statistics say. After a move from marks (100k rows delivered by marks,
// in one bulk transaction: the planner expects thousands of rows per
// transaction id and few in the unpublished partial index, which holds
// every row the cursor delivered) the find and load statements must visit
// about the backlog's rows, not the table's.
func TestCursorPlansAfterBulkLoad(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	tbl := testenv.Table(t, pool)
	if err := migrations.Cursor.Up(ctx, pool, tbl); err != nil {
		t.Fatal(err)
	}
	insert := func(db interface {
		Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
	}, n int, published bool) {
		t.Helper()
		pub := "NULL"
		if published {
			pub = "now()"
		}
		if _, err := db.Exec(ctx, "INSERT INTO "+sqlname.Ident(tbl)+
			" (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, published_at)"+
			" SELECT gen_random_uuid(), 'a', 'k' || g, 'a.b', '{}', 't', 'k' || g, "+pub+" FROM generate_series(1, $1) g", n); err != nil {
			t.Fatal(err)
		}
	}
	insert(pool, 100000, true)
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE "+sqlname.Ident(tbl)); err != nil {
		t.Fatal(err)
	}
	r, err := New(pool, PublisherFunc(func(context.Context, []Message) error { return nil }), &Config{Table: tbl, Progress: ProgressCursor})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, r.cur.Q.Init, pgx.NamedArgs{"lanes": r.cfg.Lanes}); err != nil {
		t.Fatal(err)
	}
	// 20,000 rows that the lanes then delivered (their positions moved
	// past them, as a relay's would), while a transaction ran: its rows
	// are late rows of every lane (in the done snapshots' xip lists).
	for range 20 {
		insert(pool, 1000, false)
	}
	open, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Rollback(ctx) //nolint:errcheck
	insert(open, 100, false)
	if _, err := pool.Exec(ctx, "UPDATE "+sqlname.Ident(cursor.PositionsOf(tbl))+" SET done = pg_current_snapshot(), base = (SELECT max(id) FROM "+sqlname.Ident(tbl)+")"); err != nil {
		t.Fatal(err)
	}
	if err := open.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		insert(pool, 100, false)
	}
	lanes := make([]int32, r.cfg.Lanes)
	for i := range lanes {
		lanes[i] = int32(i)
	}
	for name, q := range map[string]struct {
		sql  string
		args pgx.NamedArgs
	}{
		"find": {r.cur.Q.Find, pgx.NamedArgs{"window": 1000, "lanes": r.cfg.Lanes, "n": 500, "ns": r.q.ns, "owned": []int32{}}},
		"load": {r.cur.Q.Load, pgx.NamedArgs{"locked": lanes, "lanes": r.cfg.Lanes}},
	} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, r.txSettings, r.idleMillis); err != nil {
			t.Fatal(err)
		}
		var plan []byte
		if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+q.sql, q.args).Scan(&plan); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		_ = tx.Rollback(ctx)
		var nodes []map[string]any
		_ = json.Unmarshal(plan, &nodes)
		visited := 0.0
		var bad []string
		walk(nodes[0]["Plan"].(map[string]any), func(n map[string]any) {
			if rel, _ := n["Relation Name"].(string); rel != tbl.WithDefaults().Name {
				return
			}
			if n["Node Type"] == "Seq Scan" {
				bad = append(bad, "Seq Scan")
			}
			num := func(k string) float64 { f, _ := n[k].(float64); return f }
			visited += (num("Actual Rows") + num("Rows Removed by Filter") + num("Rows Removed by Index Recheck")) * num("Actual Loops")
		})
		// The backlog is 2,100 rows; the table holds 122,100.
		if visited > 10000 {
			bad = append(bad, fmt.Sprintf("%.0f rows of the table visited", visited))
		}
		if len(bad) > 0 {
			t.Errorf("%s plan has %s:\n%s", name, strings.Join(bad, ", "), plan)
		}
	}
}
