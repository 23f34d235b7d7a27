package relay_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
)

// BenchmarkDrain measures how fast one relay publishes a preloaded backlog
// of 20k events (256-byte payloads, 200 keys, one topic with 12 partitions)
// to the broker at KAFKA_BROKERS, through the real sarama publisher: the
// defaults (batches of 50 growing to 500 while full, one worker,
// asynchronous commit), fixed batches of 50, a synchronous commit, two
// workers, batches of 500 from the start, and unordered claims. Each relay is started and runs until the backlog is
// drained, so draining without waiting for ticks is part of the figure. The
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
		_, err := pool.Exec(s.ctx, "INSERT INTO "+sqlname.Ident(s.table)+
			" (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key)"+
			" SELECT gen_random_uuid(), 'acct', 'k' || (g % 200), 'acct.changed', $1::jsonb, $2, 'k' || (g % 200) FROM generate_series(1, $3) g",
			payload, topic, backlog)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(s.ctx, "VACUUM ANALYZE "+sqlname.Ident(s.table)); err != nil {
			b.Fatal(err)
		}
	}
	variants := []relay.Config{
		{}, // the defaults: batches of 50 growing to 500, one worker, asynchronous commit
		{MaxBatchSize: 50},
		{SynchronousCommit: true},
		{Workers: 2},
		{BatchSize: 500},
		{Ordering: relay.Unordered},
		{Workers: 2, Ordering: relay.Unordered},
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
			if err := r.Start(s.ctx); err != nil {
				b.Fatal(err)
			}
			waitUntil(b, 5*time.Minute, "the backlog to drain", func() bool { return s.unpublished(b) == 0 })
			if err := r.Stop(s.ctx); err != nil {
				b.Fatal(err)
			}
			eps[i] = append(eps[i], float64(backlog)/time.Since(start).Seconds())
			if _, err := pool.Exec(s.ctx, "TRUNCATE "+sqlname.Ident(s.table)); err != nil {
				b.Fatal(err)
			}
		}
	}
	med := func(xs []float64) float64 { s := slices.Clone(xs); slices.Sort(s); return s[len(s)/2] }
	base := med(eps[0])
	for i, cfg := range variants {
		cfg.Table = s.table
		r, _ := relay.New(pool, pub, &cfg)
		c := r.Config()
		name := fmt.Sprintf("%v/b%d-%d/w%d", c.Ordering, c.BatchSize, c.MaxBatchSize, c.Workers)
		if c.SynchronousCommit {
			name += "/sync"
		}
		b.ReportMetric(med(eps[i]), name+"_eps")
		if i > 0 {
			b.ReportMetric(med(eps[i])/base, name+"/default")
		}
	}
}
