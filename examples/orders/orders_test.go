package orders_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/examples/orders"
	"github.com/fxoutbox/outbox/fxoutbox"
	"github.com/fxoutbox/outbox/unitofwork"
)

// harness is a started orders app on a schema of its own.
type harness struct {
	t      *testing.T
	base   string
	client *http.Client
	pool   *pgxpool.Pool
	uow    *unitofwork.UnitOfWork
	schema string
	spans  *tracetest.SpanRecorder

	mu         sync.Mutex
	mine       map[string]bool // order ids this test created
	deliveries chan orders.Delivery
}

func start(t *testing.T) *harness {
	t.Helper()
	dbURL, brokers := testEnv(t)
	h := &harness{
		t: t, schema: name("orders_test_"), spans: tracetest.NewSpanRecorder(),
		mine: map[string]bool{}, deliveries: make(chan orders.Delivery, 100),
	}
	// Cleanups run last-in first-out: the schema is dropped after the app stopped.
	t.Cleanup(func() {
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, dbURL)
		if err != nil {
			t.Errorf("drop schema: %v", err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+h.schema+" CASCADE"); err != nil {
			t.Errorf("drop schema: %v", err)
		}
	})
	cfg := orders.Config{
		DatabaseURL: dbURL,
		HTTPAddr:    "127.0.0.1:0",
		Outbox: fxoutbox.Config{
			Brokers: brokers,
			Table:   outbox.Table{Schema: h.schema},
		},
		Logger:         slog.New(slog.NewTextHandler(t.Output(), nil)),
		SpanProcessors: []sdktrace.SpanProcessor{h.spans},
		Consumer: orders.ConsumerConfig{
			Group: name("orders-test-"),
			// Other tests' and demo runs' events share the topics (a new group
			// starts at the oldest record): keep this test's own.
			Handle: func(_ context.Context, d orders.Delivery) {
				h.mu.Lock()
				mine := h.mine[d.Key]
				h.mu.Unlock()
				if mine {
					h.deliveries <- d
				}
			},
		},
	}
	var srv *orders.Server
	app := fxtest.New(t,
		fx.Supply(cfg),
		orders.Module,
		fx.Populate(&srv, &h.pool, &h.uow),
	)
	app.RequireStart()
	t.Cleanup(app.RequireStop)
	h.base = srv.URL()
	h.client = &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}
	t.Cleanup(h.client.CloseIdleConnections)
	return h
}

// newOrderID returns a new order id whose events the test receives.
func (h *harness) newOrderID() string {
	id := uuid.Must(uuid.NewV7()).String()
	h.mu.Lock()
	h.mine[id] = true
	h.mu.Unlock()
	return id
}

type response struct {
	status  int
	header  http.Header
	body    []byte
	order   orders.Order
	errText string
}

