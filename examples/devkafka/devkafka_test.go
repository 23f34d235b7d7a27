package devkafka_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/fxoutbox/outbox/examples/devkafka"
)

const (
	numMessages   = 1000
	numPartitions = 12
)

// newestWorkingVersion is the newest sarama.KafkaVersion that passes the
// idempotent round trip against kfake (see TestSaramaVersionSweep).
var newestWorkingVersion = sarama.V4_3_1_0

func startBroker(t *testing.T, cfg devkafka.Config) *devkafka.Broker {
	t.Helper()
	b, err := devkafka.Start(cfg)
	if err != nil {
		t.Fatalf("start broker: %v", err)
	}
	t.Cleanup(b.Close)
	return b
}

func producerConfig(v sarama.KafkaVersion) *sarama.Config {
	cfg := sarama.NewConfig()
	cfg.Version = v
	cfg.ClientID = "devkafka-test"
	cfg.Producer.Idempotent = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Net.MaxOpenRequests = 1
	cfg.Producer.Retry.Max = 5
	cfg.Producer.Retry.Backoff = 50 * time.Millisecond
	cfg.Producer.Return.Successes = true
	cfg.Producer.Return.Errors = true
	cfg.Metadata.Retry.Backoff = 50 * time.Millisecond
	return cfg
}

type sent struct {
	key, value string
	seq        int
	partition  int32
	offset     int64
}

func TestBrokerListensOnLoopbackOnly(t *testing.T) {
	b := startBroker(t, devkafka.Config{})
	addrs := b.Addrs()
	if len(addrs) != 1 {
		t.Fatalf("Addrs() = %v, want one address", addrs)
	}
	host, _, err := net.SplitHostPort(addrs[0])
	if err != nil {
		t.Fatal(err)
	}
	if host != "127.0.0.1" {
		t.Fatalf("broker listens on %q, want 127.0.0.1", addrs[0])
	}
	if b.Port() == 0 {
		t.Fatalf("Port() = 0 for %v", addrs)
	}
	conn, err := net.DialTimeout("tcp", addrs[0], 2*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addrs[0], err)
	}
	_ = conn.Close()

	b.Close()
	b.Close() // idempotent
}

func TestFixedPort(t *testing.T) {
	// Grab a free port, release it, and ask the broker for it.
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()

	b := startBroker(t, devkafka.Config{Port: port})
	if got, want := b.Addrs()[0], "127.0.0.1:"+strconv.Itoa(port); got != want {
		t.Fatalf("Addrs()[0] = %q, want %q", got, want)
	}
	// A second broker on the same port must fail, not silently pick another.
	if b2, err := devkafka.Start(devkafka.Config{Port: port}); err == nil {
		b2.Close()
		t.Fatalf("second broker on port %d started", port)
	}
}

