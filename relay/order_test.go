package relay_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"

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
	orderScenario(t, testOrdering(), relay.Poll, 4, 150*time.Millisecond, 250*time.Millisecond, 0)
}

// TestExactlyOnceAcrossEightReplicasWithKills is the 8-replica kill
// scenario with Delivery ExactlyOnce: a replica killed mid-batch leaves its
// Kafka transaction open, committed but unmarked, or not begun, and the
// next owner of each lane fences it and reads the lane's progress back. A
// read_committed consumer gets every event exactly once, each key in write
// order; a read_uncommitted one still gets every event.
func TestExactlyOnceAcrossEightReplicasWithKills(t *testing.T) {
	t.Parallel()
	scenario(t, relay.PerKey, relay.Poll, relay.ExactlyOnce, 8, 500*time.Millisecond, 0, 0)
}

// testOrdering is PerKey, or Unordered with OUTBOX_TEST_ORDERING=unordered.
func testOrdering() relay.Ordering {
	if os.Getenv("OUTBOX_TEST_ORDERING") == "unordered" {
		return relay.Unordered
	}
	return relay.PerKey
}

// TestPerKeyOrderWithHeldKeysAcrossEightReplicas is the same with 8
// replicas, one of them killed every 500ms, and keys held back: the
// publisher fails about one event in 150 transiently, once, together with
// the later events of its key in that send (as a broker fails a partition's
// record batch), while the rest of the batch is published. The failed
// event's key waits for its paced retry in the relay that saw the failure,
// while other replicas (and the replacements of killed ones, which know
// nothing of the pacing) claim around it. OUTBOX_TEST_ORDERING=unordered
// runs it with the plain SKIP LOCKED claim, which it catches reordering.
func TestPerKeyOrderWithHeldKeysAcrossEightReplicas(t *testing.T) {
	t.Parallel()
	orderScenario(t, testOrdering(), relay.Poll, 8, 500*time.Millisecond, 0, 150)
}

// orderScenario runs writers and replicas relays on one table, replacing a
// random replica every killEvery (plus up to killSpread), and checks what a
// consumer got: nothing lost, each key's first deliveries in write order,
// duplicates only around kills. With failOneIn > 0 each replica's publisher
// fails about one event in failOneIn once, transiently, holding back the
// rest of its key in that send.
func orderScenario(t *testing.T, ordering relay.Ordering, mode relay.Mode, replicas int, killEvery, killSpread time.Duration, failOneIn int) {
	scenario(t, ordering, mode, relay.AtLeastOnce, replicas, killEvery, killSpread, failOneIn)
}

// scenario is orderScenario with a delivery. Under ExactlyOnce the
// consumer reads committed and no duplicate is allowed; a second consumer
// reads uncommitted and must find every event (the replicas' publishers
// are not wrapped: the relay publishes through its own transactional
// producers, so failOneIn must be 0).
func scenario(t *testing.T, ordering relay.Ordering, mode relay.Mode, delivery relay.Delivery, replicas int, killEvery, killSpread time.Duration, failOneIn int) {
	progress := relay.ProgressMarks
	if os.Getenv("OUTBOX_TEST_PROGRESS") == "cursor" && mode == relay.Poll && ordering == relay.PerKey && delivery == relay.AtLeastOnce {
		progress = relay.ProgressCursor
	}
	progressScenario(t, progress, ordering, mode, delivery, replicas, killEvery, killSpread, failOneIn)
}

