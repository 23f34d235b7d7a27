package fxoutbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/fxoutbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

const orderKeys = 200

// orderKey is the i-th of the keys the Java client tests use.
func orderKey(i int) string { return fmt.Sprintf("order-%d", i) }

// publishOrders writes one event per key order-0 .. order-199 to topic
// through a UnitOfWork and the relay of an fx application built from cfg
// (Service, Table and Brokers filled in), waits until the relay published
// them all, stops the application, and returns each key's event id.
func publishOrders(t *testing.T, pool *pgxpool.Pool, brokers []string, cfg fxoutbox.Config, topic string) map[string]string {
	t.Helper()
	cfg.Writer.Service, cfg.Table, cfg.Brokers = "orders", testenv.Table(t, pool), brokers
	var uow *unitofwork.UnitOfWork
	l, log := newLogs()
	app := fxtest.New(t, fx.NopLogger, fx.Supply(pool, log, cfg), fxoutbox.Module, fx.Populate(&uow))
	app.RequireStart()
	defer app.RequireStop()
	ctx := context.Background()
	err := uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		for i := range orderKeys {
			if err := tx.Add(ctx, outbox.Event{AggregateType: "order", AggregateID: orderKey(i), Type: "order.placed.v1", Topic: topic,
				Payload: map[string]any{"order": orderKey(i), "n": i}}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			t.Logf("logs:\n%s", l.String())
		}
	}()
	testenv.Eventually(t, time.Minute, func() (bool, string) {
		n := unpublished(t, pool, cfg.Table)
		return n == 0, fmt.Sprintf("%d of %d events unpublished", n, orderKeys)
	})
	ids := map[string]string{}
	rows, err := pool.Query(ctx, "SELECT partition_key, event_id::text FROM "+sqlname.Ident(cfg.Table))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var k, id string
		if err := rows.Scan(&k, &id); err != nil {
			t.Fatal(err)
		}
		ids[k] = id
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return ids
}

// partitionsOf reads topic's records (want of them) and returns each key's
// partition, failing on a key found on two partitions.
func partitionsOf(t *testing.T, brokers []string, topic string, want int) map[string]int32 {
	t.Helper()
	cons := testenv.Consume(t, brokers, topic)
	defer cons.Close()
	parts := map[string]int32{}
	for _, m := range cons.WaitFor(want, 60*time.Second) {
		k := string(m.Key)
		if p, ok := parts[k]; ok && p != m.Partition {
			t.Errorf("topic %s: key %q on partitions %d and %d", topic, k, p, m.Partition)
		}
		parts[k] = m.Partition
	}
	return parts
}

// With its defaults the relay puts every key on the partition Apache
// Kafka's Java producer chooses for it (murmur2): 200 keys through a
// UnitOfWork and the fx relay into a topic of 12 partitions land where the
// Java producer put them (pinned in testenv.JavaOrderPartitions12). Runs on
// every broker; TestJavaClientAgreesWithTheRelay checks the same against
// the Java client itself.
func TestDefaultPartitioningIsJavas(t *testing.T) {
	pool := testenv.Pool(t)
	brokers := testenv.Brokers(t)
	topic := testenv.Topic(t, brokers, 12)
	publishOrders(t, pool, brokers, fxoutbox.Config{}, topic)
	parts := partitionsOf(t, brokers, topic, orderKeys)
	for i, want := range testenv.JavaOrderPartitions12 {
		if got, ok := parts[orderKey(i)]; !ok || got != want {
			t.Errorf("key %q on partition %d (found %v), the Java producer's is %d", orderKey(i), got, ok, want)
		}
	}
}

// The start-up line names the partitioner.
func TestStartUpLineNamesThePartitioner(t *testing.T) {
	pool := testenv.Pool(t)
	brokers := testenv.Brokers(t)
	tbl := testenv.Table(t, pool)
	for want, p := range map[string]relay.Partitioner{"murmur2": 0, "fnv1a": relay.FNV1a, "crc32": relay.CRC32} {
		l, log := newLogs()
		app := fxtest.New(t, fx.NopLogger, fx.Supply(pool, log, fxoutbox.Config{Table: tbl, Brokers: brokers, Partitioner: p, Writer: unitofwork.Config{Service: "svc"}}), fxoutbox.Module)
		app.RequireStart()
		app.RequireStop()
		var line string
		for _, s := range strings.Split(l.String(), "\n") {
			if strings.Contains(s, "outbox relay starting") {
				line = s
			}
		}
		if !strings.Contains(line, "partitioner="+want) {
			t.Errorf("Partitioner %v: the start-up line does not say partitioner=%s:\n%s", p, want, l.String())
		}
	}
}

