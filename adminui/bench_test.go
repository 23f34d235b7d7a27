package adminui_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/adminui"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/migrations"
)

// BenchmarkLargeTable measures the UI on the table: 1,000,000
// events (890,000 published over the last 24 hours, 10,000 waiting,
// 100,000 parked over five causes, the largest 50,000). Seeding takes about
// a minute, so it runs only with OUTBOX_BENCH_ADMINUI=1:
//
//	OUTBOX_BENCH_ADMINUI=1 go test -run '^$' -bench LargeTable -benchtime 20x ./adminui/
//
// Each sub-benchmark is one request through the handler over HTTP, as the
// browser sends it: the overview page and its JSON twin, the parked page's
// first page (groups, the matching count, 50 rows) and its twin, a later
// keyset page, an event's detail; requeue-50k posts "requeue everything
// matching" for the 50,000-event cause and polls the job until it is done
// (then parks the rows again, outside the timer).
func BenchmarkLargeTable(b *testing.B) {
	if os.Getenv("OUTBOX_BENCH_ADMINUI") != "1" {
		b.Skip("set OUTBOX_BENCH_ADMINUI=1 to seed 1,000,000 events and run it")
	}
	ctx := context.Background()
	pool := testenv.Pool(b)
	var table outbox.Table
	seed := seedSQL
	if schema := os.Getenv("OUTBOX_BENCH_SCHEMA"); schema != "" {
		// A schema kept between runs (migrated and seeded on the first):
		// reruns skip the minute of seeding.
		table = outbox.Table{Schema: schema}
		var n int
		if err := migrations.Outbox.Up(ctx, pool, table); err != nil {
			b.Fatal(err)
		}
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+sqlname.Ident(table)).Scan(&n); err != nil {
			b.Fatal(err)
		}
		if n == 1000000 {
			seed = nil
		}
	} else {
		table = testenv.Table(b, pool)
	}
	start := time.Now()
	for _, sql := range seed {
		if _, err := pool.Exec(ctx, strings.ReplaceAll(sql, "$T", sqlname.Ident(table))); err != nil {
			b.Fatal(err)
		}
	}
	if seed != nil {
		b.Logf("seeded 1,000,000 events in %v", time.Since(start).Round(time.Second))
	}
	if la, err := os.ReadFile("/proc/loadavg"); err == nil {
		b.Logf("load average before: %s", strings.TrimSpace(string(la)))
		defer func() {
			la, _ := os.ReadFile("/proc/loadavg")
			b.Logf("load average after: %s", strings.TrimSpace(string(la)))
		}()
	}
	benchUI(b, ctx, pool, table)
}

// seedSQL writes the benchmark's table.
var seedSQL = []string{
	// published, over the last 24 hours, in created_at order
	`INSERT INTO $T (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, headers, created_at, published_at)
		 SELECT gen_random_uuid(), 'order', 'o' || g, 'order.created.v1', jsonb_build_object('n', g, 'note', repeat('x', 100)), 'shop.orders', 'k' || (g % 5000),
		 '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}',
		 now() - interval '24 hours' + g * interval '97 ms', now() - interval '24 hours' + g * interval '97 ms' + interval '50 ms'
		 FROM generate_series(1, 890000) g`,
	// parked, five causes
	`INSERT INTO $T (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, headers, created_at, parked_at, attempts, last_error)
		 SELECT gen_random_uuid(), 'order', 'o' || g, 'order.created.v1', jsonb_build_object('n', g), c.topic, 'k' || (g % 5000), '{}',
		 now() - interval '2 hours' + g * interval '50 ms', now() - interval '2 hours' + g * interval '60 ms', 5, c.reason
		 FROM generate_series(1, 100000) g, LATERAL (SELECT CASE WHEN g % 10 < 5 THEN 'shop.orders' WHEN g % 10 < 8 THEN 'shop.payments' ELSE 'shop.audit' END AS topic,
		   CASE WHEN g % 10 < 5 THEN '[kafka.message_too_large] the record is larger than the broker accepts'
		        WHEN g % 10 < 8 THEN '[invalid_topic] the topic name is not valid'
		        WHEN g % 10 = 8 THEN '[kafka.rejected] the broker rejected the record'
		        WHEN g % 20 = 9 THEN '[outbox.no_topic] the event has no topic' ELSE 'an error stored by hand' END AS reason) c`,
	// waiting
	`INSERT INTO $T (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, created_at)
		 SELECT gen_random_uuid(), 'order', 'o' || g, 'order.created.v1', '{}', 'shop.orders', 'k' || g, now() - interval '1 minute' + g * interval '5 ms'
		 FROM generate_series(1, 10000) g`,
	`VACUUM ANALYZE $T`,
}