// progressScenario is scenario with a Progress. Under ProgressCursor the
// rows stay unmarked: the test waits for the consumer to hold every event,
// and checks that no row was updated.
func progressScenario(t *testing.T, progress relay.Progress, ordering relay.Ordering, mode relay.Mode, delivery relay.Delivery, replicas int, killEvery, killSpread time.Duration, failOneIn int) {
	s := newSetup(t)
	if progress == relay.ProgressCursor {
		s.cursor(t)
	}
	if mode == relay.Stream {
		s.streaming(t)
	}
	brokers := s.kafka(t)
	topic := testenv.Topic(t, brokers, 12)
	eo := delivery == relay.ExactlyOnce
	var cons, uncommitted *testenv.Consumer
	if eo {
		cons = testenv.ConsumeCommitted(t, brokers, topic)
		uncommitted = testenv.Consume(t, brokers, topic)
	} else {
		cons = testenv.Consume(t, brokers, topic)
	}
	const (
		keys     = 200
		writers  = 4
		perKey   = 100 // 20k events
		batch    = 50
		maxBatch = 4 * batch // batches grow while a backlog waits
	)
	ctx, stopAll := context.WithCancel(s.ctx)
	defer stopAll()

	// The replicas must really publish at the same time: the most batches
	// in flight at once is asserted at the end.
	var inFlight, maxInFlight, heldBack atomic.Int64
	var failedOnce sync.Map // event ids failed once (failOneIn)
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
			if failOneIn == 0 {
				return pub.Publish(ctx, msgs)
			}
			return failSome(ctx, pub, msgs, failOneIn, &failedOnce, &heldBack)
		})
		cfg := relay.Config{Table: s.table, BatchSize: batch, MaxBatchSize: maxBatch, PollInterval: 20 * time.Millisecond, Ordering: ordering, Delivery: delivery, Progress: progress}
		if mode == relay.Stream {
			sc := streamConfig()
			cfg.Mode, cfg.Stream = sc.Mode, sc.Stream
		}
		var use relay.Publisher = counted
		if eo {
			use = pub
		}
		r, err := relay.New(s.pool, use, &cfg)
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

	// The killer: every killEvery (+ up to killSpread), replace a random
	// replica.
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
			case <-time.After(killEvery + time.Duration(rnd.Int64N(int64(killSpread)+1))):
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
	total := keys * perKey
	if progress == relay.ProgressCursor {
		cons.WaitForDistinct(total, 90*time.Second)
		s.noRowUpdated(t)
	} else {
		waitUntil(t, 90*time.Second, "all events published", func() bool { return s.unpublished(t) == 0 })
	}
	mu.Lock()
	for _, rep := range reps {
		if err := rep.r.Stop(s.ctx); err != nil {
			t.Error(err)
		}
		_ = rep.pub.Close()
	}
	mu.Unlock()

	if eo {
		// Every event reached Kafka, committed or not.
		seen := map[string]bool{}
		for _, m := range uncommitted.WaitFor(total, 60*time.Second) {
			seen[testenv.Header(m, outbox.HeaderEventID)] = true
		}
		if len(seen) < total {
			t.Fatalf("read_uncommitted: %d distinct events, want %d", len(seen), total)
		}
	}
	cons.WaitFor(total, 60*time.Second)
	time.Sleep(300 * time.Millisecond)
	msgs := cons.Messages()
	firstSeen := map[string]bool{}
	where := map[string]int64{}
	lastSeq := map[string]int{}
	dups, violations := 0, 0
	for _, m := range msgs { // per partition, in Kafka order; a key lives in one partition
		id := testenv.Header(m, outbox.HeaderEventID)
		if firstSeen[id] {
			dups++
			if eo && dups <= 5 {
				first := where[id]
				t.Logf("duplicate %s key %s: partition %d offsets %d and %d", id, m.Key, m.Partition, first, m.Offset)
			}
			continue
		}
		firstSeen[id] = true
		where[id] = m.Offset
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
	// Each kill can repeat at most the batch it abandoned; exactly once
	// repeats nothing for a read_committed consumer.
	if eo && dups > 0 {
		t.Errorf("read_committed: %d duplicates for %d kills, want none (exactly once)", dups, kills)
	}
	if dups > kills*maxBatch {
		t.Errorf("%d duplicates for %d kills, want at most %d", dups, kills, kills*maxBatch)
	}
	if m := maxInFlight.Load(); m < 2 && mode == relay.Poll && !eo {
		t.Errorf("at most %d replica published at a time: the test did not exercise concurrent replicas", m)
	}
	if failOneIn > 0 && heldBack.Load() == 0 {
		t.Error("no event was held back: the test did not exercise held keys")
	}
	t.Logf("progress %v, mode %v, delivery %v, ordering %v, %d replicas: %d events, %d kills, %d duplicates, %d order violations, up to %d replicas publishing at once, %d events failed or held back",
		progress, mode, delivery, ordering, replicas, total, kills, dups, violations, maxInFlight.Load(), heldBack.Load())
}

// failSome publishes msgs but fails about one event in oneIn (chosen by its
// id, each at most once) with a transient error, and holds back the later
// events of its key in msgs; the others are published.
func failSome(ctx context.Context, pub relay.Publisher, msgs []relay.Message, oneIn int, once *sync.Map, held *atomic.Int64) error {
	failed := map[int]error{}
	blocked := map[string]bool{}
	var send []relay.Message
	var sendIdx []int
	for i, m := range msgs {
		k := string(m.Key)
		switch {
		case blocked[k]:
			failed[i] = relay.ErrHeld
		case int(binary.BigEndian.Uint16(m.EventID[14:]))%oneIn == 0:
			if _, done := once.LoadOrStore(m.EventID, true); !done {
				failed[i] = fmt.Errorf("injected: %w", sarama.ErrNotEnoughReplicas)
				blocked[k] = true
				continue
			}
			fallthrough
		default:
			send, sendIdx = append(send, m), append(sendIdx, i)
		}
	}
	held.Add(int64(len(failed)))
	if len(send) > 0 {
		err := pub.Publish(ctx, send)
		var be *relay.BatchError
		switch {
		case err == nil:
		case errors.As(err, &be):
			for j, e := range be.Failed {
				failed[sendIdx[j]] = e
			}
		default:
			for _, i := range sendIdx {
				failed[i] = err
			}
		}
	}
	if len(failed) == 0 {
		return nil
	}
	return &relay.BatchError{Failed: failed}
}

// TestStreamPerKeyOrderAcrossReplicasWithKills is the kill scenario with
// streaming relays: one holds the slot, the others stand by and take over
// when it is killed (its replication connection closed mid-batch).
// Nothing lost, each key's first deliveries in commit order, duplicates
// only around kills.
func TestStreamPerKeyOrderAcrossReplicasWithKills(t *testing.T) {
	t.Parallel()
	orderScenario(t, testOrdering(), relay.Stream, 3, 150*time.Millisecond, 250*time.Millisecond, 0)
}

// TestStreamPerKeyOrderWithHeldKeys streams with transient failures of
// single events (and the rest of their key in the send) while replicas are
// killed: the failed event waits for its retry in the sweep, and its key's
// later streamed events are left to the sweep behind it.
func TestStreamPerKeyOrderWithHeldKeys(t *testing.T) {
	t.Parallel()
	orderScenario(t, testOrdering(), relay.Stream, 3, 500*time.Millisecond, 0, 150)
}
