package admin_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/admin"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
)

// parkedMix seeds 3000 parked events over topics, types, keys, errors and
// write times, plus unpublished and published rows that no parked
// operation may touch.
func parkedMix(t *testing.T, s *setup) {
	t.Helper()
	s.seed(t, rows{n: 3000,
		topic:      "CASE WHEN g % 3 = 0 THEN 'payments' ELSE 'orders' END",
		typ:        "CASE WHEN g % 2 = 0 THEN 'order.paid.v1' ELSE 'order.created.v1' END",
		key:        "'k' || (g % 10)",
		createdAgo: "(3001 - g) * interval '1 s'", // g = 3000 is the newest
		parked:     "now()", attempts: "5",
		lastErr: "CASE WHEN g % 5 = 0 THEN 'kafka server: Message was too large' ELSE 'topic does not exist' END"})
	s.seed(t, rows{n: 500})                                      // waiting
	s.seed(t, rows{n: 500, published: "now() - interval '1 h'"}) // published
}

// ListParked filters by topic, type, key, write time, error text and id
// range, and pages through thousands of events with Limit and After
// without losing or repeating one.
func TestListParkedFiltersAndPages(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	parkedMix(t, s)
	var firstID int64
	if err := s.pool.QueryRow(s.ctx, "SELECT min(id) FROM "+sqlname.Ident(s.table)).Scan(&firstID); err != nil {
		t.Fatal(err)
	}
	// The parked rows were written (3001 - g) seconds before the seed's
	// now(), on the server's clock: the newest is 1 s old. Filters are
	// measured from there, not from this process's clock, which a loaded
	// machine lets drift from the seed by more than any margin.
	var now time.Time
	if err := s.pool.QueryRow(s.ctx, "SELECT max(created_at) + interval '1 s' FROM "+sqlname.Ident(s.table)+" WHERE parked_at IS NOT NULL").Scan(&now); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		f    admin.Filter
		want int
	}{
		{"all", admin.Filter{Limit: 10000}, 3000},
		{"topic", admin.Filter{Topic: "payments", Limit: 10000}, 1000},
		{"type", admin.Filter{Type: "order.paid.v1", Limit: 10000}, 1500},
		{"key", admin.Filter{Key: "k3", Limit: 10000}, 300},
		{"topic and key", admin.Filter{Topic: "payments", Key: "k3", Limit: 10000}, 100},
		{"error, any case", admin.Filter{Error: "TOO LARGE", Limit: 10000}, 600},
		{"since", admin.Filter{Since: now.Add(-100*time.Second - 500*time.Millisecond), Limit: 10000}, 100},
		{"until", admin.Filter{Until: now.Add(-2900*time.Second - 500*time.Millisecond), Limit: 10000}, 100},
		{"id range", admin.Filter{FromID: firstID + 10, ToID: firstID + 19, Limit: 10000}, 10},
		{"event ids", admin.Filter{EventIDs: []uuid.UUID{uuid.New()}}, 0},
		{"default limit", admin.Filter{}, admin.DefaultLimit},
		{"limit", admin.Filter{Topic: "orders", Limit: 7}, 7},
	} {
		got, err := admin.ListParked(s.ctx, s.pool, s.table, c.f)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if len(got) != c.want {
			t.Errorf("%s: %d events, want %d", c.name, len(got), c.want)
		}
		wantCount := c.want // CountParked has no default limit
		if c.f.Limit == 0 && c.f.EventIDs == nil {
			wantCount = 3000
		}
		n, err := admin.CountParked(s.ctx, s.pool, s.table, c.f)
		if err != nil || n != wantCount {
			t.Errorf("%s: CountParked = %d, %v; want %d", c.name, n, err, wantCount)
		}
		for _, p := range got {
			if (c.f.Topic != "" && p.Topic != c.f.Topic) || (c.f.Key != "" && p.Key != c.f.Key) || p.Payload != nil || p.ParkedAt.IsZero() || p.Attempts != 5 {
				t.Fatalf("%s: %+v", c.name, p)
			}
		}
	}

	var seen []int64
	for f := (admin.Filter{Limit: 700}); ; {
		page, err := admin.ListParked(s.ctx, s.pool, s.table, f)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, p := range page {
			seen = append(seen, p.ID)
		}
		f.After = page[len(page)-1].ID
	}
	if len(seen) != 3000 || !slices.IsSorted(seen) || len(slices.Compact(slices.Clone(seen))) != 3000 {
		t.Errorf("paged through %d events (sorted %v), want 3000 distinct in order", len(seen), slices.IsSorted(seen))
	}

	for _, bad := range []admin.Filter{{Limit: -1}, {FromID: 10, ToID: 5}, {Since: now, Until: now.Add(-time.Hour)}} {
		if _, err := admin.ListParked(s.ctx, s.pool, s.table, bad); !errors.Is(err, outbox.ErrInvalidConfig) {
			t.Errorf("filter %+v: err %v, want ErrInvalidConfig", bad, err)
		}
	}
}

