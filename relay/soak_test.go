package relay_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// tableSize is what the soak watches: live and dead tuples, and the sizes
// of the table and its indexes.
type tableSize struct {
	live, dead              int64
	heap, unpublished, pkey int64
}

func (z tableSize) String() string {
	return fmt.Sprintf("live %d, dead %d, heap %s, unpublished index %s, pkey %s",
		z.live, z.dead, mib(z.heap), mib(z.unpublished), mib(z.pkey))
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

func measure(t *testing.T, pool *pgxpool.Pool, tbl outbox.Table) tableSize {
	t.Helper()
	tbl = tbl.WithDefaults()
	var z tableSize
	err := pool.QueryRow(context.Background(), `SELECT n_live_tup, n_dead_tup, pg_relation_size(relid),
		pg_relation_size(to_regclass($2)), pg_relation_size(to_regclass($3))
		FROM pg_stat_user_tables WHERE relid = to_regclass($1)`,
		sqlname.Ident(tbl), tbl.Schema+"."+tbl.Name+"_unpublished_idx", tbl.Schema+"."+tbl.Name+"_pkey").
		Scan(&z.live, &z.dead, &z.heap, &z.unpublished, &z.pkey)
	if err != nil {
		t.Fatal(err)
	}
	return z
}

// TestSoakTableStaysBounded writes OUTBOX_SOAK_EVENTS events (e.g. 1000000)
// through the unit of work at OUTBOX_SOAK_RATE events/s (default 5000)
// while a relay publishes them to the broker and deletes them 5s after
// publishing, and reports the table's size and dead tuples as it goes. It
// passes when everything was published, the table is empty after the last
// retention pass, and the heap reached a plateau: its peak over the second
// half of the events is at most 1.5x its peak over the first half. (The
// plateau is set by autovacuum's cadence, not by the event count: every
// event leaves two dead versions, its insert after the mark and its mark
// after the delete, until vacuum runs.) Not run by default:
//
//	OUTBOX_SOAK_EVENTS=1000000 go test -run Soak -v -timeout 60m ./relay
func TestSoakTableStaysBounded(t *testing.T) {
	total, _ := strconv.Atoi(os.Getenv("OUTBOX_SOAK_EVENTS"))
	if total == 0 {
		t.Skip("set OUTBOX_SOAK_EVENTS (e.g. 1000000) to run the soak")
	}
	s := newSetup(t)
	topic := testenv.Topic(t, s.kafka(t), 12)
	pub := s.publisher(t)
	r := s.relay(t, pub, relay.Config{BatchSize: 500, Retention: 5 * time.Second, CleanupInterval: time.Second, CleanupBatch: 5000})
	if err := r.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Stop(s.ctx) }()

	rate, _ := strconv.Atoi(os.Getenv("OUTBOX_SOAK_RATE"))
	if rate == 0 {
		rate = 5000
	}
	const writers, perTx = 8, 10
	pace := time.NewTicker(time.Second * perTx / time.Duration(rate)) // one transaction per tick, shared by the writers
	defer pace.Stop()
	payload := map[string]string{"data": strings.Repeat("x", 200)}
	var written atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; written.Load() < int64(total); i++ {
				<-pace.C
				err := s.uow.Do(s.ctx, func(ctx context.Context, tx unitofwork.Tx) error {
					for j := range perTx {
						if err := tx.Add(ctx, outbox.Event{AggregateType: "acct", AggregateID: fmt.Sprintf("k%d-%d", w, (i+j)%100),
							Type: "acct.changed.v1", Topic: topic, Payload: payload}); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					t.Error(err)
					return
				}
				written.Add(perTx)
			}
		}()
	}
	before := measure(t, s.pool, s.table)
	t.Logf("start: %v", before)
	var peak, firstHalf tableSize
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	for running := true; running; {
		select {
		case <-done:
			running = false
		case <-tick.C:
		}
		z := measure(t, s.pool, s.table)
		if written.Load() <= int64(total/2) {
			firstHalf.heap = max(firstHalf.heap, z.heap)
		}
		peak.heap, peak.unpublished, peak.dead = max(peak.heap, z.heap), max(peak.unpublished, z.unpublished), max(peak.dead, z.dead)
		t.Logf("%6.0fs written %d, backlog %d: %v", time.Since(start).Seconds(), written.Load(), s.unpublished(t), z)
	}
	waitUntil(t, 5*time.Minute, "the backlog to drain", func() bool { return s.unpublished(t) == 0 })
	time.Sleep(8 * time.Second) // retention 5s + a cleanup pass
	for n := 1; n > 0; {
		n, _ = r.Cleanup(s.ctx)
	}
	_, _ = s.pool.Exec(s.ctx, "VACUUM "+sqlname.Ident(s.table))
	after := measure(t, s.pool, s.table)
	elapsed := time.Since(start)
	t.Logf("end after %v (%.0f events/s written and published): %v; peak heap %s, peak unpublished index %s, peak dead %d",
		elapsed.Round(time.Second), float64(written.Load())/elapsed.Seconds(), after, mib(peak.heap), mib(peak.unpublished), peak.dead)
	var left int
	_ = s.pool.QueryRow(s.ctx, "SELECT count(*) FROM "+sqlname.Ident(s.table)).Scan(&left)
	if left != 0 {
		t.Errorf("%d rows left after retention", left)
	}
	if firstHalf.heap == 0 || float64(peak.heap) > 1.5*float64(firstHalf.heap) {
		t.Errorf("peak heap %s against %s in the first half: the table grows with the event count", mib(peak.heap), mib(firstHalf.heap))
	}
}