func TestSaramaIdempotentRoundTrip(t *testing.T) {
	for _, v := range []sarama.KafkaVersion{sarama.V2_8_0_0, newestWorkingVersion} {
		t.Run(v.String(), func(t *testing.T) {
			b := startBroker(t, devkafka.Config{Partitions: numPartitions})
			if err := roundTrip(b.Addrs(), v, "orders-"+v.String(), numMessages, true); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestSaramaVersionSweep tries every sarama version from 2.8 upward. It is
// slow, so it only runs with DEVKAFKA_VERSION_SWEEP=1.
func TestSaramaVersionSweep(t *testing.T) {
	if os.Getenv("DEVKAFKA_VERSION_SWEEP") == "" {
		t.Skip("set DEVKAFKA_VERSION_SWEEP=1 to try every sarama version against kfake")
	}
	b := startBroker(t, devkafka.Config{Partitions: numPartitions})
	var newest sarama.KafkaVersion
	for _, v := range sarama.SupportedVersions {
		if !v.IsAtLeast(sarama.V2_8_0_0) {
			continue
		}
		err := roundTrip(b.Addrs(), v, "sweep-"+v.String(), 200, true)
		if err != nil {
			t.Errorf("sarama Version %s: %v", v, err)
			continue
		}
		t.Logf("sarama Version %s: ok", v)
		newest = v
	}
	t.Logf("newest working version: %s (sarama.MaxVersion is %s)", newest, sarama.MaxVersion)
}

func TestAutoCreateTopics(t *testing.T) {
	t.Run("enabled", func(t *testing.T) {
		b := startBroker(t, devkafka.DefaultConfig())
		// No CreateTopics: the producer's metadata request creates the topic
		// with the default partition count (12).
		if err := roundTrip(b.Addrs(), sarama.V2_8_0_0, "auto-created", 100, false); err != nil {
			t.Fatal(err)
		}
		n := partitionsOf(t, b.Addrs(), "auto-created")
		if n != devkafka.DefaultPartitions {
			t.Fatalf("auto-created topic has %d partitions, want %d", n, devkafka.DefaultPartitions)
		}
	})
	t.Run("custom default partitions", func(t *testing.T) {
		b := startBroker(t, devkafka.Config{Partitions: 3, AutoCreateTopics: true})
		if err := roundTrip(b.Addrs(), sarama.V2_8_0_0, "auto-3", 30, false); err != nil {
			t.Fatal(err)
		}
		if n := partitionsOf(t, b.Addrs(), "auto-3"); n != 3 {
			t.Fatalf("auto-created topic has %d partitions, want 3", n)
		}
	})
	t.Run("disabled", func(t *testing.T) {
		b := startBroker(t, devkafka.Config{})
		cfg := producerConfig(sarama.V2_8_0_0)
		cfg.Producer.Retry.Max = 1
		cfg.Metadata.Retry.Max = 1
		p, err := sarama.NewSyncProducer(b.Addrs(), cfg)
		if err != nil {
			t.Fatalf("new producer: %v", err)
		}
		defer p.Close()
		_, _, err = p.SendMessage(&sarama.ProducerMessage{Topic: "missing", Value: sarama.StringEncoder("x")})
		if !errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
			t.Fatalf("send to a missing topic without auto-create: err = %v, want %v", err, sarama.ErrUnknownTopicOrPartition)
		}
	})
}

// TestSaramaIdempotentRetryAfterConnectionDrop drops the connection on one
// produce request: the idempotent producer must retry it without losing,
// duplicating or reordering messages.
func TestSaramaIdempotentRetryAfterConnectionDrop(t *testing.T) {
	b := startBroker(t, devkafka.Config{Partitions: numPartitions})
	var produces atomic.Int32
	b.Cluster().ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		if produces.Add(1) == 3 {
			return nil, errors.New("devkafka test: injected connection drop"), true
		}
		return nil, nil, false
	})
	if err := roundTrip(b.Addrs(), sarama.V2_8_0_0, "retried", 200, true); err != nil {
		t.Fatal(err)
	}
	if n := produces.Load(); n < 3 {
		t.Fatalf("only %d produce requests seen; the drop was not injected", n)
	}
}

// TestSaramaConsumerGroup checks that a sarama consumer group can join,
// consume every message and commit offsets on the development broker.
func TestSaramaConsumerGroup(t *testing.T) {
	for _, v := range []sarama.KafkaVersion{sarama.V2_8_0_0, newestWorkingVersion} {
		t.Run(v.String(), func(t *testing.T) {
			b := startBroker(t, devkafka.DefaultConfig())
			const topic, n = "grouped", 120
			p, err := sarama.NewSyncProducer(b.Addrs(), producerConfig(v))
			if err != nil {
				t.Fatal(err)
			}
			for i := range n {
				_, _, err := p.SendMessage(&sarama.ProducerMessage{
					Topic: topic, Key: sarama.StringEncoder(strconv.Itoa(i)), Value: sarama.StringEncoder("v"),
				})
				if err != nil {
					t.Fatalf("send %d: %v", i, err)
				}
			}
			_ = p.Close()

			cfg := sarama.NewConfig()
			cfg.Version = v
			cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
			cfg.Consumer.MaxWaitTime = 100 * time.Millisecond
			cfg.Consumer.Offsets.AutoCommit.Interval = 100 * time.Millisecond
			g, err := sarama.NewConsumerGroup(b.Addrs(), "devkafka-test-group", cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			h := &countingHandler{want: n, done: make(chan struct{})}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			errc := make(chan error, 1)
			go func() {
				for ctx.Err() == nil {
					if err := g.Consume(ctx, []string{topic}, h); err != nil {
						errc <- err
						return
					}
				}
				errc <- nil
			}()
			select {
			case <-h.done:
			case err := <-errc:
				t.Fatalf("consume: %v (got %d of %d)", err, h.got.Load(), n)
			case <-ctx.Done():
				t.Fatalf("timed out: got %d of %d", h.got.Load(), n)
			}
			cancel()
			if err := <-errc; err != nil {
				t.Fatalf("consume: %v", err)
			}
		})
	}
}

type countingHandler struct {
	want int32
	got  atomic.Int32
	once sync.Once
	done chan struct{}
}

func (*countingHandler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (*countingHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }
func (h *countingHandler) ConsumeClaim(s sarama.ConsumerGroupSession, c sarama.ConsumerGroupClaim) error {
	for m := range c.Messages() {
		s.MarkMessage(m, "")
		if h.got.Add(1) >= h.want {
			s.Commit()
			h.once.Do(func() { close(h.done) })
		}
	}
	return nil
}

func partitionsOf(t *testing.T, addrs []string, topic string) int {
	t.Helper()
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V2_8_0_0
	client, err := sarama.NewClient(addrs, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ps, err := client.Partitions(topic)
	if err != nil {
		t.Fatal(err)
	}
	return len(ps)
}

// roundTrip optionally creates topic with numPartitions partitions through
// sarama's ClusterAdmin, produces n keyed messages with headers through an
// idempotent SyncProducer, consumes them back and checks count, keys, values,
// headers, offsets and per-partition order.
func roundTrip(addrs []string, v sarama.KafkaVersion, topic string, n int, create bool) error {
	if create {
		acfg := sarama.NewConfig()
		acfg.Version = v
		admin, err := sarama.NewClusterAdmin(addrs, acfg)
		if err != nil {
			return fmt.Errorf("cluster admin: %w", err)
		}
		err = admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: numPartitions, ReplicationFactor: 1}, false)
		if err != nil {
			_ = admin.Close()
			return fmt.Errorf("create topic: %w", err)
		}
		md, err := admin.DescribeTopics([]string{topic})
		_ = admin.Close()
		if err != nil {
			return fmt.Errorf("describe topic: %w", err)
		}
		if len(md) != 1 || len(md[0].Partitions) != numPartitions {
			return fmt.Errorf("describe topic: got %+v, want 1 topic with %d partitions", md, numPartitions)
		}
	}

	producer, err := sarama.NewSyncProducer(addrs, producerConfig(v))
	if err != nil {
		return fmt.Errorf("new sync producer: %w", err)
	}
	msgs := make([]sent, n)
	pm := func(i int) *sarama.ProducerMessage {
		key := "aggregate-" + strconv.Itoa(i%37)
		value := fmt.Sprintf("event-%05d", i)
		msgs[i] = sent{key: key, value: value, seq: i}
		return &sarama.ProducerMessage{
			Topic: topic,
			Key:   sarama.StringEncoder(key),
			Value: sarama.StringEncoder(value),
			Headers: []sarama.RecordHeader{
				{Key: []byte("event-id"), Value: []byte(strconv.Itoa(i))},
				{Key: []byte("event-type"), Value: []byte("OrderPlaced")},
			},
		}
	}
	// Half one by one, half in batches, to exercise both paths.
	half := n / 2
	for i := 0; i < half; i++ {
		p, off, err := producer.SendMessage(pm(i))
		if err != nil {
			_ = producer.Close()
			return fmt.Errorf("send message %d: %w", i, err)
		}
		msgs[i].partition, msgs[i].offset = p, off
	}
	for start := half; start < n; start += 50 {
		end := min(start+50, n)
		batch := make([]*sarama.ProducerMessage, 0, end-start)
		for i := start; i < end; i++ {
			m := pm(i)
			m.Metadata = i
			batch = append(batch, m)
		}
		if err := producer.SendMessages(batch); err != nil {
			_ = producer.Close()
			return fmt.Errorf("send batch at %d: %w", start, err)
		}
		for _, m := range batch {
			i := m.Metadata.(int)
			msgs[i].partition, msgs[i].offset = m.Partition, m.Offset
		}
	}
	if err := producer.Close(); err != nil {
		return fmt.Errorf("close producer: %w", err)
	}

	// Expected records per partition, in offset order.
	want := map[int32][]sent{}
	keyPartition := map[string]int32{}
	for _, m := range msgs {
		if p, ok := keyPartition[m.key]; ok && p != m.partition {
			return fmt.Errorf("key %s went to partitions %d and %d", m.key, p, m.partition)
		}
		keyPartition[m.key] = m.partition
		want[m.partition] = append(want[m.partition], m)
	}
	for p, ms := range want {
		for j := range ms {
			if j > 0 && ms[j].offset != ms[j-1].offset+1 {
				return fmt.Errorf("partition %d: producer offsets not contiguous: %d then %d", p, ms[j-1].offset, ms[j].offset)
			}
		}
	}

	ccfg := sarama.NewConfig()
	ccfg.Version = v
	ccfg.Consumer.Return.Errors = true
	// kfake, like Kafka, holds an empty fetch for MaxWaitTime, and closing a
	// partition consumer waits for the fetch in flight: keep it short.
	ccfg.Consumer.MaxWaitTime = 100 * time.Millisecond
	consumer, err := sarama.NewConsumer(addrs, ccfg)
	if err != nil {
		return fmt.Errorf("new consumer: %w", err)
	}
	defer consumer.Close()
	partitions, err := consumer.Partitions(topic)
	if err != nil {
		return fmt.Errorf("partitions: %w", err)
	}
	if create && len(partitions) != numPartitions {
		return fmt.Errorf("topic has %d partitions, want %d", len(partitions), numPartitions)
	}

	// Consume all partitions at once: sarama batches new subscriptions.
	type result struct {
		n   int
		err error
	}
	results := make(chan result, len(partitions))
	running := 0
	for _, p := range partitions {
		exp := want[p]
		if len(exp) == 0 {
			continue
		}
		pc, err := consumer.ConsumePartition(topic, p, sarama.OffsetOldest)
		if err != nil {
			return fmt.Errorf("consume partition %d: %w", p, err)
		}
		running++
		go func() {
			n, err := consumePartition(pc, p, exp)
			if cerr := pc.Close(); err == nil && cerr != nil {
				err = fmt.Errorf("close partition consumer %d: %w", p, cerr)
			}
			results <- result{n, err}
		}()
	}
	total := 0
	var errs []error
	for range running {
		r := <-results
		total += r.n
		if r.err != nil {
			errs = append(errs, r.err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if total != n {
		return fmt.Errorf("consumed %d messages, want %d", total, n)
	}
	return nil
}

// consumePartition reads len(exp) messages and checks them, in order, against
// exp: offset, key, value and headers.
func consumePartition(pc sarama.PartitionConsumer, p int32, exp []sent) (int, error) {
	timeout := time.After(20 * time.Second)
	for j, e := range exp {
		var m *sarama.ConsumerMessage
		select {
		case m = <-pc.Messages():
		case cerr := <-pc.Errors():
			return j, fmt.Errorf("partition %d: %w", p, cerr)
		case <-timeout:
			return j, fmt.Errorf("partition %d: timed out after %d of %d messages", p, j, len(exp))
		}
		if m.Offset != e.offset {
			return j, fmt.Errorf("partition %d: message %d has offset %d, want %d", p, j, m.Offset, e.offset)
		}
		if string(m.Key) != e.key || string(m.Value) != e.value {
			return j, fmt.Errorf("partition %d offset %d: got %s=%s, want %s=%s (order broken?)", p, m.Offset, m.Key, m.Value, e.key, e.value)
		}
		if err := checkHeaders(m.Headers, e.seq); err != nil {
			return j, fmt.Errorf("partition %d offset %d: %w", p, m.Offset, err)
		}
	}
	return len(exp), nil
}

func checkHeaders(hs []*sarama.RecordHeader, seq int) error {
	if len(hs) != 2 {
		return fmt.Errorf("got %d headers, want 2", len(hs))
	}
	if string(hs[0].Key) != "event-id" || string(hs[0].Value) != strconv.Itoa(seq) {
		return fmt.Errorf("header 0 = %s:%s, want event-id:%d", hs[0].Key, hs[0].Value, seq)
	}
	if string(hs[1].Key) != "event-type" || string(hs[1].Value) != "OrderPlaced" {
		return fmt.Errorf("header 1 = %s:%s, want event-type:OrderPlaced", hs[1].Key, hs[1].Value)
	}
	return nil
}