// GetParked shows one parked event with its payload and headers, and says
// why it cannot when the event is unknown, waiting or published.
func TestGetParked(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	s.seed(t, rows{n: 1, payload: `'{"total": 42, "note": "a\u0001b"}'`, parked: "now()", attempts: "5", lastErr: "'topic does not exist'"})
	s.seed(t, rows{n: 1, key: "'waiting'"})
	s.seed(t, rows{n: 1, key: "'sent'", published: "now()"})
	id := func(where string) uuid.UUID {
		var u uuid.UUID
		if err := s.pool.QueryRow(s.ctx, "SELECT event_id FROM "+sqlname.Ident(s.table)+" WHERE "+where).Scan(&u); err != nil {
			t.Fatal(err)
		}
		return u
	}
	p, err := admin.GetParked(s.ctx, s.pool, s.table, id("parked_at IS NOT NULL"))
	if err != nil {
		t.Fatal(err)
	}
	if string(p.Payload) != `{"note": "a\u0001b", "total": 42}` || p.Headers["traceparent"] == "" || p.LastError != "topic does not exist" || p.AggregateType != "order" {
		t.Errorf("parked event %+v, payload %s", p, p.Payload)
	}
	if _, err := admin.GetParked(s.ctx, s.pool, s.table, uuid.New()); !errors.Is(err, admin.ErrNotFound) {
		t.Errorf("unknown id: %v", err)
	}
	if _, err := admin.GetParked(s.ctx, s.pool, s.table, id("partition_key = 'waiting'")); !errors.Is(err, admin.ErrNotParked) || !strings.Contains(err.Error(), "waiting to be published") {
		t.Errorf("waiting event: %v", err)
	}
	if _, err := admin.GetParked(s.ctx, s.pool, s.table, id("partition_key = 'sent'")); !errors.Is(err, admin.ErrNotParked) || !strings.Contains(err.Error(), "was published") {
		t.Errorf("published event: %v", err)
	}
}

