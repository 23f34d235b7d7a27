package billing_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"github.com/fxoutbox/outbox/outboxconfig"
	"github.com/fxoutbox/outbox/unitofwork"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"
	"go.uber.org/goleak"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/examples/billing"
	"github.com/fxoutbox/outbox/examples/devkafka"
	"github.com/fxoutbox/outbox/fxoutbox"
	"github.com/fxoutbox/outbox/inbox"
)

func TestMain(m *testing.M) {
	// go-metrics, used inside sarama, starts one global ticker goroutine on
	// first use and never stops it.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/rcrowley/go-metrics.(*meterArbiter).tick"))
}

// harness is a started billing app on a schema, an input topic and a
// service name (so an output topic) of its own.
type harness struct {
	t        *testing.T
	brokers  []string
	schema   string
	topic    string // order.confirmed.v1 input
	outTopic string // invoice.created.v1 output
	group    string
	invoices *billing.Invoices
	consumer *inbox.Consumer
	reader   *sdkmetric.ManualReader
	producer sarama.SyncProducer
}

func start(t *testing.T) *harness {
	t.Helper()
	dbURL := os.Getenv("DATABASE_URL")
	if dbURL == "" {
		msg := "DATABASE_URL is not set: this test needs a PostgreSQL server (run `make test`, which starts one)"
		if os.Getenv("OUTBOX_TEST_REQUIRE") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	var brokers []string
	if v := os.Getenv("KAFKA_BROKERS"); v != "" {
		brokers = strings.Split(v, ",")
	} else {
		b, err := devkafka.Start(devkafka.DefaultConfig())
		if err != nil {
			t.Fatalf("start the development broker: %v", err)
		}
		t.Cleanup(b.Close)
		brokers = b.Addrs()
	}
	service := name("billing-test-")
	h := &harness{
		t: t, brokers: brokers, schema: strings.ReplaceAll(name("billing_test_"), "-", "_"),
		topic: name("billing-test-orders-"), outTopic: service + ".invoice.created", group: name("billing-test-"),
		reader: sdkmetric.NewManualReader(),
	}
	t.Cleanup(func() {
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, dbURL)
		if err != nil {
			t.Errorf("drop schema: %v", err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{h.schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema: %v", err)
		}
	})
	h.createTopic(h.topic)

	sc := sarama.NewConfig()
	sc.Producer.Return.Successes = true
	sc.Producer.RequiredAcks = sarama.WaitForAll
	p, err := sarama.NewSyncProducer(brokers, sc)
	if err != nil {
		t.Fatalf("producer: %v", err)
	}
	h.producer = p
	t.Cleanup(func() { _ = p.Close() })

	app := fxtest.New(t,
		fx.Supply(billing.Config{
			DatabaseURL:   dbURL,
			Outbox:        fxoutbox.Config{Brokers: brokers, Table: outbox.Table{Schema: h.schema}, TopicCheck: outboxconfig.TopicsCreate, TopicPartitions: 3, Writer: unitofwork.Config{Service: service}},
			Group:         h.group,
			Topic:         h.topic,
			Inbox:         inbox.Config{MaxAttempts: 1, MinBackoff: 10 * time.Millisecond},
			Logger:        slog.New(slog.NewTextHandler(t.Output(), nil)),
			MetricReaders: []sdkmetric.Reader{h.reader},
		}),
		billing.Module,
		fx.Populate(&h.invoices, &h.consumer),
	)
	app.RequireStart()
	t.Cleanup(app.RequireStop)
	return h
}

func (h *harness) createTopic(topic string) {
	h.t.Helper()
	admin, err := sarama.NewClusterAdmin(h.brokers, sarama.NewConfig())
	if err != nil {
		h.t.Fatalf("cluster admin: %v", err)
	}
	defer admin.Close()
	err = admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: 3, ReplicationFactor: 1}, false)
	if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
		h.t.Fatalf("create topic %s: %v", topic, err)
	}
}

