package relay_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
)

// BenchmarkDrain measures how fast one relay publishes a preloaded backlog
// of 20k events (256-byte payloads, 200 keys, one topic with 12 partitions)
// to the broker at KAFKA_BROKERS, through the real sarama publisher, at
// batch 50 (the default) and 500, per-key ordered and unordered. The
// variants alternate in rounds and the medians are reported in events/s,
// with each one's ratio to the default.
//
//	go test -run '^$' -bench Drain -benchtime 1x ./relay
func BenchmarkDrain(b *testing.B) {
	pool := testenv.Pool(b)
	brokers := testenv.Brokers(b)
	topic := testenv.Topic(b, brokers, 12)
	s := &setup{ctx: context.Background(), pool: pool, table: testenv.Table(b, pool)}
	pub, err := relay.NewSaramaPublisher(brokers, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	const backlog = 20000
	payload := `{"data":"` + strings.Repeat("x", 256-11) + `"}`
	preload := func() {
		_, err := pool.Exec(s.ctx, "INSERT INTO "+s.table.Ident()+
			" (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key)"+
			" SELECT gen_random_uuid(), 'acct', 'k' || (g % 200), 'acct.changed', $1::jsonb, $2, 'k' || (g % 200) FROM generate_series(1, $3) g",
			payload, topic, backlog)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(s.ctx, "VACUUM ANALYZE "+s.table.Ident()); err != nil {
			b.Fatal(err)
		}
	}
	variants := []relay.Config{
		{BatchSize: 50},
		{BatchSize: 500},
		{BatchSize: 50, Ordering: relay.Unordered},
		{BatchSize: 500, Ordering: relay.Unordered},
	}
	rounds := 3
	eps := make([][]float64, len(variants))
	for range rounds {
		for i, cfg := range variants {
			preload()
			cfg.Table = s.table
			r, err := relay.New(pool, pub, &cfg)
			if err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			published := 0
			for published < backlog {
				n, err := r.RunOnce(s.ctx)
				if err != nil {
					b.Fatal(err)
				}
				if n == 0 {
					b.Fatalf("relay stopped at %d of %d", published, backlog)
				}
				published += n
			}
			eps[i] = append(eps[i], float64(backlog)/time.Since(start).Seconds())
			if _, err := pool.Exec(s.ctx, "TRUNCATE "+s.table.Ident()); err != nil {
				b.Fatal(err)
			}
		}
	}
	med := func(xs []float64) float64 { s := slices.Clone(xs); slices.Sort(s); return s[len(s)/2] }
	base := med(eps[0])
	for i, cfg := range variants {
		name := fmt.Sprintf("%v/batch%d", cfg.Ordering, cfg.BatchSize)
		b.ReportMetric(med(eps[i]), name+"_eps")
		if i > 0 {
			b.ReportMetric(med(eps[i])/base, name+"/default")
		}
	}
}