// Requeue and Delete work by filter in chunks, report progress after each
// chunk, respect Limit, never touch waiting or published rows, and refuse
// an empty filter unless All is set.
func TestRequeueAndDeleteInChunks(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	parkedMix(t, s)

	var progress []int
	n, err := admin.Requeue(s.ctx, s.pool, s.table, admin.Filter{Topic: "payments"}, &admin.BulkOptions{ChunkSize: 300, Progress: func(d int) { progress = append(progress, d) }})
	if err != nil || n != 1000 {
		t.Fatalf("Requeue = %d, %v; want 1000", n, err)
	}
	if !slices.Equal(progress, []int{300, 600, 900, 1000}) {
		t.Errorf("progress %v", progress)
	}
	if got := s.count(t, "topic = 'payments' AND parked_at IS NULL AND attempts = 0 AND published_at IS NULL"); got != 1000 {
		t.Errorf("%d payments events requeued with attempts 0, want 1000", got)
	}
	if got := s.count(t, "parked_at IS NOT NULL"); got != 2000 {
		t.Errorf("%d still parked, want 2000", got)
	}
	// Limit: at most that many.
	if n, err := admin.Requeue(s.ctx, s.pool, s.table, admin.Filter{Key: "k1", Limit: 50}, &admin.BulkOptions{ChunkSize: 20}); err != nil || n != 50 {
		t.Errorf("Requeue with Limit 50 = %d, %v", n, err)
	}
	// By event id.
	var one uuid.UUID
	if err := s.pool.QueryRow(s.ctx, "SELECT event_id FROM "+sqlname.Ident(s.table)+" WHERE parked_at IS NOT NULL LIMIT 1").Scan(&one); err != nil {
		t.Fatal(err)
	}
	if n, err := admin.Requeue(s.ctx, s.pool, s.table, admin.Filter{EventIDs: []uuid.UUID{one, uuid.New()}}, nil); err != nil || n != 1 {
		t.Errorf("Requeue by event ids = %d, %v", n, err)
	}

	parkedBefore := s.count(t, "parked_at IS NOT NULL")
	tooLarge := s.count(t, "parked_at IS NOT NULL AND last_error LIKE '%too large%'")
	if n, err := admin.Delete(s.ctx, s.pool, s.table, admin.Filter{Error: "too large"}, &admin.BulkOptions{ChunkSize: 100}); err != nil || n != tooLarge {
		t.Errorf("Delete = %d, %v; want %d", n, err, tooLarge)
	}
	if got := s.count(t, "parked_at IS NOT NULL"); got != parkedBefore-tooLarge {
		t.Errorf("%d parked after delete, want %d", got, parkedBefore-tooLarge)
	}

	for _, op := range []func(admin.Filter) (int, error){
		func(f admin.Filter) (int, error) { return admin.Requeue(s.ctx, s.pool, s.table, f, nil) },
		func(f admin.Filter) (int, error) { return admin.Delete(s.ctx, s.pool, s.table, f, nil) },
		func(f admin.Filter) (int, error) { return admin.Replay(s.ctx, s.pool, s.table, f, nil) },
	} {
		if n, err := op(admin.Filter{Limit: 5}); !errors.Is(err, admin.ErrNoFilter) || n != 0 {
			t.Errorf("empty filter: %d, %v; want ErrNoFilter", n, err)
		}
	}
	rest := s.count(t, "parked_at IS NOT NULL")
	if n, err := admin.Delete(s.ctx, s.pool, s.table, admin.Filter{All: true}, nil); err != nil || n != rest {
		t.Errorf("Delete All = %d, %v; want %d", n, err, rest)
	}
	// Waiting and published rows were never touched: 500 + 1000 requeued
	// + 51 waiting, 500 published.
	if w, p := s.count(t, "published_at IS NULL AND parked_at IS NULL"), s.count(t, "published_at IS NOT NULL"); w != 1551 || p != 500 {
		t.Errorf("%d waiting, %d published; want 1551, 500", w, p)
	}
}

// A parked event requeued by someone else while Delete waits for its row
// lock is not deleted: the statement checks the state again on the row it
// changes, not only in the snapshot that chose it.
func TestDeleteSkipsAnEventRequeuedMeanwhile(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	s.seed(t, rows{n: 10, parked: "now()", attempts: "5", lastErr: "'x'"})
	tx, err := s.pool.Begin(s.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(s.ctx)
	var requeued int64
	if err := tx.QueryRow(s.ctx, "UPDATE "+sqlname.Ident(s.table)+" SET parked_at = NULL, attempts = 0 WHERE id = (SELECT min(id) FROM "+sqlname.Ident(s.table)+") RETURNING id").Scan(&requeued); err != nil {
		t.Fatal(err)
	}
	type res struct {
		n   int
		err error
	}
	done := make(chan res, 1)
	go func() {
		n, err := admin.Delete(s.ctx, s.pool, s.table, admin.Filter{All: true}, nil)
		done <- res{n, err}
	}()
	// Wait until the delete waits for the requeue's row lock.
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		var waiting int
		if err := s.pool.QueryRow(s.ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%DELETE FROM '||$1||'%'", sqlname.Ident(s.table)).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		return waiting > 0, "the delete does not wait for the row lock"
	})
	if err := tx.Commit(s.ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.n != 9 {
		t.Fatalf("Delete = %d, %v; want 9", r.n, r.err)
	}
	if n := s.count(t, fmt.Sprintf("id = %d AND parked_at IS NULL", requeued)); n != 1 {
		t.Fatal("the event requeued meanwhile was deleted")
	}
}
