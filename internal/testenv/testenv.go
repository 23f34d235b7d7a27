// Package testenv gives tests a real PostgreSQL schema and a real
// Kafka-protocol broker over TCP, taken from DATABASE_URL and KAFKA_BROKERS
// (make test starts both). Without them a test is skipped, unless
// OUTBOX_TEST_REQUIRE=1 (set by make test and CI), where it fails.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"

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

// Table creates a fresh schema with the migrations applied and drops it when
// the test ends. Tests that use their own Table never see each other's rows.
func Table(t testing.TB, pool *pgxpool.Pool) outbox.Table {
	t.Helper()
	tbl := outbox.Table{Schema: Name("t_")}
	ctx := context.Background()
	if err := migrations.Up(ctx, pool, tbl); err != nil {
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

// CreateTopic creates the named topic, waiting until its metadata is visible.
func CreateTopic(t testing.TB, brokers []string, name string, partitions int32) {
	t.Helper()
	admin, err := sarama.NewClusterAdmin(brokers, saramaConfig())
	if err != nil {
		t.Fatalf("kafka admin: %v", err)
	}
	defer admin.Close()
	if err := admin.CreateTopic(name, &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: 1}, false); err != nil {
		t.Fatalf("create topic %s: %v", name, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		md, err := admin.DescribeTopics([]string{name})
		if err == nil && len(md) == 1 && md[0].Err == sarama.ErrNoError && len(md[0].Partitions) == int(partitions) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("topic %s not ready: %v", name, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func saramaConfig() *sarama.Config {
	c := sarama.NewConfig()
	c.Version = sarama.V2_8_0_0
	c.ClientID = "fxoutbox-test"
	c.Consumer.Return.Errors = true
	return c
}

// Consumer reads every partition of topics from the oldest offset.
type Consumer struct {
	t        testing.TB
	consumer sarama.Consumer
	mu       sync.Mutex
	msgs     []*sarama.ConsumerMessage
	wg       sync.WaitGroup
	pcs      []sarama.PartitionConsumer
}

// Consume starts consuming topics; it stops when the test ends.
func Consume(t testing.TB, brokers []string, topics ...string) *Consumer {
	t.Helper()
	cons, err := sarama.NewConsumer(brokers, saramaConfig())
	if err != nil {
		t.Fatalf("kafka consumer: %v", err)
	}
	c := &Consumer{t: t, consumer: cons}
	for _, topic := range topics {
		parts, err := cons.Partitions(topic)
		if err != nil {
			t.Fatalf("partitions of %s: %v", topic, err)
		}
		for _, p := range parts {
			pc, err := cons.ConsumePartition(topic, p, sarama.OffsetOldest)
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
	t.Cleanup(c.Close)
	return c
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
		c.consumer = nil
	}
}

// Messages returns what was consumed so far, in arrival order per partition.
func (c *Consumer) Messages() []*sarama.ConsumerMessage {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.msgs)
}

// WaitFor waits until at least n messages arrived, failing the test after timeout.
func (c *Consumer) WaitFor(n int, timeout time.Duration) []*sarama.ConsumerMessage {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		msgs := c.Messages()
		if len(msgs) >= n {
			return msgs
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("consumed %d messages, want %d within %v", len(msgs), n, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
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
