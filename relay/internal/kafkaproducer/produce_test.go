package kafkaproducer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay/internal/kafkaproducer"
)

// config is the configuration the relay gives the producer by default
// (relay.DefaultSaramaConfig, which this package cannot import).
func config() *sarama.Config {
	c := sarama.NewConfig()
	c.ClientID = "kafkaproducer-test"
	c.Version = sarama.V2_8_0_0
	c.Producer.Idempotent = true
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Net.MaxOpenRequests = 1
	c.Producer.Retry.Max = 10
	c.Producer.Retry.Backoff = 100 * time.Millisecond
	c.Producer.Timeout = 10 * time.Second
	c.Metadata.Retry.Max = 3
	c.Producer.Partitioner = sarama.NewMurmur2Partitioner
	return c
}

func newLazy(t *testing.T, brokers []string, cfg *sarama.Config) *kafkaproducer.Lazy {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	l := kafkaproducer.NewLazy(brokers, cfg)
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func record(topic, key string, seq int) kafkaproducer.Record {
	return kafkaproducer.Record{Topic: topic, Key: []byte(key), Value: []byte(strconv.Itoa(seq)),
		Headers: []kafkaproducer.Header{{Key: "seq", Value: []byte(strconv.Itoa(seq))}}}
}

// Concurrent Produce calls with disjoint keys share the topic's partitions:
// every record is acknowledged and every key's records are in order (the
// calls' record batches interleave per partition with consecutive sequence
// numbers; a gap would fail a call with OutOfOrderSequenceNumber). Each
// acknowledged record says where it was stored, as a consumer finds it,
// with its header.
func TestConcurrentProducesShareTheirPartitions(t *testing.T) {
	t.Parallel()
	brokers := testenv.Brokers(t)
	topic := testenv.Topic(t, brokers, 3)
	prod := newLazy(t, brokers, config())
	const (
		callers = 4
		rounds  = 10
		perKey  = 5
		keys    = 10 // per caller
	)
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		stored = map[string]string{} // key/seq -> partition/offset@broker reported
	)
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				var recs []kafkaproducer.Record
				for i := range perKey * keys {
					recs = append(recs, record(topic, fmt.Sprintf("c%d-k%d", c, i%keys), r*perKey+i/keys))
				}
				res, err := prod.Produce(context.Background(), recs)
				if err != nil {
					t.Errorf("caller %d round %d: %v", c, r, err)
					return
				}
				mu.Lock()
				for i, x := range res {
					switch {
					case x.Err != nil:
						t.Errorf("caller %d round %d record %d: %v", c, r, i, x.Err)
					case x.Stored:
						stored[string(recs[i].Key)+"/"+string(recs[i].Value)] = fmt.Sprintf("%d/%d@%s", x.Partition, x.Offset, x.Broker)
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	const total = callers * rounds * perKey * keys
	records := testenv.Consume(t, brokers, topic).WaitFor(total, time.Minute)
	if len(records) != total {
		t.Errorf("%d records, want %d", len(records), total)
	}
	got := map[string][]int{}
	wrong := 0
	for _, m := range records {
		seq, _ := strconv.Atoi(string(m.Value))
		got[string(m.Key)] = append(got[string(m.Key)], seq)
		if testenv.Header(m, "seq") != string(m.Value) {
			t.Errorf("record %s/%s: header seq %q", m.Key, m.Value, testenv.Header(m, "seq"))
		}
		id := string(m.Key) + "/" + string(m.Value)
		if want := fmt.Sprintf("%d/%d@", m.Partition, m.Offset); !strings.HasPrefix(stored[id], want) || !strings.Contains(stored[id], ":") {
			if wrong++; wrong <= 3 {
				t.Errorf("record %s consumed at %s, Produce reported %q (want partition/offset@host:port)", id, want, stored[id])
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

// A record the broker rejects for its content (over the topic's
// max.message.bytes) fails alone and permanently: the records before it in
// its partition are delivered (the rejected batch is split down to it),
// the later ones are Held, not sent, so none overtakes it. The rejected
// batch used no sequence numbers: the next call's records follow on the
// partition.
func TestRejectedRecordFailsAloneAndHoldsItsPartition(t *testing.T) {
	t.Parallel()
	brokers := testenv.Brokers(t)
	topic := testenv.Name("test.topic.")
	maxBytes := "100000"
	testenv.CreateTopicWithConfig(t, brokers, topic, 1, map[string]*string{"max.message.bytes": &maxBytes})
	prod := newLazy(t, brokers, config())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	const n, bad = 20, 12
	var recs []kafkaproducer.Record
	for i := range n {
		recs = append(recs, record(topic, "k"+strconv.Itoa(i%3), i))
	}
	recs[bad].Value = []byte(strings.Repeat("x", 300000))
	res, err := prod.Produce(ctx, recs)
	if err != nil {
		t.Fatal(err)
	}
	for i, x := range res {
		switch {
		case i < bad && (x.Err != nil || !x.Stored || x.Offset != int64(i)):
			t.Errorf("record %d: %+v, want acknowledged at offset %d", i, x, i)
		case i == bad && (!x.Permanent || x.Held || !errors.Is(x.Err, sarama.ErrMessageSizeTooLarge)):
			t.Errorf("record %d: %+v, want a permanent failure wrapping MessageSizeTooLarge", i, x)
		case i > bad && (!x.Held || x.Permanent || x.Err == nil || x.Stored):
			t.Errorf("record %d: %+v, want held behind the rejected record", i, x)
		}
	}
	next := []kafkaproducer.Record{record(topic, "k0", n), record(topic, "k1", n+1)}
	res, err = prod.Produce(ctx, next)
	if err != nil {
		t.Fatal(err)
	}
	for i, x := range res {
		if x.Err != nil || x.Offset != int64(bad+i) {
			t.Errorf("next record %d: %+v, want acknowledged at offset %d", i, x, bad+i)
		}
	}
	records := testenv.Consume(t, brokers, topic).WaitFor(bad+2, time.Minute)
	var seqs []string
	for _, m := range records {
		seqs = append(seqs, string(m.Value))
	}
	want := []string{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "20", "21"}
	if !slices.Equal(seqs, want) {
		t.Errorf("partition holds %v, want %v", seqs, want)
	}
}

// With auto-creation off, records to a topic that does not exist fail
// permanently (with the broker's UnknownTopicOrPartition) on the first call
// and on every later one, after sarama's metadata retries only, never as a
// transient "circuit breaker is open"; records to an existing topic in the
// same calls are acknowledged.
func TestMissingTopicFailsPermanentlyAtOnce(t *testing.T) {
	t.Parallel()
	brokers := testenv.Brokers(t)
	good := testenv.Topic(t, brokers, 2)
	missing := testenv.Name("test.missing.")
	cfg := config()
	cfg.Metadata.AllowAutoTopicCreation = false
	prod := newLazy(t, brokers, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const calls = 3
	for c := range calls {
		recs := []kafkaproducer.Record{record(good, "a", 0), record(missing, "a", 1), record(good, "b", 2), record(missing, "b", 3)}
		res, err := prod.Produce(ctx, recs)
		if err != nil {
			t.Fatalf("call %d: %v", c, err)
		}
		for i, x := range res {
			if i%2 == 0 && (x.Err != nil || !x.Stored) {
				t.Errorf("call %d: record %d to the existing topic: %+v, want acknowledged", c, i, x)
			}
			if i%2 == 1 && (!x.Permanent || !errors.Is(x.Err, sarama.ErrUnknownTopicOrPartition)) {
				t.Errorf("call %d: record %d: %+v, want a permanent failure wrapping UnknownTopicOrPartition", c, i, x)
			}
		}
	}
	if n := testenv.RecordCount(t, brokers, good); n != 2*calls {
		t.Errorf("%d records in the existing topic, want %d", n, 2*calls)
	}
}

// Lazy does no I/O before its first call, returns a caller whose ctx ends
// while it connects to an unreachable broker, and after Close fails every
// call with ErrClosed.
func TestLazyConnectAndClose(t *testing.T) {
	t.Parallel()
	cfg := config()
	cfg.Net.DialTimeout = 200 * time.Millisecond
	cfg.Metadata.Retry.Max = 0
	prod := kafkaproducer.NewLazy([]string{"127.0.0.1:1"}, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := prod.Produce(ctx, []kafkaproducer.Record{record("t", "k", 0)}); !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, sarama.ErrOutOfBrokers) {
		t.Errorf("Produce against no broker = %v, want ctx's deadline or out of brokers", err)
	}
	if err := prod.Ping(context.Background()); err == nil {
		t.Error("Ping against no broker succeeded")
	}
	if err := prod.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := prod.Produce(context.Background(), nil); !errors.Is(err, kafkaproducer.ErrClosed) {
		t.Errorf("Produce after Close = %v, want ErrClosed", err)
	}
	if err := prod.Ping(context.Background()); !errors.Is(err, kafkaproducer.ErrClosed) {
		t.Errorf("Ping after Close = %v, want ErrClosed", err)
	}
}