func (h *harness) do(method, path, body, traceparent string) response {
	h.t.Helper()
	req, err := http.NewRequest(method, h.base+path, strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	if traceparent != "" {
		req.Header.Set("traceparent", traceparent)
	}
	resp, err := h.client.Do(req)
	if err != nil {
		h.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	r := response{status: resp.StatusCode, header: resp.Header}
	r.body, _ = io.ReadAll(resp.Body)
	_ = json.Unmarshal(r.body, &r.order)
	var e struct{ Error string }
	_ = json.Unmarshal(r.body, &e)
	r.errText = e.Error
	return r
}

// receive returns the next n deliveries of this test's orders.
func (h *harness) receive(n int) []orders.Delivery {
	h.t.Helper()
	var out []orders.Delivery
	timeout := time.After(30 * time.Second)
	for len(out) < n {
		select {
		case d := <-h.deliveries:
			out = append(out, d)
		case <-timeout:
			h.t.Fatalf("received %d of %d events within 30s", len(out), n)
		}
	}
	return out
}

// outboxRows counts the outbox rows of an aggregate.
func (h *harness) outboxRows(aggregateID string) int {
	h.t.Helper()
	var n int
	err := h.pool.QueryRow(context.Background(),
		"SELECT count(*) FROM "+h.schema+".outbox_event WHERE aggregate_id = $1", aggregateID).Scan(&n)
	if err != nil {
		h.t.Fatal(err)
	}
	return n
}

func TestOrderEventsCarryTheRequestTrace(t *testing.T) {
	h := start(t)
	id := h.newOrderID()

	tp1, trace1, _ := newTraceparent()
	r := h.do("POST", "/orders", `{"id":"`+id+`","customerId":"c-42","totalAmount":"49.90"}`, tp1)
	if r.status != http.StatusCreated {
		t.Fatalf("POST /orders: %d %s", r.status, r.body)
	}
	if got := r.header.Get(orders.HeaderTraceResponse); !strings.Contains(got, trace1.String()) {
		t.Errorf("traceresponse %q does not continue the request's trace %s", got, trace1)
	}
	if r.order.ID != id || r.order.Status != orders.StatusPending || r.order.TotalAmount != "49.90" {
		t.Errorf("created order = %+v", r.order)
	}
	tp2, trace2, remote2 := newTraceparent()
	r = h.do("POST", "/orders/"+id+"/confirm", "", tp2)
	if r.status != http.StatusOK || r.order.Status != orders.StatusConfirmed || r.order.ConfirmedAt == nil {
		t.Fatalf("POST /orders/{id}/confirm: %d %s", r.status, r.body)
	}
	confirmedAt := *r.order.ConfirmedAt

	got := map[string]orders.Delivery{}
	for _, d := range h.receive(2) {
		got[d.EventType] = d
	}
	for _, c := range []struct {
		typ, payloadType, topic string
		trace                   trace.TraceID
	}{
		{orders.EventOrderCreated, "OrderCreated.v1", "order-service.order.created", trace1},
		{orders.EventOrderConfirmed, "OrderConfirmed.v1", "order-service.order.confirmed", trace2},
	} {
		d, ok := got[c.typ]
		if !ok {
			t.Fatalf("no %s event; got %v", c.typ, slices.Collect(maps.Keys(got)))
		}
		if d.Topic != c.topic || d.Key != id || d.Headers[outbox.HeaderEventType] != c.typ {
			t.Errorf("%s: topic %q key %q x-event-type %q, want %q %q %q", c.typ, d.Topic, d.Key, d.Headers[outbox.HeaderEventType], c.topic, id, c.typ)
		}
		if d.TraceID != c.trace {
			t.Errorf("%s: consumer trace id %s, want the request's %s", c.typ, d.TraceID, c.trace)
		}
		if d.Duplicate {
			t.Errorf("%s: delivered as a duplicate", c.typ)
		}
		e := d.Event
		if e.EventID != d.EventID || e.EventType != c.payloadType || e.AggregateType != "Order" || e.AggregateID != id ||
			e.CustomerID != "c-42" || e.TotalAmount != "49.90" || e.OccurredAt.IsZero() {
			t.Errorf("%s: payload %s (x-event-id %s)", c.typ, d.Payload, d.EventID)
		}
		var fields map[string]any
		if err := json.Unmarshal(d.Payload, &fields); err != nil {
			t.Fatal(err)
		}
		want := []string{"aggregateId", "aggregateType", "customerId", "eventId", "eventType", "occurredAt", "totalAmount"}
		if keys := slices.Sorted(maps.Keys(fields)); !slices.Equal(keys, want) {
			t.Errorf("%s: payload fields %v, want %v", c.typ, keys, want)
		}
	}
	if at := got[orders.EventOrderConfirmed].Event.OccurredAt; !at.Equal(confirmedAt) {
		t.Errorf("order.confirmed.v1 occurredAt %v, want the order's confirmedAt %v", at, confirmedAt)
	}

	// The confirmed event's spans form one chain: the request's remote
	// parent -> the server span -> the relay's publish span -> the consumer span.
	eventID := got[orders.EventOrderConfirmed].EventID
	chain := h.waitSpans(eventID, remote2)
	if chain != "" {
		t.Error(chain)
	}

	// A missing order is 404 and records nothing.
	missing := uuid.Must(uuid.NewV7()).String()
	if r := h.do("POST", "/orders/"+missing+"/confirm", "", ""); r.status != http.StatusNotFound {
		t.Errorf("confirm a missing order: %d %s, want 404", r.status, r.body)
	}
	if r := h.do("POST", "/orders/not-a-uuid/confirm", "", ""); r.status != http.StatusNotFound {
		t.Errorf("confirm a malformed id: %d %s, want 404", r.status, r.body)
	}
	if n := h.outboxRows(missing); n != 0 {
		t.Errorf("confirming a missing order recorded %d events", n)
	}

	// Confirming twice is 409: the transaction rolls back, no event, the
	// order unchanged.
	if r := h.do("POST", "/orders/"+id+"/confirm", "", ""); r.status != http.StatusConflict || !strings.Contains(r.errText, "CONFIRMED") {
		t.Errorf("confirm twice: %d %s, want 409", r.status, r.body)
	}
	if n := h.outboxRows(id); n != 2 {
		t.Errorf("order %s has %d outbox rows after a rejected confirm, want 2", id, n)
	}
	if r := h.do("GET", "/orders/"+id, "", ""); r.order.ConfirmedAt == nil || !r.order.ConfirmedAt.Equal(confirmedAt) {
		t.Errorf("order after a rejected confirm: %s", r.body)
	}

	// Health and metrics.
	if r := h.do("GET", "/healthz", "", ""); r.status != http.StatusOK {
		t.Errorf("GET /healthz: %d %s", r.status, r.body)
	}
	r = h.do("GET", "/metrics", "", "")
	// The names docs/operating.md, docs/alerts.yaml and docs/dashboard.json
	// use, as the real Prometheus exporter writes them.
	for _, m := range []string{"outbox_events_published_total{", "outbox_backlog{", "outbox_oldest_age_seconds{", "outbox_publish_latency_seconds_bucket{",
		"outbox_last_publish_age_seconds{", "outbox_step_duration_seconds_bucket{", "outbox_batch_size_bucket{",
		`messaging_client_sent_messages_total{messaging_destination_name="`, `messaging_client_operation_duration_seconds_bucket{`,
		`messaging_system="kafka"`, `messaging_operation_name="publish"`, `outbox_step="commit"`,
		`db_client_connection_count{db_client_connection_pool_name="`, "db_client_connection_max{", "outbox_db_acquire_wait_seconds_total{"} {
		if !strings.Contains(string(r.body), m) {
			t.Errorf("GET /metrics has no %s...", m)
		}
	}
}

// waitSpans checks the span chain of an event, waiting for the consumer
// span to end; it returns what is wrong, or "".
func (h *harness) waitSpans(eventID string, remote trace.SpanID) string {
	deadline := time.Now().Add(10 * time.Second)
	for {
		problem := h.spanChain(eventID, remote)
		if problem == "" || time.Now().After(deadline) {
			return problem
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (h *harness) spanChain(eventID string, remote trace.SpanID) string {
	var server, publish, consumer sdktrace.ReadOnlySpan
	for _, s := range h.spans.Ended() {
		msgID := ""
		for _, a := range s.Attributes() {
			if a.Key == attribute.Key("messaging.message.id") {
				msgID = a.Value.AsString()
			}
		}
		switch {
		case s.SpanKind() == trace.SpanKindServer && s.Parent().SpanID() == remote:
			server = s
		case s.SpanKind() == trace.SpanKindProducer && msgID == eventID:
			publish = s
		case s.SpanKind() == trace.SpanKindConsumer && msgID == eventID:
			consumer = s
		}
	}
	switch {
	case server == nil || publish == nil || consumer == nil:
		return "missing spans: server, publish or consumer span not ended"
	case server.Name() != "POST /orders/{id}/confirm":
		return "server span named " + server.Name()
	case publish.Parent().SpanID() != server.SpanContext().SpanID():
		return "the publish span's parent is not the request's server span"
	case consumer.Parent().SpanID() != publish.SpanContext().SpanID() || !consumer.Parent().IsRemote():
		return "the consumer span's parent is not the publish span (from the Kafka headers)"
	case consumer.Name() != "process order-service.order.confirmed":
		return "consumer span named " + consumer.Name()
	}
	return ""
}

// A transaction that recorded an event and then failed leaves neither the
// business change nor the event behind.
func TestRolledBackConfirmRecordsNoEvent(t *testing.T) {
	h := start(t)
	id := h.newOrderID()
	if r := h.do("POST", "/orders", `{"id":"`+id+`","customerId":"c-7","totalAmount":12}`, ""); r.status != http.StatusCreated {
		t.Fatalf("POST /orders: %d %s", r.status, r.body)
	}
	boom := errors.New("payment service said no")
	err := h.uow.Do(context.Background(), func(ctx context.Context, tx unitofwork.Tx) error {
		if _, err := tx.Exec(ctx, "UPDATE "+h.schema+".orders SET status = 'CONFIRMED', confirmed_at = now() WHERE id = $1", id); err != nil {
			return err
		}
		if err := tx.Add(ctx, outbox.Event{AggregateType: orders.AggregateOrder, AggregateID: id, Type: orders.EventOrderConfirmed, Payload: map[string]string{"aggregateId": id}}); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Do returned %v, want the function's error", err)
	}
	if n := h.outboxRows(id); n != 1 {
		t.Errorf("order %s has %d outbox rows, want 1 (created only)", id, n)
	}
	if r := h.do("GET", "/orders/"+id, "", ""); r.order.Status != orders.StatusPending || r.order.TotalAmount != "12.00" {
		t.Errorf("order after the rollback: %s", r.body)
	}
	// The order can still be confirmed; exactly its two events arrive.
	if r := h.do("POST", "/orders/"+id+"/confirm", "", ""); r.status != http.StatusOK {
		t.Fatalf("confirm: %d %s", r.status, r.body)
	}
	var types, ids []string
	for _, d := range h.receive(2) {
		types, ids = append(types, d.EventType), append(ids, d.EventID)
	}
	slices.Sort(types)
	if want := []string{orders.EventOrderConfirmed, orders.EventOrderCreated}; !slices.Equal(types, want) {
		t.Errorf("events %v, want %v", types, want)
	}
	// The confirm delivered is the committed one: its id is a stored row's.
	rows, _ := h.pool.Query(context.Background(), "SELECT event_id::text FROM "+h.schema+".outbox_event WHERE aggregate_id = $1", id)
	stored, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(ids)
	slices.Sort(stored)
	if !slices.Equal(ids, stored) {
		t.Errorf("delivered event ids %v, want the committed rows' %v", ids, stored)
	}
	select {
	case d := <-h.deliveries:
		t.Errorf("unexpected third event %s %s", d.EventType, d.Payload)
	case <-time.After(500 * time.Millisecond):
	}
}

func TestCreateOrderValidation(t *testing.T) {
	h := start(t)
	for _, c := range []struct{ body, want string }{
		{`{"customerId":"c-1"}`, "totalAmount is required"},
		{`{"customerId":"c-1","totalAmount":"-1"}`, "is not an amount"},
		{`{"customerId":"c-1","totalAmount":"1.999"}`, "is not an amount"},
		{`{"totalAmount":"1.00"}`, "customerId is required"},
		{`{"id":"x","customerId":"c-1","totalAmount":"1.00"}`, "id must be a UUID"},
		{`{"customerId":"c-1","totalAmount":"1.00","extra":1}`, "unknown field"},
	} {
		if r := h.do("POST", "/orders", c.body, ""); r.status != http.StatusBadRequest || !strings.Contains(r.errText, c.want) {
			t.Errorf("POST /orders %s: %d %s, want 400 with %q", c.body, r.status, r.body, c.want)
		}
	}
	id := h.newOrderID()
	body := `{"id":"` + id + `","customerId":"c-1","totalAmount":"1.00"}`
	if r := h.do("POST", "/orders", body, ""); r.status != http.StatusCreated {
		t.Fatalf("POST /orders: %d %s", r.status, r.body)
	}
	if r := h.do("POST", "/orders", body, ""); r.status != http.StatusConflict {
		t.Errorf("POST /orders with an existing id: %d %s, want 409", r.status, r.body)
	}
	if n := h.outboxRows(id); n != 1 {
		t.Errorf("order %s has %d outbox rows, want 1", id, n)
	}
}
