package cloudevents_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/cloudevents/sdk-go/protocol/kafka_sarama/v2"
	ce "github.com/cloudevents/sdk-go/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/examples/devkafka"
	"github.com/fxoutbox/outbox/inbox"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/migrations"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// brokers returns KAFKA_BROKERS, or an embedded development broker closed
// when the test ends (as the other examples do).
func brokers(t *testing.T) []string {
	t.Helper()
	if v := os.Getenv("KAFKA_BROKERS"); v != "" {
		return strings.Split(v, ",")
	}
	b, err := devkafka.Start(devkafka.DefaultConfig())
	if err != nil {
		t.Fatalf("start the development broker: %v", err)
	}
	t.Cleanup(b.Close)
	return b.Addrs()
}

// written is an event as the test wrote it.
type written struct {
	id        uuid.UUID
	key, typ  string
	payload   any
	createdAt time.Time
}

// The relay in CloudEvents binary mode publishes events that the
// CloudEvents Go SDK's Kafka binding decodes, from sarama ConsumerMessages,
// into valid CloudEvents (Validate passes) with the id, source, type, time
// (the row's created_at), data content type and data that were written, the
// subject an event set as its own ce_subject header, and the partition key
// as the Kafka key.
func TestSDKDecodesTheRelaysRecords(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Pool(t)
	tbl := testenv.Table(t, pool)
	brokers := brokers(t)
	topic := testenv.Topic(t, brokers, 3)
	cons := testenv.Consume(t, brokers, topic)
	cloudEvents := outbox.CloudEvents{Mode: outbox.CloudEventsBinary, Source: "/order-service"}

	uow, err := unitofwork.New(pool, &unitofwork.Config{Table: tbl, Limits: outbox.Limits{CloudEvents: cloudEvents}})
	if err != nil {
		t.Fatal(err)
	}
	payloads := []any{
		map[string]any{"orderId": "o-1", "total": 42.5, "lines": []any{map[string]any{"sku": "A", "qty": 2.0}}},
		map[string]any{"orderId": "o-2", "note": "naïve café ✓", "tags": []any{}},
		"just a string",
		nil,
		map[string]any{"orderId": "o-1", "status": "shipped"},
	}
	byID := map[string]*written{}
	for i, p := range payloads {
		w := &written{id: uuid.Must(uuid.NewV7()), key: fmt.Sprintf("o-%d", i%2+1), typ: fmt.Sprintf("order.changed.v%d", i+1), payload: p}
		err := uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
			return tx.Add(ctx, outbox.Event{ID: w.id, AggregateType: "order", AggregateID: w.key, Type: w.typ, Topic: topic,
				Payload: p, Headers: map[string]string{"ce_subject": "order/" + w.key}})
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := pool.QueryRow(ctx, "SELECT created_at FROM "+ident(tbl)+" WHERE event_id = $1", w.id).Scan(&w.createdAt); err != nil {
			t.Fatal(err)
		}
		byID[w.id.String()] = w
	}

	pub, err := relay.NewSaramaPublisher(brokers, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	r, err := relay.New(pool, pub, &relay.Config{Table: tbl, CloudEvents: cloudEvents})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := r.RunOnce(ctx); err != nil || n != len(payloads) {
		t.Fatalf("RunOnce = %d, %v; want %d published", n, err, len(payloads))
	}

	msgs := cons.WaitFor(len(payloads), 60*time.Second)
	seen := map[string]bool{}
	for _, cm := range msgs {
		m := kafka_sarama.NewMessageFromConsumerMessage(cm)
		if enc := m.ReadEncoding(); enc != binding.EncodingBinary {
			t.Fatalf("record at offset %d: the SDK reads encoding %v, want binary", cm.Offset, enc)
		}
		ev, err := binding.ToEvent(ctx, m)
		if err != nil {
			t.Fatalf("record at offset %d: the SDK cannot decode it: %v", cm.Offset, err)
		}
		if err := ev.Validate(); err != nil {
			t.Errorf("event %s: not a valid CloudEvent: %v", ev.ID(), err)
		}
		w := byID[ev.ID()]
		if w == nil {
			t.Fatalf("decoded id %q, which was not written", ev.ID())
		}
		seen[ev.ID()] = true
		for _, f := range []struct{ name, got, want string }{
			{"specversion", ev.SpecVersion(), "1.0"},
			{"source", ev.Source(), "/order-service"},
			{"type", ev.Type(), w.typ},
			{"datacontenttype", ev.DataContentType(), "application/json"},
			{"subject", ev.Subject(), "order/" + w.key},
			{"Kafka key", string(cm.Key), w.key},
			{"x-event-id", testenv.Header(cm, outbox.HeaderEventID), w.id.String()},
		} {
			if f.got != f.want {
				t.Errorf("event %s: %s = %q, want %q", w.id, f.name, f.got, f.want)
			}
		}
		if !ev.Time().Equal(w.createdAt) {
			t.Errorf("event %s: time %s, want created_at %s", w.id, ev.Time().Format(time.RFC3339Nano), w.createdAt.Format(time.RFC3339Nano))
		}
		var data any
		if err := ev.DataAs(&data); err != nil || !reflect.DeepEqual(data, w.payload) {
			t.Errorf("event %s: data %s (%v), want %#v", w.id, ev.Data(), err, w.payload)
		}
	}
	if len(seen) != len(payloads) {
		t.Errorf("decoded %d distinct events, want %d", len(seen), len(payloads))
	}
}

// A record the SDK itself writes (its Kafka binding, binary mode, an id
// that is not a UUID, no x-event-id), delivered twice, is applied once by
// the inbox, identified by inbox.CloudEventID of its source and id and
// routed by its type; the same id from another source is another event.
func TestInboxAppliesTheSDKsRecordsOnce(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Pool(t)
	tbl := testenv.Table(t, pool)
	brokers := brokers(t)
	topic := testenv.Topic(t, brokers, 1)
	inboxTable := outbox.Table{Schema: tbl.Schema} // outbox_inbox, next to the outbox table
	if err := migrations.Inbox.Up(ctx, pool, inboxTable); err != nil {
		t.Fatal(err)
	}
	effects := `"` + tbl.Schema + `".effects`
	if _, err := pool.Exec(ctx, `CREATE TABLE `+effects+` (event_id text NOT NULL, ce_id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	uow, err := unitofwork.New(pool, &unitofwork.Config{Table: tbl})
	if err != nil {
		t.Fatal(err)
	}

	record := func(source, id string) *sarama.ProducerMessage {
		ev := ce.NewEvent()
		ev.SetID(id)
		ev.SetSource(source)
		ev.SetType("com.example.invoice.paid")
		ev.SetTime(time.Date(2026, 12, 3, 18, 0, 0, 0, time.UTC))
		if err := ev.SetData(ce.ApplicationJSON, map[string]string{"invoice": id}); err != nil {
			t.Fatal(err)
		}
		ev.SetExtension("partitionkey", "inv-1") // the SDK's key mapping makes it the record key
		pm := &sarama.ProducerMessage{Topic: topic}
		if err := kafka_sarama.WriteProducerMessage(ctx, binding.ToMessage(&ev), pm); err != nil {
			t.Fatal(err)
		}
		for _, h := range pm.Headers {
			if string(h.Key) == outbox.HeaderEventID {
				t.Fatal("the SDK wrote an x-event-id header")
			}
		}
		return pm
	}
	testenv.Produce(t, brokers,
		record("//billing.example/invoices", "7"),
		record("//billing.example/invoices", "7"), // delivered twice
		record("//other.example", "7"),
	)

	handler := func(ctx context.Context, tx unitofwork.Tx, m *inbox.Message) error {
		if m.Type != "com.example.invoice.paid" || string(m.Key) != "inv-1" {
			return outbox.Permanent(fmt.Errorf("type %q, key %q", m.Type, m.Key))
		}
		var v map[string]string
		if err := json.Unmarshal(m.Value, &v); err != nil || v["invoice"] != "7" {
			return outbox.Permanent(fmt.Errorf("value %s: %v", m.Value, err))
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+effects+` (event_id, ce_id) VALUES ($1, $2)`, m.ID, m.Headers["ce_id"])
		return err
	}
	sc := inbox.DefaultSaramaConfig()
	sc.Consumer.Offsets.AutoCommit.Interval = 100 * time.Millisecond
	group := testenv.Name("g_")
	c, err := inbox.New(pool, uow, &inbox.Config{Group: group, Brokers: brokers, Sarama: sc, Table: inboxTable,
		Routes: []inbox.Route{{Topic: topic, Type: "com.example.invoice.paid", Handler: handler}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Stop(ctx) }()

	waitCommitted(t, brokers, group, topic, 3)
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if parked, err := c.List(ctx, inbox.ListOptions{}); err != nil || len(parked) > 0 {
		t.Fatalf("parked %+v, %v", parked, err)
	}
	applied := map[string]int{}
	rows, err := pool.Query(ctx, `SELECT event_id, ce_id FROM `+effects)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, ceID string
		if err := rows.Scan(&id, &ceID); err != nil {
			t.Fatal(err)
		}
		applied[id+" ce_id="+ceID]++
	}
	want := map[string]int{
		inbox.CloudEventID("//billing.example/invoices", "7") + " ce_id=7": 1,
		inbox.CloudEventID("//other.example", "7") + " ce_id=7":            1,
	}
	if !reflect.DeepEqual(applied, want) {
		t.Errorf("applied %v, want %v: each CloudEvent once", applied, want)
	}
}

// waitCommitted waits until group committed offset n of topic's partition 0:
// every record before it is applied, skipped or parked.
func waitCommitted(t *testing.T, brokers []string, group, topic string, n int64) {
	t.Helper()
	sc := sarama.NewConfig()
	sc.Version = sarama.V2_1_0_0
	admin, err := sarama.NewClusterAdmin(brokers, sc)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := admin.ListConsumerGroupOffsets(group, map[string][]int32{topic: {0}})
		if err == nil {
			if b := resp.GetBlock(topic, 0); b != nil && b.Offset == n {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 60s group %s has not committed offset %d of %s (%v)", group, n, topic, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ident quotes t's schema-qualified name for SQL text.
func ident(t outbox.Table) string {
	t = t.WithDefaults()
	if t.Schema == "" {
		return pgx.Identifier{t.Name}.Sanitize()
	}
	return pgx.Identifier{t.Schema, t.Name}.Sanitize()
}
