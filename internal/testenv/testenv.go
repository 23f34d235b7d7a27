// Package testenv gives tests a real PostgreSQL schema and a real
// Kafka-protocol broker over TCP, taken from DATABASE_URL and KAFKA_BROKERS
// (make test starts both). Without them a test is skipped, unless
// OUTBOX_TEST_REQUIRE=1 (set by make test and CI), where it fails.
//
// Tests wait for what happens in the background with Eventually, which
// polls a condition that says how far things got, and never assert how long
// something took: the machines running them are loaded.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/migrations"
)

func need(t testing.TB, name, what string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		msg := fmt.Sprintf("%s is not set: this test needs %s (run `make test`, which starts one)", name, what)
		if os.Getenv("OUTBOX_TEST_REQUIRE") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return v
}

// Name returns a short random identifier with the given prefix.
func Name(prefix string) string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// Pool connects to DATABASE_URL and closes the pool when the test ends.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	url := need(t, "DATABASE_URL", "a PostgreSQL server")
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("DATABASE_URL: %v", err)
	}
	cfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Slot returns the name of table's replication slot in pool's database.
func Slot(t testing.TB, pool *pgxpool.Pool, table outbox.Table) string {
	t.Helper()
	var db string
	if err := pool.QueryRow(context.Background(), "SELECT current_database()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	return table.Slot(db)
}

// Streaming sets table up for the streaming relay as an operator would
// (migrations.Stream.Up creates its publication) and, when the test ends,
// drops its replication slot (a slot left behind pins WAL; its walsender
// may take a moment to end) and the publication. With createSlot it also
// creates the slot first (see CreateSlot). It returns the slot's name.
func Streaming(t testing.TB, pool *pgxpool.Pool, table outbox.Table, createSlot bool) string {
	t.Helper()
	ctx := context.Background()
	if err := migrations.Stream.Up(ctx, pool, table); err != nil {
		t.Fatal(err)
	}
	slot := Slot(t, pool, table)
	t.Cleanup(func() {
		deadline := time.Now().Add(15 * time.Second)
		for {
			_, err := pool.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", slot)
			if err == nil || time.Now().After(deadline) {
				if err != nil {
					t.Errorf("drop slot %s: %v", slot, err)
				}
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err := migrations.Stream.Down(ctx, pool, table, 0); err != nil {
			t.Errorf("drop the publication of %s: %v", table, err)
		}
	})
	if createSlot {
		CreateSlot(t, pool, slot)
	}
	return slot
}

// CreateSlot creates a pgoutput slot as the relay would. Creation waits for
// a snapshot of running transactions in which those it saw at its start
// have ended; the server logs one every 15s, or at a checkpoint: with other
// tests writing, it asks for checkpoints until the slot is ready.
func CreateSlot(t testing.TB, pool *pgxpool.Pool, slot string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			case <-time.After(300 * time.Millisecond):
				_, _ = pool.Exec(ctx, "CHECKPOINT")
			}
		}
	}()
	_, err := pool.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot)
	close(done)
	wg.Wait()
	if err != nil {
		t.Fatalf("create slot %s: %v", slot, err)
	}
}

// Table creates a fresh schema with the migrations applied and drops it when
// the test ends. Tests that use their own Table never see each other's rows.
func Table(t testing.TB, pool *pgxpool.Pool) outbox.Table {
	t.Helper()
	tbl := outbox.Table{Schema: Name("t_")}
	ctx := context.Background()
	if err := migrations.Outbox.Up(ctx, pool, tbl); err != nil {
		t.Fatalf("migrations: %v", err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA "+tbl.Schema+" CASCADE")
	})
	return tbl
}

// Brokers returns KAFKA_BROKERS.
func Brokers(t testing.TB) []string {
	t.Helper()
	return strings.Split(need(t, "KAFKA_BROKERS", "a Kafka-protocol broker"), ",")
}

