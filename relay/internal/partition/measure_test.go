package partition_test

import (
	"context"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fxoutbox/outbox/relay/internal/partition"
)

// TestMeasureUpkeep times each change of the partitions under writer load
// and the writers' slowest insert meanwhile, for docs/partitions.md. It
// asserts nothing of speed; it runs with OUTBOX_PARTITION_MEASURE=1:
//
//	OUTBOX_PARTITION_MEASURE=1 go test -run MeasureUpkeep -v ./relay/internal/partition/
func TestMeasureUpkeep(t *testing.T) {
	if os.Getenv("OUTBOX_PARTITION_MEASURE") == "" {
		t.Skip("set OUTBOX_PARTITION_MEASURE=1 to measure")
	}
	pool, e := setUp(t)
	ctx := context.Background()
	now := time.Now()
	l := layout(t, pool, e)
	prev := l.Parts[1]
	const rows = 200000
	fill := func(from, to time.Time, n int) {
		if _, err := pool.Exec(ctx, "INSERT INTO "+sqlname.Ident(e.Table)+" (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key)"+
			" SELECT (substr(h, 1, 8) || '-' || substr(h, 9, 4) || '-7' || substr(gen_random_uuid()::text, 16))::uuid"+
			", 'order', g::text, 'e', '{\"cents\": 1250}', 't', (g % 100)::text"+
			" FROM generate_series(0, $3 - 1) g, lpad(to_hex($1::bigint + (g::bigint * ($2::bigint - $1::bigint)) / $3), 12, '0') h",
			from.UnixMilli(), to.UnixMilli(), n); err != nil {
			t.Fatal(err)
		}
	}
	fill(prev.Lo, prev.Hi, rows)
	position(t, pool, e)

	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var lat []time.Duration
	for range 8 {
		wg.Go(func() {
			for wctx.Err() == nil {
				s := time.Now()
				_, err := insert(context.WithoutCancel(wctx), pool, e, idAt(t, time.Now()), "w")
				mu.Lock()
				lat = append(lat, time.Since(s))
				mu.Unlock()
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	measure := func(what string, f func()) {
		time.Sleep(500 * time.Millisecond)
		mu.Lock()
		lat = lat[:0]
		mu.Unlock()
		s := time.Now()
		f()
		d := time.Since(s)
		time.Sleep(200 * time.Millisecond)
		mu.Lock()
		worst, n := slices.Max(append(lat, 0)), len(lat)
		mu.Unlock()
		t.Logf("%-58s %8.1f ms; writers' slowest insert meanwhile %6.1f ms (%d inserts)", what, float64(d.Microseconds())/1000, float64(worst.Microseconds())/1000, n)
	}
	measure("nothing (the writers alone, 300 ms)", func() { time.Sleep(300 * time.Millisecond) })
	measure("Extend: one partition made (empty tail split)", func() {
		if made, _, err := partition.Extend(ctx, pool, e, now.Add(time.Hour)); err != nil || len(made) != 1 {
			t.Fatal(made, err)
		}
	})
	measure("Retire: one partition of 200,000 rows checked and dropped", func() {
		if dropped, _, err := partition.Retire(ctx, pool, e, prev.Hi.Add(2*time.Hour)); err != nil || len(dropped) != 1 {
			t.Fatal(dropped, err)
		}
	})
	tail := layout(t, pool, e).Tail()
	fill(tail.Lo.Add(time.Minute), tail.Lo.Add(50*time.Minute), rows)
	measure("Extend: a tail of 200,000 rows re-bounded", func() {
		if made, _, err := partition.Extend(ctx, pool, e, now.Add(time.Hour)); err != nil || len(made) != 1 {
			t.Fatal(made, err)
		}
	})
	stop()
	wg.Wait()
}