func benchUI(b *testing.B, ctx context.Context, pool *pgxpool.Pool, table outbox.Table) {
	auth, err := adminui.NewTokenAuthorizer(adminui.Token{Secret: operateToken, Name: "bench", Role: adminui.RoleOperate})
	if err != nil {
		b.Fatal(err)
	}
	h, err := adminui.NewHandler(adminui.Config{DB: pool, Tables: []outbox.Table{table}, Authorizer: auth, Logger: slogTo(io.Discard)})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(h)
	b.Cleanup(func() { srv.Close(); h.Close() })
	get := func(b *testing.B, path string) []byte {
		req, _ := http.NewRequest("GET", srv.URL+"/"+path, nil)
		req.Header.Set("Authorization", "Bearer "+operateToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("%s: %d %s", path, resp.StatusCode, body)
		}
		return body
	}
	var pp adminui.ParkedPage
	if err := json.Unmarshal(get(b, "api/parked?topic=shop.orders"), &pp); err != nil {
		b.Fatal(err)
	}
	if pp.Matching != 50000 || pp.Next == 0 {
		b.Fatalf("the orders cause holds %d events", pp.Matching)
	}
	var eventID string
	if err := pool.QueryRow(ctx, "SELECT event_id::text FROM "+sqlname.Ident(table)+" WHERE parked_at IS NOT NULL ORDER BY id DESC LIMIT 1").Scan(&eventID); err != nil {
		b.Fatal(err)
	}
	for _, page := range []struct{ name, path string }{
		{"overview", ""}, {"api-overview", "api/overview"},
		{"parked-first-page", "parked"}, {"api-parked-first-page", "api/parked"},
		{"parked-filtered-by-topic", "parked?topic=shop.payments"},
		{"parked-filtered-by-reason", "parked?reason=rejected"},
		{"parked-page-at-90k", "parked?after=980000"},
		{"event", "event?id=" + eventID},
	} {
		b.Run(page.name, func(b *testing.B) {
			var took []time.Duration
			for b.Loop() {
				t0 := time.Now()
				get(b, page.path)
				took = append(took, time.Since(t0))
			}
			reportPercentiles(b, took)
		})
	}

	b.Run("requeue-50k", func(b *testing.B) {
		csrf := ""
		var sess struct {
			CSRF string `json:"csrf_token"`
		}
		if err := json.Unmarshal(get(b, "api/session"), &sess); err != nil {
			b.Fatal(err)
		}
		csrf = sess.CSRF
		polls := 0
		var took []time.Duration
		for i := 0; i < b.N; i++ {
			t0 := time.Now()
			body := `{"action": "requeue", "matching": true, "filter": {"topic": "shop.orders", "reason": "message_too_large"}}`
			req, _ := http.NewRequest("POST", srv.URL+"/api/actions", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+operateToken)
			req.Header.Set("X-CSRF-Token", csrf)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			var job adminui.Job
			err = json.NewDecoder(resp.Body).Decode(&job)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusAccepted {
				b.Fatalf("requeue: %d %v", resp.StatusCode, err)
			}
			for job.State == "running" {
				time.Sleep(50 * time.Millisecond) // the page polls every 250ms
				polls++
				if err := json.Unmarshal(get(b, "api/jobs/"+job.ID), &job); err != nil {
					b.Fatal(err)
				}
			}
			if job.State != "done" || job.Done != 50000 {
				b.Fatalf("job %+v", job)
			}
			took = append(took, time.Since(t0))
			b.StopTimer()
			if _, err := pool.Exec(ctx, "UPDATE "+sqlname.Ident(table)+" SET parked_at = now(), attempts = 5 WHERE topic = 'shop.orders' AND last_error LIKE '[kafka.message_too_large]%' AND parked_at IS NULL AND published_at IS NULL"); err != nil {
				b.Fatal(err)
			}
			if _, err := pool.Exec(ctx, "VACUUM "+sqlname.Ident(table)); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		b.ReportMetric(float64(polls)/float64(b.N), "progress-polls/op")
		reportPercentiles(b, took)
	})
}

// reportPercentiles reports the median and 90th percentile of the
// iterations' times: on a shared machine the mean moves with other load.
func reportPercentiles(b *testing.B, took []time.Duration) {
	if len(took) == 0 {
		return
	}
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(took[len(took)*9/10].Microseconds())/1000, "p90-ms")
}