// Topic creates a topic with a random name and the given partitions on the
// brokers and returns its name (tests never rely on auto-creation).
func Topic(t testing.TB, brokers []string, partitions int32) string {
	t.Helper()
	name := Name("test.topic.")
	CreateTopic(t, brokers, name, partitions)
	return name
}

// CreateTopic creates the named topic and waits until every partition's
// leader serves it.
//
// Visible metadata is not enough on Apache Kafka (KRaft): a broker publishes
// a new metadata image to its metadata cache before its replica manager
// creates the partitions, so for a moment Metadata names the broker as leader
// while ListOffsets (and so sarama's ConsumePartition) still fails with
// NOT_LEADER_OR_FOLLOWER. CreateTopic therefore waits until ListOffsets
// answers for every partition.
func CreateTopic(t testing.TB, brokers []string, name string, partitions int32) {
	t.Helper()
	CreateTopicDetail(t, brokers, name, &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: 1})
}

// CreateTopicWithConfig is CreateTopic with topic configs, e.g.
// {"max.message.bytes": "10000"}.
func CreateTopicWithConfig(t testing.TB, brokers []string, name string, partitions int32, configs map[string]*string) {
	t.Helper()
	CreateTopicDetail(t, brokers, name, &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: 1, ConfigEntries: configs})
}

// CreateTopicDetail is CreateTopic with the topic's replication factor and
// configuration entries (e.g. min.insync.replicas, max.message.bytes).
func CreateTopicDetail(t testing.TB, brokers []string, name string, detail *sarama.TopicDetail) {
	t.Helper()
	partitions := detail.NumPartitions
	client, err := sarama.NewClient(brokers, saramaConfig())
	if err != nil {
		t.Fatalf("kafka client: %v", err)
	}
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		_ = client.Close()
		t.Fatalf("kafka admin: %v", err)
	}
	defer admin.Close() // closes client too
	if err := admin.CreateTopic(name, detail, false); err != nil {
		t.Fatalf("create topic %s: %v", name, err)
	}
	Eventually(t, 30*time.Second, func() (bool, string) {
		err := topicReady(client, name, partitions)
		return err == nil, fmt.Sprintf("topic %s not ready: %v", name, err)
	})
}

// topicReady reports why topic is not yet usable: its metadata must list
// every partition with a leader, and each leader must answer ListOffsets.
func topicReady(client sarama.Client, topic string, partitions int32) error {
	if err := client.RefreshMetadata(topic); err != nil {
		return err
	}
	ps, err := client.Partitions(topic)
	if err != nil {
		return err
	}
	if len(ps) != int(partitions) {
		return fmt.Errorf("metadata lists %d partitions, want %d", len(ps), partitions)
	}
	for _, p := range ps {
		if _, err := client.GetOffset(topic, p, sarama.OffsetNewest); err != nil {
			return fmt.Errorf("partition %d: %w", p, err)
		}
	}
	return nil
}

func saramaConfig() *sarama.Config {
	c := sarama.NewConfig()
	c.Version = sarama.V2_8_0_0
	c.ClientID = "fxoutbox-test"
	c.Consumer.Return.Errors = true
	return c
}

// Produce sends msgs, one at a time and in order (so each key keeps its
// order), each acknowledged by all in-sync replicas, as a producer other
// than the relay would (consumers' tests): keys go to the partitions Apache
// Kafka's Java client chooses (murmur2), as the relay's do by default.
func Produce(t testing.TB, brokers []string, msgs ...*sarama.ProducerMessage) {
	t.Helper()
	sc := saramaConfig()
	sc.Producer.Return.Successes = true
	sc.Producer.RequiredAcks = sarama.WaitForAll
	sc.Producer.Partitioner = sarama.NewMurmur2Partitioner
	p, err := sarama.NewSyncProducer(brokers, sc)
	if err != nil {
		t.Fatalf("kafka producer: %v", err)
	}
	defer p.Close()
	for _, m := range msgs {
		if _, _, err := p.SendMessage(m); err != nil {
			t.Fatalf("produce to %s: %v", m.Topic, err)
		}
	}
}

