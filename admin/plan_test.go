package admin_test

import (
	"context"
	"encoding/json"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fxoutbox/outbox/admin"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/tablesql"
	"github.com/fxoutbox/outbox/migrations"
)

// recorder runs statements and keeps each with its arguments.
type recorder struct {
	admin.Querier
	stmts []stmt
}

type stmt struct {
	sql  string
	args []any
}

func (r *recorder) keep(sql string, args []any) {
	c := make([]any, len(args))
	for i, a := range args {
		if na, ok := a.(pgx.NamedArgs); ok {
			a = maps.Clone(na)
		}
		c[i] = a
	}
	r.stmts = append(r.stmts, stmt{sql, c})
}

func (r *recorder) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	r.keep(sql, args)
	return r.Querier.Query(ctx, sql, args...)
}

func (r *recorder) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	r.keep(sql, args)
	return r.Querier.Exec(ctx, sql, args...)
}

// Every statement of the admin API that an operator runs on a large table
// reads the partial indexes, the primary key or the BRIN index, never
// scans the table nor sorts its rows: 200k published rows over a day, a
// 20k backlog, 2k parked. Replay is checked with an id range and a time
// range (without either it reads the table, as documented).
func TestPlansOnALargeTable(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	_, err := s.pool.Exec(s.ctx, "INSERT INTO "+sqlname.Ident(s.table)+
		" (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, published_at, created_at)"+
		" SELECT gen_random_uuid(), 'a', 'k' || (g % 500), 'a.b', '{}', 't' || (g % 7), 'k' || (g % 500),"+
		" CASE WHEN g <= 200000 THEN now() - interval '1 day' + g * interval '400 ms' END, now() - interval '1 day' + g * interval '390 ms'"+
		" FROM generate_series(1, 220000) g")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(s.ctx, "UPDATE "+sqlname.Ident(s.table)+" SET parked_at = now(), attempts = 5, last_error = 'topic does not exist' WHERE id % 10 = 7 AND published_at IS NULL"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(s.ctx, "VACUUM ANALYZE "+sqlname.Ident(s.table)); err != nil {
		t.Fatal(err)
	}
	var mid int64
	if err := s.pool.QueryRow(s.ctx, "SELECT min(id) + 150000 FROM "+sqlname.Ident(s.table)).Scan(&mid); err != nil {
		t.Fatal(err)
	}
	// Run every operation in a transaction that is rolled back, recording
	// its statements; then explain each of them.
	rec := &recorder{}
	tx, err := s.pool.Begin(s.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(s.ctx)
	rec.Querier = tx
	st, err := admin.ReadStatus(s.ctx, rec, s.table, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st.Backlog != 18000 || st.Parked != 2000 {
		t.Fatalf("status %+v", st)
	}
	f := admin.Filter{Topic: "t3", Error: "does not", Since: time.Now().Add(-2 * time.Hour)}
	mustOK := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	mustOK(admin.ListParked(s.ctx, rec, s.table, f))
	mustOK(admin.ListParked(s.ctx, rec, s.table, admin.Filter{After: mid + 10000}))
	mustOK(admin.CountParked(s.ctx, rec, s.table, f))
	mustOK(tablesql.ReadCounts(s.ctx, rec, s.table))
	mustOK(tablesql.CountParkedByType(s.ctx, rec, s.table, 1000))
	mustOK(admin.Requeue(s.ctx, rec, s.table, f, nil))
	mustOK(admin.Delete(s.ctx, rec, s.table, admin.Filter{Key: "k7"}, nil))
	mustOK(admin.CountPublished(s.ctx, rec, s.table, admin.Filter{FromID: mid, ToID: mid + 5000}))
	mustOK(admin.Replay(s.ctx, rec, s.table, admin.Filter{FromID: mid, ToID: mid + 5000, Topic: "t1"}, nil))
	mustOK(admin.Replay(s.ctx, rec, s.table, admin.Filter{Since: time.Now().Add(-30 * time.Minute)}, &admin.BulkOptions{ChunkSize: 500}))
	if len(rec.stmts) < 12 {
		t.Fatalf("recorded %d statements", len(rec.stmts))
	}
	for _, q := range rec.stmts {
		var plan []byte
		if err := tx.QueryRow(s.ctx, "EXPLAIN (FORMAT JSON) "+q.sql, q.args...).Scan(&plan); err != nil {
			t.Fatalf("explain %s: %v", q.sql, err)
		}
		var nodes []map[string]any
		if err := json.Unmarshal(plan, &nodes); err != nil {
			t.Fatal(err)
		}
		var bad []string
		walk(nodes[0]["Plan"].(map[string]any), func(n map[string]any) {
			typ, _ := n["Node Type"].(string)
			rel, _ := n["Relation Name"].(string)
			if typ == "Seq Scan" && rel == s.table.WithDefaults().Name {
				bad = append(bad, "Seq Scan on "+rel)
			}
			// Sorting the parked groups (an aggregate's output) or the
			// relays' sessions is fine; sorting rows of the table is not.
			if typ == "Sort" && strings.Contains(q.sql, sqlname.Ident(s.table)) && !strings.Contains(q.sql, "GROUP BY") {
				bad = append(bad, "Sort")
			}
		})
		if len(bad) > 0 {
			t.Errorf("plan has %s: %.300s\n%s", strings.Join(bad, ", "), q.sql, plan)
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

// In cursor mode the table keeps the rows it delivered (until retention),
// all of them in the unpublished partial index: the counts behind status
// and the relay's gauges (read once a second) read the waiting rows only,
// through the (txid, id) index, whatever the table holds: 200k delivered
// rows written by one transaction (the planner's statistics then price a
// probe of one transaction's rows as 200k), 21 waiting, one of them of a
// transaction that was running when the lanes' positions were taken.
func TestCursorCountsReadOnlyTheWaitingRows(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	if err := migrations.Cursor.Up(s.ctx, s.pool, s.table); err != nil {
		t.Fatal(err)
	}
	tbl, cur := sqlname.Ident(s.table), sqlname.Ident(sqlname.Cursor(s.table))
	insert := "INSERT INTO " + tbl + " (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key)" +
		" SELECT gen_random_uuid(), 'a', 'k' || (g % 500), 'a.b', '{}', 't', 'k' || (g % 500) FROM generate_series(1, $1) g"
	if _, err := s.pool.Exec(s.ctx, insert, 200_000); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(s.ctx, "VACUUM ANALYZE "+tbl); err != nil {
		t.Fatal(err)
	}
	// Every lane delivered the rows so far (as a relay's positions say
	// after it delivered them), while a transaction that wrote one row was
	// still running; it commits, then 20 more rows are written.
	running, err := s.pool.Begin(s.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = running.Rollback(s.ctx) }()
	if _, err := running.Exec(s.ctx, insert, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(s.ctx, "INSERT INTO "+cur+" (lane, lanes, done, base)"+
		" SELECT g, 64, pg_current_snapshot(), (SELECT max(id) FROM "+tbl+") FROM generate_series(0, 63) g"); err != nil {
		t.Fatal(err)
	}
	if err := running.Commit(s.ctx); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		if _, err := s.pool.Exec(s.ctx, insert, 1); err != nil {
			t.Fatal(err)
		}
	}
	rec := &recorder{Querier: s.pool}
	c, err := tablesql.ReadCounts(s.ctx, rec, s.table)
	if err != nil {
		t.Fatal(err)
	}
	if c.Backlog != 21 || c.OldestCreatedAt == nil {
		t.Fatalf("counts %+v; want a backlog of 21 and its oldest", c)
	}
	for _, q := range rec.stmts {
		if !strings.Contains(q.sql, tbl+" e") {
			continue // the catalog's and the positions' statements
		}
		var plan []byte
		if err := s.pool.QueryRow(s.ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+q.sql, q.args...).Scan(&plan); err != nil {
			t.Fatalf("explain %s: %v", q.sql, err)
		}
		var nodes []map[string]any
		if err := json.Unmarshal(plan, &nodes); err != nil {
			t.Fatal(err)
		}
		top := nodes[0]["Plan"].(map[string]any)
		hit, _ := top["Shared Hit Blocks"].(float64)
		read, _ := top["Shared Read Blocks"].(float64)
		// The waiting rows' index and heap pages take a few; the
		// unpublished index, which holds the delivered rows too, takes
		// thousands (2,673 measured), and so does a probe that scans the
		// table.
		if hit+read > 200 {
			t.Errorf("the counts read %.0f buffers for 21 waiting rows among 200k delivered: %.300s\n%s", hit+read, q.sql, plan)
		}
	}
}