// confirmed is an order.confirmed.v1 record as the orders service's relay
// produces it.
type confirmed struct {
	eventID, order string
	trace          trace.TraceID
	value          []byte
}

func newConfirmed(t *testing.T) confirmed {
	c := confirmed{eventID: uuid.NewString(), order: uuid.NewString()}
	_, _ = rand.Read(c.trace[:])
	v, err := json.Marshal(map[string]string{
		"eventId": c.eventID, "eventType": "OrderConfirmed.v1", "aggregateType": "Order",
		"aggregateId": c.order, "customerId": "customer-1", "totalAmount": "49.90",
	})
	if err != nil {
		t.Fatal(err)
	}
	c.value = v
	return c
}

func (h *harness) produce(cs ...confirmed) {
	h.t.Helper()
	for _, c := range cs {
		var sid [8]byte
		_, _ = rand.Read(sid[:])
		_, _, err := h.producer.SendMessage(&sarama.ProducerMessage{
			Topic: h.topic, Key: sarama.StringEncoder(c.order), Value: sarama.ByteEncoder(c.value),
			Headers: []sarama.RecordHeader{
				{Key: []byte(outbox.HeaderEventID), Value: []byte(c.eventID)},
				{Key: []byte("x-event-type"), Value: []byte(billing.EventOrderConfirmed)},
				{Key: []byte("traceparent"), Value: []byte("00-" + c.trace.String() + "-" + hex.EncodeToString(sid[:]) + "-01")},
			},
		})
		if err != nil {
			h.t.Fatalf("produce: %v", err)
		}
	}
}

// processed returns outbox.inbox.processed by outcome.
func (h *harness) processed() map[string]int64 {
	h.t.Helper()
	var rm metricdata.ResourceMetrics
	if err := h.reader.Collect(context.Background(), &rm); err != nil {
		h.t.Fatalf("collect metrics: %v", err)
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != inbox.MetricProcessed {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				o, _ := dp.Attributes.Value(attribute.Key("outbox.inbox.outcome"))
				out[o.AsString()] += dp.Value
			}
		}
	}
	return out
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 60s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// name returns prefix followed by 10 random hex digits.
func name(prefix string) string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// readOutput reads the output topic until n records arrived.
func (h *harness) readOutput(n int) []*sarama.ConsumerMessage {
	h.t.Helper()
	c, err := sarama.NewConsumer(h.brokers, sarama.NewConfig())
	if err != nil {
		h.t.Fatalf("consumer: %v", err)
	}
	defer c.Close()
	parts, err := c.Partitions(h.outTopic)
	if err != nil {
		h.t.Fatalf("partitions of %s: %v", h.outTopic, err)
	}
	out := make(chan *sarama.ConsumerMessage, 100)
	for _, p := range parts {
		pc, err := c.ConsumePartition(h.outTopic, p, sarama.OffsetOldest)
		if err != nil {
			h.t.Fatalf("consume %s/%d: %v", h.outTopic, p, err)
		}
		defer pc.AsyncClose()
		go func() {
			for m := range pc.Messages() {
				out <- m
			}
		}()
	}
	var got []*sarama.ConsumerMessage
	timeout := time.After(60 * time.Second)
	for len(got) < n {
		select {
		case m := <-out:
			got = append(got, m)
		case <-timeout:
			h.t.Fatalf("%d of %d records on %s within 60s", len(got), n, h.outTopic)
		}
	}
	// More than n would be an event applied twice: give them a moment.
	select {
	case m := <-out:
		h.t.Fatalf("an extra record on %s: key %s", h.outTopic, m.Key)
	case <-time.After(500 * time.Millisecond):
	}
	return got
}

func header(m *sarama.ConsumerMessage, key string) string {
	for _, h := range m.Headers {
		if string(h.Key) == key {
			return string(h.Value)
		}
	}
	return ""
}