// Consumer reads every partition of topics from the oldest offset.
type Consumer struct {
	t        testing.TB
	consumer sarama.Consumer
	client   sarama.Client
	mu       sync.Mutex
	msgs     []*sarama.ConsumerMessage
	wg       sync.WaitGroup
	pcs      []sarama.PartitionConsumer
}

// Consume starts consuming topics; it stops when the test ends. It reads
// uncommitted: records of aborted Kafka transactions too.
func Consume(t testing.TB, brokers []string, topics ...string) *Consumer {
	t.Helper()
	return consume(t, brokers, sarama.ReadUncommitted, topics)
}

// ConsumeCommitted is Consume for a read_committed consumer: records of
// aborted transactions are skipped, and those of open ones wait for their
// end.
func ConsumeCommitted(t testing.TB, brokers []string, topics ...string) *Consumer {
	t.Helper()
	return consume(t, brokers, sarama.ReadCommitted, topics)
}

func consume(t testing.TB, brokers []string, isolation sarama.IsolationLevel, topics []string) *Consumer {
	t.Helper()
	sc := saramaConfig()
	sc.Consumer.IsolationLevel = isolation
	client, err := sarama.NewClient(brokers, sc)
	if err != nil {
		t.Fatalf("kafka client: %v", err)
	}
	cons, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		_ = client.Close()
		t.Fatalf("kafka consumer: %v", err)
	}
	c := &Consumer{t: t, consumer: cons, client: client}
	t.Cleanup(c.Close) // also after a Fatalf below
	for _, topic := range topics {
		parts, err := cons.Partitions(topic)
		if err != nil {
			t.Fatalf("partitions of %s: %v", topic, err)
		}
		for _, p := range parts {
			pc, err := consumePartition(client, cons, topic, p)
			if err != nil {
				t.Fatalf("consume %s/%d: %v", topic, p, err)
			}
			c.pcs = append(c.pcs, pc)
			c.wg.Add(2)
			go func() {
				defer c.wg.Done()
				for m := range pc.Messages() {
					c.mu.Lock()
					c.msgs = append(c.msgs, m)
					c.mu.Unlock()
				}
			}()
			go func() {
				defer c.wg.Done()
				for range pc.Errors() {
				}
			}()
		}
	}
	return c
}

// consumePartition consumes topic/p from the oldest offset. A partition
// just created may be in the metadata before its leader serves it (Apache
// Kafka answers NOT_LEADER_OR_FOLLOWER for a moment); that is retried for
// up to 30s with fresh metadata.
func consumePartition(client sarama.Client, cons sarama.Consumer, topic string, p int32) (sarama.PartitionConsumer, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		pc, err := cons.ConsumePartition(topic, p, sarama.OffsetOldest)
		var kerr sarama.KError
		if err == nil || !errors.As(err, &kerr) || !retriableTopicError(kerr) || time.Now().After(deadline) {
			return pc, err
		}
		time.Sleep(100 * time.Millisecond)
		_ = client.RefreshMetadata(topic)
	}
}

func retriableTopicError(err sarama.KError) bool {
	switch err {
	case sarama.ErrNotLeaderForPartition, sarama.ErrLeaderNotAvailable, sarama.ErrUnknownTopicOrPartition, sarama.ErrReplicaNotAvailable, sarama.ErrOffsetsLoadInProgress:
		return true
	}
	return false
}

// Close stops consuming and waits for the consumer's goroutines.
func (c *Consumer) Close() {
	for _, pc := range c.pcs {
		pc.AsyncClose()
	}
	c.pcs = nil
	c.wg.Wait()
	if c.consumer != nil {
		_ = c.consumer.Close()
		_ = c.client.Close()
		c.consumer = nil
	}
}

// Messages returns what was consumed so far, in arrival order per partition.
func (c *Consumer) Messages() []*sarama.ConsumerMessage {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.msgs)
}

