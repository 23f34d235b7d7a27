package relay_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
)

// BenchmarkReplicasNoPublish drains a 20k backlog (200 keys) with 1, 2 and 4
// relays on one table, in one process, with a no-op publisher, and reports
// for each the rate and the CPU time the PostgreSQL backends serving the
// relays spent per event (read from /proc, so it excludes other sessions'
// load on a shared machine), alternating the replica counts in rounds.
//
//	go test -run '^$' -bench ReplicasNoPublish -benchtime 1x ./relay
func BenchmarkReplicasNoPublish(b *testing.B) {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		b.Skip("DATABASE_URL not set")
	}
	ctx := context.Background()
	app := testenv.Name("fxrepl")
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	cfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	table := testenv.Table(b, testenv.Pool(b))
	const backlog = 20000
	payload := `{"data":"` + strings.Repeat("x", 256-11) + `"}`
	counts := []int{1, 2, 4}
	rounds := 3
	if n, err := strconv.Atoi(os.Getenv("REPLICAS_ROUNDS")); err == nil && n > 0 {
		rounds = n
	}
	eps := make([][]float64, len(counts))
	cpu := make([][]float64, len(counts))
	for range rounds {
		for i, n := range counts {
			if _, err := pool.Exec(ctx, "TRUNCATE "+sqlname.Ident(table)); err != nil {
				b.Fatal(err)
			}
			_, err := pool.Exec(ctx, "INSERT INTO "+sqlname.Ident(table)+
				" (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key)"+
				" SELECT gen_random_uuid(), 'acct', 'k' || (g % 200), 'acct.changed', $1::jsonb, 't', 'k' || (g % 200) FROM generate_series(1, $2) g",
				payload, backlog)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := pool.Exec(ctx, "VACUUM ANALYZE "+sqlname.Ident(table)); err != nil {
				b.Fatal(err)
			}
			var done atomic.Int64
			var relays []*relay.Relay
			for range n {
				r, err := relay.New(pool, relay.PublisherFunc(func(_ context.Context, m []relay.Message) error {
					done.Add(int64(len(m)))
					return nil
				}), &relay.Config{Table: table, BatchSize: 500, Retention: -1})
				if err != nil {
					b.Fatal(err)
				}
				relays = append(relays, r)
			}
			cpu0 := backendCPU(ctx, b, pool, app)
			start := time.Now()
			for _, r := range relays {
				if err := r.Start(ctx); err != nil {
					b.Fatal(err)
				}
			}
			for done.Load() < backlog && time.Since(start) < 2*time.Minute {
				time.Sleep(2 * time.Millisecond)
			}
			el := time.Since(start)
			cpu1 := backendCPU(ctx, b, pool, app)
			for _, r := range relays {
				if err := r.Stop(ctx); err != nil {
					b.Fatal(err)
				}
			}
			var used float64
			for pid, t := range cpu1 {
				used += t - cpu0[pid]
			}
			eps[i] = append(eps[i], float64(done.Load())/el.Seconds())
			cpu[i] = append(cpu[i], used/float64(done.Load())*1e6)
			b.Logf("x%d: %.0f events/s, %.1f µs backend CPU/event", n, eps[i][len(eps[i])-1], cpu[i][len(cpu[i])-1])
		}
	}
	med := func(xs []float64) float64 { s := slices.Clone(xs); slices.Sort(s); return s[len(s)/2] }
	for i, n := range counts {
		b.ReportMetric(med(eps[i]), fmt.Sprintf("x%d_eps", n))
		b.ReportMetric(med(cpu[i]), fmt.Sprintf("x%d_us/event", n))
	}
}

// backendCPU returns the CPU seconds each backend of application app has
// used, by pid.
func backendCPU(ctx context.Context, b *testing.B, pool *pgxpool.Pool, app string) map[int]float64 {
	rows, err := pool.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE application_name = $1", app)
	if err != nil {
		b.Fatal(err)
	}
	var pids []int
	for rows.Next() {
		var p int
		_ = rows.Scan(&p)
		pids = append(pids, p)
	}
	rows.Close()
	out := map[int]float64{}
	for _, p := range pids {
		s, err := os.ReadFile("/proc/" + strconv.Itoa(p) + "/stat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(s[strings.LastIndexByte(string(s), ')')+2:]))
		u, _ := strconv.ParseFloat(f[11], 64)
		st, _ := strconv.ParseFloat(f[12], 64)
		out[p] = (u + st) / 100
	}
	return out
}
