package relay_test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/admin"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// createTopicWithConfig creates a topic with topic-level configs and waits
// until every partition's leader answers.
func createTopicWithConfig(t *testing.T, brokers []string, name string, partitions int32, configs map[string]string) {
	t.Helper()
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V2_8_0_0
	admin, err := sarama.NewClusterAdmin(brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	entries := map[string]*string{}
	for k, v := range configs {
		entries[k] = &v
	}
	if err := admin.CreateTopic(name, &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: 1, ConfigEntries: entries}, false); err != nil {
		t.Fatalf("create topic %s: %v", name, err)
	}
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	waitUntil(t, 30*time.Second, "topic "+name+" to be served", func() bool {
		if client.RefreshMetadata(name) != nil {
			return false
		}
		ps, err := client.Partitions(name)
		if err != nil || len(ps) != int(partitions) {
			return false
		}
		for _, p := range ps {
			if _, err := client.GetOffset(name, p, sarama.OffsetNewest); err != nil {
				return false
			}
		}
		return true
	})
}

// writeSeq commits n events, one per transaction, keys cycling over keys;
// event i carries seq from+i.
func (s *setup) writeSeq(t *testing.T, topic string, from, n, keys int) {
	t.Helper()
	for i := range n {
		err := s.uow.Do(s.ctx, func(ctx context.Context, tx unitofwork.Tx) error {
			return tx.Add(ctx, outbox.Event{
				AggregateType: "order", AggregateID: fmt.Sprintf("k%d", i%keys), Type: "order.updated.v1",
				Topic: topic, Payload: map[string]int{"seq": from + i},
			})
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// firstDeliveries reads every record of topic and returns, per key, the
// seq of each event's first delivery, in log order, and the records.
func firstDeliveries(t *testing.T, brokers []string, topic string) (map[string][]int, []*sarama.ConsumerMessage) {
	t.Helper()
	total := testenv.RecordCount(t, brokers, topic)
	cons := testenv.Consume(t, brokers, topic)
	msgs := cons.WaitFor(total, time.Minute)
	cons.Close()
	slices.SortFunc(msgs, func(a, b *sarama.ConsumerMessage) int {
		return cmp.Or(cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Offset, b.Offset))
	})
	seen := map[string]bool{}
	got := map[string][]int{}
	for _, m := range msgs {
		id := testenv.Header(m, outbox.HeaderEventID)
		if seen[id] {
			continue
		}
		seen[id] = true
		var p struct{ Seq int }
		if err := json.Unmarshal(m.Value, &p); err != nil {
			t.Fatalf("record %d/%d: %v", m.Partition, m.Offset, err)
		}
		got[string(m.Key)] = append(got[string(m.Key)], p.Seq)
	}
	return got, msgs
}

// A broker rejects a whole record batch for one record over the topic's
// max.message.bytes (below the relay's MaxMessageBytes, so the relay
// sends it). The rejection must not let a later event of any key in that
// batch reach Kafka ahead of the re-sent earlier ones: each key's first
// deliveries stay in write order, and only the oversized event is parked.
func TestRejectedRecordBatchKeepsKeyOrder(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	brokers := s.kafka(t)
	topic := testenv.Name("test.topic.")
	createTopicWithConfig(t, brokers, topic, 2, map[string]string{"max.message.bytes": "100000"})

	const keys = 10
	s.writeSeq(t, topic, 0, 30, keys)
	poison := s.insertRaw(t, topic, "k3", []byte(`{"seq":-1,"blob":"`+strings.Repeat("x", 300000)+`"}`))
	s.writeSeq(t, topic, 30, 400, keys)

	r := s.relay(t, s.publisher(t), relay.Config{BatchSize: 500, MaxAttempts: 1})
	for i := 0; s.unpublishedUnparked(t) > 0; i++ {
		if i > 20 {
			t.Fatal("relay made no progress")
		}
		if _, err := r.RunOnce(s.ctx); err != nil && !outbox.IsPermanent(err) {
			t.Fatalf("RunOnce: %v", err)
		}
	}
	parked, err := admin.ListParked(s.ctx, s.pool, s.table, admin.Filter{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(parked) != 1 || parked[0].EventID != poison {
		t.Fatalf("parked = %+v, want the oversized event alone", parked)
	}
	if !strings.Contains(parked[0].LastError, "too large") {
		t.Errorf("parked reason %q: want the broker's message-too-large", parked[0].LastError)
	}
	got, records := firstDeliveries(t, brokers, topic)
	for k := range keys {
		key := fmt.Sprintf("k%d", k)
		var want []int
		for seq := k; seq < 430; seq += keys {
			want = append(want, seq)
		}
		if !slices.Equal(got[key], want) {
			t.Errorf("key %s: first deliveries %v, want %v", key, got[key], want)
		}
	}
	t.Logf("%d records for 430 events", len(records))
}

// With auto-creation off, messages to a topic that does not exist fail
// permanently (with the broker's UnknownTopicOrPartition) on the first
// Publish and on every later one, after sarama's metadata retries only,
// never as a transient "circuit breaker is open"; messages to an existing
// topic in the same calls are acknowledged.
func TestMissingTopicFailsPermanentlyAtOnce(t *testing.T) {
	t.Parallel()
	brokers := testenv.Brokers(t)
	good := testenv.Topic(t, brokers, 2)
	missing := testenv.Name("test.missing.")
	cfg := relay.DefaultSaramaConfig()
	cfg.Metadata.AllowAutoTopicCreation = false
	pub, err := relay.NewSaramaPublisher(brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const calls = 5
	for c := range calls {
		msgs := []relay.Message{
			{EventID: uuid.New(), Topic: good, Key: []byte("a"), Value: []byte(`{}`)},
			{EventID: uuid.New(), Topic: missing, Key: []byte("a"), Value: []byte(`{}`)},
			{EventID: uuid.New(), Topic: good, Key: []byte("b"), Value: []byte(`{}`)},
			{EventID: uuid.New(), Topic: missing, Key: []byte("b"), Value: []byte(`{}`)},
		}
		start := time.Now()
		err := pub.Publish(ctx, msgs)
		var be *relay.BatchError
		if !errors.As(err, &be) {
			t.Fatalf("call %d: Publish = %v, want a *BatchError", c, err)
		}
		if len(be.Failed) != 2 || be.Failed[1] == nil || be.Failed[3] == nil {
			t.Fatalf("call %d: failed %v, want messages 1 and 3 (the missing topic's) alone", c, be.Failed)
		}
		for _, i := range []int{1, 3} {
			if e := be.Failed[i]; !outbox.IsPermanent(e) || !errors.Is(e, sarama.ErrUnknownTopicOrPartition) {
				t.Errorf("call %d: message %d: %v, want a permanent error wrapping UnknownTopicOrPartition", c, i, e)
			}
		}
		t.Logf("call %d took %v", c, time.Since(start).Round(time.Millisecond))
	}
	if n := testenv.RecordCount(t, brokers, good); n != 2*calls {
		t.Errorf("%d records in the existing topic, want %d", n, 2*calls)
	}
}

// Concurrent Publish calls with disjoint keys share the topic's partitions:
// each call's messages are acknowledged and every key's records are in
// order (the calls' record batches interleave per partition with
// consecutive sequence numbers; a gap would fail a call with
// OutOfOrderSequenceNumber). Each acknowledged message says where it was
// stored, as a consumer finds it.
func TestConcurrentPublishesShareTheirPartitions(t *testing.T) {
	t.Parallel()
	brokers := testenv.Brokers(t)
	topic := testenv.Topic(t, brokers, 3)
	pub, err := relay.NewSaramaPublisher(brokers, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	const (
		callers = 4
		rounds  = 20
		perKey  = 5
		keys    = 10 // per caller
	)
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		stored = map[string]string{} // event id -> partition/offset@broker reported
	)
	errs := make(chan error, callers*rounds)
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				var msgs []relay.Message
				for i := range perKey * keys {
					v, _ := json.Marshal(map[string]int{"seq": r*perKey + i/keys})
					id := uuid.New()
					msgs = append(msgs, relay.Message{EventID: id, Topic: topic, Key: []byte(fmt.Sprintf("c%d-k%d", c, i%keys)), Value: v,
						Headers: []relay.Header{{Key: outbox.HeaderEventID, Value: []byte(id.String())}}})
				}
				if err := pub.Publish(context.Background(), msgs); err != nil {
					errs <- fmt.Errorf("caller %d round %d: %w", c, r, err)
					return
				}
				mu.Lock()
				for _, m := range msgs {
					if m.Stored {
						stored[m.EventID.String()] = fmt.Sprintf("%d/%d@%s", m.Partition, m.Offset, m.Broker)
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	got, records := firstDeliveries(t, brokers, topic)
	if len(records) != callers*rounds*perKey*keys {
		t.Errorf("%d records, want %d", len(records), callers*rounds*perKey*keys)
	}
	wrong := 0
	for _, m := range records {
		id := testenv.Header(m, outbox.HeaderEventID)
		if want := fmt.Sprintf("%d/%d@", m.Partition, m.Offset); !strings.HasPrefix(stored[id], want) || !strings.Contains(stored[id], ":") {
			if wrong++; wrong <= 3 {
				t.Errorf("event %s consumed at %s, Publish reported %q (want partition/offset@host:port)", id, want, stored[id])
			}
		}
	}
	for c := range callers {
		for k := range keys {
			key := fmt.Sprintf("c%d-k%d", c, k)
			if seqs := got[key]; len(seqs) != rounds*perKey || !slices.IsSorted(seqs) {
				t.Errorf("key %s: %v, want 0..%d in order", key, seqs, rounds*perKey-1)
			}
		}
	}
}