// WaitFor waits until at least n messages arrived, failing the test after
// timeout (Eventually), and returns what was consumed.
func (c *Consumer) WaitFor(n int, timeout time.Duration) []*sarama.ConsumerMessage {
	c.t.Helper()
	var msgs []*sarama.ConsumerMessage
	Eventually(c.t, timeout, func() (bool, string) {
		msgs = c.Messages()
		return len(msgs) >= n, fmt.Sprintf("consumed %d messages, want %d", len(msgs), n)
	})
	return msgs
}

// WaitForDistinct waits until messages with at least n distinct event ids
// (outbox.HeaderEventID) arrived, failing the test after timeout.
func (c *Consumer) WaitForDistinct(n int, timeout time.Duration) []*sarama.ConsumerMessage {
	c.t.Helper()
	var msgs []*sarama.ConsumerMessage
	Eventually(c.t, timeout, func() (bool, string) {
		msgs = c.Messages()
		seen := make(map[string]bool, len(msgs))
		for _, m := range msgs {
			seen[Header(m, outbox.HeaderEventID)] = true
		}
		return len(seen) >= n, fmt.Sprintf("consumed %d distinct events (%d messages), want %d", len(seen), len(msgs), n)
	})
	return msgs
}

// RecordCount returns how many records the partitions of topic hold from
// their oldest offset to their high-water mark: once everything was
// published, Consumer.WaitFor(RecordCount(...)) has read all of it,
// duplicates included.
func RecordCount(t testing.TB, brokers []string, topic string) int {
	t.Helper()
	client, err := sarama.NewClient(brokers, saramaConfig())
	if err != nil {
		t.Fatalf("kafka client: %v", err)
	}
	defer client.Close()
	ps, err := client.Partitions(topic)
	if err != nil {
		t.Fatalf("partitions of %s: %v", topic, err)
	}
	var n int64
	for _, p := range ps {
		hw, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			t.Fatalf("high-water mark of %s/%d: %v", topic, p, err)
		}
		lo, err := client.GetOffset(topic, p, sarama.OffsetOldest)
		if err != nil {
			t.Fatalf("oldest offset of %s/%d: %v", topic, p, err)
		}
		n += hw - lo
	}
	return int(n)
}

// Header returns the value of the named header of m, or "".
func Header(m *sarama.ConsumerMessage, name string) string {
	for _, h := range m.Headers {
		if string(h.Key) == name {
			return string(h.Value)
		}
	}
	return ""
}

// Main runs a package's tests (and runnable examples, which cannot skip)
// only when the services they need are configured: without DATABASE_URL it
// reports why and exits 0, unless OUTBOX_TEST_REQUIRE=1. It then checks for
// leaked goroutines with goleak, ignoring go-metrics' global ticker that
// sarama starts on first use and the timer of an opened sarama circuit
// breaker, which ends by itself.
func Main(m *testing.M) {
	if os.Getenv("DATABASE_URL") == "" && os.Getenv("OUTBOX_TEST_REQUIRE") != "1" {
		fmt.Println("skipping: DATABASE_URL is not set (run `make test`, which starts PostgreSQL)")
		os.Exit(0)
	}
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/rcrowley/go-metrics.(*meterArbiter).tick"),
		// A sarama producer whose circuit breaker opened (e.g. on a missing
		// topic) leaves its timer sleeping out the breaker's timeout (10s)
		// after Close; it ends by itself.
		goleak.IgnoreAnyFunction("github.com/eapache/go-resiliency/breaker.(*Breaker).timer"))
}

// ExampleDB connects to DATABASE_URL and migrates a fresh schema for a
// runnable example; cleanup drops the schema and closes the pool.
func ExampleDB() (pool *pgxpool.Pool, table outbox.Table, cleanup func()) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	table = outbox.Table{Schema: Name("ex_")}
	if err := migrations.Outbox.Up(ctx, pool, table); err != nil {
		panic(err)
	}
	return pool, table, func() {
		_, _ = pool.Exec(ctx, "DROP SCHEMA "+table.Schema+" CASCADE")
		pool.Close()
	}
}