// TestInvoiceOncePerEvent: each order.confirmed.v1 event gives one invoice
// and one invoice.created.v1 record on the order's trace, however often the
// event is delivered; redeliveries count as duplicates.
func TestInvoiceOncePerEvent(t *testing.T) {
	h := start(t)
	var cs []confirmed
	var orders []string
	for range 5 {
		c := newConfirmed(t)
		cs = append(cs, c)
		orders = append(orders, c.order)
	}
	h.produce(cs...)
	eventually(t, "5 events applied", func() bool { return h.processed()["applied"] >= 5 })
	// The same events again, as a redelivered batch (new offsets, same x-event-id).
	h.produce(cs[1], cs[3], cs[1])
	eventually(t, "3 duplicates skipped", func() bool { return h.processed()["duplicate"] >= 3 })
	if got := h.processed(); got["applied"] != 5 || got["duplicate"] != 3 {
		t.Fatalf("outbox.inbox.processed = %v, want applied 5, duplicate 3", got)
	}

	invs, err := h.invoices.ByOrders(context.Background(), orders)
	if err != nil {
		t.Fatal(err)
	}
	if len(invs) != 5 {
		t.Fatalf("%d invoices for 5 orders: %+v", len(invs), invs)
	}
	byOrder := map[string]confirmed{}
	for _, c := range cs {
		byOrder[c.order] = c
	}
	for _, inv := range invs {
		if c := byOrder[inv.OrderID]; inv.EventID != c.eventID || inv.Amount != "49.90" {
			t.Errorf("invoice %+v, want event %s, amount 49.90", inv, c.eventID)
		}
	}

	recs := h.readOutput(5)
	for _, m := range recs {
		c, ok := byOrder[string(m.Key)]
		if !ok {
			t.Fatalf("invoice.created.v1 keyed %q: no such order", m.Key)
		}
		if got := header(m, "x-event-type"); got != billing.EventInvoiceCreated {
			t.Errorf("x-event-type %q, want %s", got, billing.EventInvoiceCreated)
		}
		tp := header(m, "traceparent")
		if !strings.HasPrefix(tp, "00-"+c.trace.String()+"-") {
			t.Errorf("invoice.created.v1 of order %s: traceparent %q, want the order's trace %s", c.order, tp, c.trace)
		}
		var ev billing.InvoiceCreated
		if err := json.Unmarshal(m.Value, &ev); err != nil || ev.OrderID != c.order || ev.InvoiceID == "" {
			t.Errorf("payload %s (%v), want the invoice of order %s", m.Value, err, c.order)
		}
	}
}

// TestUndecodableEventParked: an order.confirmed.v1 payload that is not
// JSON is parked at once, writes no invoice and does not hold back the
// events after it.
func TestUndecodableEventParked(t *testing.T) {
	h := start(t)
	bad := newConfirmed(t)
	bad.value = []byte("not json")
	good := newConfirmed(t)
	good.order = bad.order // same key: behind the bad one in its partition
	good.value = newConfirmedValue(t, good)
	h.produce(bad, good)
	eventually(t, "the good event applied", func() bool { return h.processed()["applied"] >= 1 })
	parked, err := h.consumer.List(context.Background(), inbox.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(parked) != 1 || parked[0].EventID != bad.eventID || parked[0].ErrorType != inbox.ErrorTypePermanent {
		t.Fatalf("parked = %+v, want the undecodable event %s, permanent", parked, bad.eventID)
	}
	invs, err := h.invoices.ByOrders(context.Background(), []string{bad.order})
	if err != nil {
		t.Fatal(err)
	}
	if len(invs) != 1 || invs[0].EventID != good.eventID {
		t.Fatalf("invoices %+v, want one, of event %s", invs, good.eventID)
	}
}

// newConfirmedValue is c's payload with c's ids.
func newConfirmedValue(t *testing.T, c confirmed) []byte {
	v, err := json.Marshal(map[string]string{
		"eventId": c.eventID, "eventType": "OrderConfirmed.v1", "aggregateType": "Order",
		"aggregateId": c.order, "customerId": "customer-2", "totalAmount": "10.00",
	})
	if err != nil {
		t.Fatal(err)
	}
	return v
}