// Proof against Apache Kafka's own Java client (make test-kafka): the same
// 200 keys produced by the relay with its defaults and by the Java console
// producer (default partitioner) land on the same partitions of two topics
// of 12 partitions; with the fnv1a setting most of them do not; and the
// Java console consumer reads all 200 of the relay's records with their
// key, x-event-id and x-event-type headers and a JSON value.
func TestJavaClientAgreesWithTheRelay(t *testing.T) {
	testenv.RealKafka(t)
	pool := testenv.Pool(t)
	brokers := testenv.Brokers(t)
	relayTopic := testenv.Topic(t, brokers, 12)
	javaTopic := testenv.Topic(t, brokers, 12)
	fnvTopic := testenv.Topic(t, brokers, 12)

	ids := publishOrders(t, pool, brokers, fxoutbox.Config{}, relayTopic)

	// The Java producer, one JVM: "key|value" lines.
	var in strings.Builder
	for i := range orderKeys {
		fmt.Fprintf(&in, "%s|{\"order\":%q,\"n\":%d}\n", orderKey(i), orderKey(i), i)
	}
	testenv.KafkaTool(t, 3*time.Minute, in.String(), "org.apache.kafka.tools.ConsoleProducer",
		"--bootstrap-server", strings.Join(brokers, ","), "--topic", javaTopic,
		"--reader-property", "parse.key=true", "--reader-property", "key.separator=|")
	java := partitionsOf(t, brokers, javaTopic, orderKeys)

	// The Java consumer, one JVM, reads the relay's records.
	out := testenv.KafkaTool(t, 3*time.Minute, "", "org.apache.kafka.tools.consumer.ConsoleConsumer",
		append([]string{"--bootstrap-server", strings.Join(brokers, ","), "--topic", relayTopic,
			"--from-beginning", "--max-messages", fmt.Sprint(orderKeys), "--timeout-ms", "60000"}, testenv.ConsoleConsumerFormat...)...)
	recs, err := testenv.ParseConsoleRecords(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != orderKeys {
		t.Fatalf("the Java console consumer read %d records, want %d:\n%s", len(recs), orderKeys, out)
	}
	seen := map[string]bool{}
	same := 0
	for _, r := range recs {
		id, want := ids[r.Key]
		switch {
		case !want:
			t.Errorf("record with key %q, which the relay was not given", r.Key)
			continue
		case seen[r.Key]:
			t.Errorf("key %q read twice", r.Key)
		}
		seen[r.Key] = true
		if got := r.Headers[outbox.HeaderEventID]; got != id || uuid.Validate(got) != nil {
			t.Errorf("key %q: %s header %q, want the event id %s", r.Key, outbox.HeaderEventID, got, id)
		}
		if got := r.Headers[outbox.HeaderEventType]; got != "order.placed.v1" {
			t.Errorf("key %q: %s header %q, want order.placed.v1", r.Key, outbox.HeaderEventType, got)
		}
		var v struct {
			Order string `json:"order"`
			N     *int   `json:"n"`
		}
		if err := json.Unmarshal([]byte(r.Value), &v); err != nil || v.Order != r.Key || v.N == nil || orderKey(*v.N) != r.Key {
			t.Errorf("key %q: value %q is not the event's JSON payload (%v)", r.Key, r.Value, err)
		}
		if p, ok := java[r.Key]; !ok || p != r.Partition {
			t.Errorf("key %q: the relay put it on partition %d, the Java producer on %d (found %v)", r.Key, r.Partition, p, ok)
		} else {
			same++
		}
	}
	t.Logf("%d of %d keys on the Java producer's partition", same, orderKeys)

	// With the FNV-1a setting, the placement differs for most keys: the
	// comparison above can tell.
	publishOrders(t, pool, brokers, fxoutbox.Config{Partitioner: relay.FNV1a}, fnvTopic)
	fnv := partitionsOf(t, brokers, fnvTopic, orderKeys)
	sameFNV := 0
	for k, p := range fnv {
		if java[k] == p {
			sameFNV++
		}
	}
	t.Logf("fnv1a: %d of %d keys on the Java producer's partition", sameFNV, len(fnv))
	if len(fnv) != orderKeys || sameFNV > orderKeys/4 {
		t.Errorf("fnv1a: %d of %d keys on the Java producer's partition; want most to differ (chance: 1 in 12)", sameFNV, len(fnv))
	}
}
