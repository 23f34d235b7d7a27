package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// replica is one relay with its own producer, as a separate pod would have.
type replica struct {
	r   *relay.Relay
	pub *relay.SaramaPublisher
}

// TestPerKeyOrderAcrossReplicasWithKills runs 4 relay replicas on one table
// while writers commit 20k events over 200 keys, and kills a random replica
// (its in-flight batch abandoned mid-publish, its producer closed) every few
// hundred milliseconds, starting a fresh one in its place. Consumed back from
// Kafka: nothing lost, the first delivery of each key's events in write
// order, and duplicates only around the kills.
//
// OUTBOX_TEST_ORDERING=unordered runs the same test with the plain
// FOR UPDATE SKIP LOCKED claim, which it catches reordering keys.
func TestPerKeyOrderAcrossReplicasWithKills(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	brokers := s.kafka(t)
	topic := testenv.Topic(t, brokers, 12)
	cons := testenv.Consume(t, brokers, topic)
	ordering := relay.PerKey
	if os.Getenv("OUTBOX_TEST_ORDERING") == "unordered" {
		ordering = relay.Unordered
	}
	const (
		keys     = 200
		writers  = 4
		perKey   = 100 // 20k events
		replicas = 4
		batch    = 50
		maxBatch = 4 * batch // batches grow while a backlog waits
	)
	ctx, stopAll := context.WithCancel(s.ctx)
	defer stopAll()

	// The replicas must really publish at the same time: the most batches
	// in flight at once is asserted at the end.
	var inFlight, maxInFlight atomic.Int64
	newReplica := func() replica {
		pub, err := relay.NewSaramaPublisher(brokers, nil)
		if err != nil {
			t.Fatal(err)
		}
		counted := relay.PublisherFunc(func(ctx context.Context, msgs []relay.Message) error {
			n := inFlight.Add(1)
			defer inFlight.Add(-1)
			for m := maxInFlight.Load(); n > m && !maxInFlight.CompareAndSwap(m, n); m = maxInFlight.Load() {
			}
			return pub.Publish(ctx, msgs)
		})
		r, err := relay.New(s.pool, counted, &relay.Config{Table: s.table, BatchSize: batch, MaxBatchSize: maxBatch, PollInterval: 20 * time.Millisecond, Ordering: ordering})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Start(ctx); err != nil {
			t.Fatal(err)
		}
		return replica{r, pub}
	}
	kill := func(rep replica) {
		dead, cancel := context.WithCancel(context.Background())
		cancel() // no grace: the in-flight batch is abandoned wherever it is
		_ = rep.r.Stop(dead)
		_ = rep.pub.Close()
	}
	var mu sync.Mutex
	reps := make([]replica, replicas)
	for i := range reps {
		reps[i] = newReplica()
	}

	// Writers: each owns a quarter of the keys, so a key's events commit in
	// sequence order (as writers that lock their aggregate would).
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(uint64(w), 7))
			next := make([]int, keys/writers)
			for remaining := len(next) * perKey; remaining > 0; {
				k := rnd.IntN(len(next))
				if next[k] == perKey {
					continue
				}
				n := min(1+rnd.IntN(3), perKey-next[k])
				key := fmt.Sprintf("key-%d", w*len(next)+k)
				err := s.uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
					for i := range n {
						if err := tx.Add(ctx, outbox.Event{AggregateType: "acct", AggregateID: key, Type: "acct.changed.v1", Topic: topic,
							Payload: map[string]int{"seq": next[k] + i}}); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					errs <- err
					return
				}
				next[k] += n
				remaining -= n
			}
		}()
	}

	// The killer: every 150-400ms, replace a random replica.
	kills := 0
	killerDone := make(chan struct{})
	writersDone := make(chan struct{})
	go func() { wg.Wait(); close(writersDone) }()
	go func() {
		defer close(killerDone)
		rnd := rand.New(rand.NewPCG(42, 42))
		for {
			select {
			case <-writersDone:
				return
			case <-time.After(time.Duration(150+rnd.IntN(250)) * time.Millisecond):
			}
			i := rnd.IntN(replicas)
			mu.Lock()
			kill(reps[i])
			reps[i] = newReplica()
			kills++
			mu.Unlock()
		}
	}()
	<-writersDone
	<-killerDone
	close(errs)
	for err := range errs {
		t.Fatalf("writer: %v", err)
	}
	waitUntil(t, 90*time.Second, "all events published", func() bool { return s.unpublished(t) == 0 })
	mu.Lock()
	for _, rep := range reps {
		if err := rep.r.Stop(s.ctx); err != nil {
			t.Error(err)
		}
		_ = rep.pub.Close()
	}
	mu.Unlock()

	total := keys * perKey
	cons.WaitFor(total, 60*time.Second)
	time.Sleep(300 * time.Millisecond)
	msgs := cons.Messages()
	firstSeen := map[string]bool{}
	lastSeq := map[string]int{}
	dups, violations := 0, 0
	for _, m := range msgs { // per partition, in Kafka order; a key lives in one partition
		id := testenv.Header(m, outbox.HeaderEventID)
		if firstSeen[id] {
			dups++
			continue
		}
		firstSeen[id] = true
		var p struct{ Seq int }
		if err := json.Unmarshal(m.Value, &p); err != nil {
			t.Fatal(err)
		}
		key := string(m.Key)
		if last, ok := lastSeq[key]; ok && p.Seq != last+1 || !ok && p.Seq != 0 {
			if violations < 5 {
				t.Errorf("key %s: first delivery of seq %d after seq %d (ok=%v)", key, p.Seq, last, ok)
			}
			violations++
		}
		lastSeq[key] = max(lastSeq[key], p.Seq)
	}
	if len(firstSeen) != total {
		t.Errorf("consumed %d distinct events, want %d: events lost", len(firstSeen), total)
	}
	if violations > 0 {
		t.Errorf("%d per-key order violations (ordering %v)", violations, ordering)
	}
	// Each kill can repeat at most the batch it abandoned.
	if dups > kills*maxBatch {
		t.Errorf("%d duplicates for %d kills, want at most %d", dups, kills, kills*maxBatch)
	}
	if m := maxInFlight.Load(); m < 2 {
		t.Errorf("at most %d replica published at a time: the test did not exercise concurrent replicas", m)
	}
	t.Logf("ordering %v: %d events, %d kills, %d duplicates, %d order violations, up to %d replicas publishing at once",
		ordering, total, kills, dups, violations, maxInFlight.Load())
}
