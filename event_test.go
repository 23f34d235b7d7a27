package outbox_test

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/fxoutbox/outbox"
)

func TestTopicPerEvent(t *testing.T) {
	cases := []struct {
		service, agg, typ, want string
	}{
		{"order-service", "Order", "order.confirmed.v1", "order-service.order.confirmed"},
		{"order-service", "order", "order.created", "order-service.order.created"},
		{"order-service", "Order", "OrderCancelled.v2", "order-service.order.cancelled"},
		{"product-service", "Product", "ProductPriceChanged.v1", "product-service.product.price-changed"},
		{"payment-service", "Payment", "payment.charged.v10", "payment-service.payment.charged"},
		{"customer-service", "Customer", "registered", "customer-service.customer.registered"},
		{"shop", "OrderLine", "order-line.item_added.v1", "shop.order-line.item-added"},
	}
	for _, c := range cases {
		got, err := outbox.TopicPerEvent(c.service, outbox.Event{AggregateType: c.agg, Type: c.typ})
		if err != nil || got != c.want {
			t.Errorf("TopicPerEvent(%q, %q, %q) = %q, %v; want %q", c.service, c.agg, c.typ, got, err, c.want)
		}
		if err := outbox.ValidateTopic(got); err != nil {
			t.Errorf("derived topic %q invalid: %v", got, err)
		}
	}
	if _, err := outbox.TopicPerEvent("", outbox.Event{AggregateType: "order", Type: "order.created"}); err == nil || !strings.Contains(err.Error(), "Service") {
		t.Errorf("no service: err = %v, want one naming Service", err)
	}
	got, err := outbox.TopicPerAggregate("product-service", outbox.Event{AggregateType: "Product", Type: "ProductPublished.v1"})
	if err != nil || got != "product-service.product" {
		t.Errorf("TopicPerAggregate = %q, %v", got, err)
	}
}

func TestValidateTopic(t *testing.T) {
	for _, ok := range []string{"a", "order-service.order.confirmed", "A_b-c.9", strings.Repeat("x", 249)} {
		if err := outbox.ValidateTopic(ok); err != nil {
			t.Errorf("ValidateTopic(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", ".", "..", "has space", "slash/topic", "ümlaut", strings.Repeat("x", 250)} {
		if err := outbox.ValidateTopic(bad); err == nil {
			t.Errorf("ValidateTopic(%q) = nil, want error", bad)
		}
	}
}

func valid() outbox.Event {
	return outbox.Event{AggregateType: "order", AggregateID: "o-1", Type: "order.created.v1", Payload: map[string]any{"total": 42}}
}

func TestPrepareDefaults(t *testing.T) {
	limits := outbox.Limits{}.WithDefaults()
	r, err := outbox.Prepare(valid(), "order-service", nil, limits, map[string]string{"traceparent": "00-abc"})
	if err != nil {
		t.Fatal(err)
	}
	if r.ID.Version() != 7 {
		t.Errorf("id %v is version %d, want a UUIDv7", r.ID, r.ID.Version())
	}
	if r.Key != "o-1" || r.Topic != "order-service.order.created" || string(r.Payload) != `{"total":42}` {
		t.Errorf("record = %+v", r)
	}
	if r.Headers["traceparent"] != "00-abc" {
		t.Errorf("trace context not kept: %v", r.Headers)
	}
	e := valid()
	e.ID, e.Key, e.Topic, e.Payload = uuid.New(), "k", "explicit.topic", json.RawMessage(`{"a":1}`)
	e.Headers = map[string]string{"tenant": "t1"}
	r, err = outbox.Prepare(e, "", nil, limits, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.ID != e.ID || r.Key != "k" || r.Topic != "explicit.topic" || string(r.Payload) != `{"a":1}` || r.Headers["tenant"] != "t1" {
		t.Errorf("explicit fields not kept: %+v", r)
	}
}

func TestPrepareRejects(t *testing.T) {
	limits := outbox.Limits{MaxPayloadBytes: 100, MaxHeaders: 2, MaxHeaderBytes: 20}.WithDefaults()
	cases := []struct {
		name  string
		edit  func(*outbox.Event)
		field string
	}{
		{"no type", func(e *outbox.Event) { e.Type = " " }, "Type"},
		{"no aggregate type", func(e *outbox.Event) { e.AggregateType = "" }, "AggregateType"},
		{"no aggregate id", func(e *outbox.Event) { e.AggregateID = "" }, "AggregateID"},
		{"unmarshalable payload", func(e *outbox.Event) { e.Payload = math.Inf(1) }, "Payload"},
		{"channel payload", func(e *outbox.Event) { e.Payload = make(chan int) }, "Payload"},
		{"invalid raw JSON", func(e *outbox.Event) { e.Payload = []byte("{nope") }, "Payload"},
		{"oversized payload", func(e *outbox.Event) { e.Payload = strings.Repeat("x", 200) }, "Payload"},
		{"invalid topic", func(e *outbox.Event) { e.Topic = "bad topic" }, "Topic"},
		{"reserved header", func(e *outbox.Event) { e.Headers = map[string]string{"X-Event-ID": "forged"} }, "Headers"},
		{"traceparent header", func(e *outbox.Event) { e.Headers = map[string]string{"traceparent": "x"} }, "Headers"},
		{"too many headers", func(e *outbox.Event) { e.Headers = map[string]string{"a": "1", "b": "2", "c": "3"} }, "Headers"},
		{"oversized header", func(e *outbox.Event) { e.Headers = map[string]string{"a": strings.Repeat("v", 30)} }, "Headers"},
		{"invalid utf8 key", func(e *outbox.Event) { e.Key = "\xff" }, "Key"},
	}
	for _, c := range cases {
		e := valid()
		c.edit(&e)
		_, err := outbox.Prepare(e, "svc", nil, limits, nil)
		var ee *outbox.EventError
		if !errors.Is(err, outbox.ErrInvalidEvent) || !errors.As(err, &ee) || ee.Field != c.field {
			t.Errorf("%s: err = %v, want an EventError on field %s", c.name, err, c.field)
			continue
		}
		if !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: message %q does not name %s", c.name, err, c.field)
		}
	}
	// Nil payload is JSON null, not an error.
	e := valid()
	e.Payload = nil
	if r, err := outbox.Prepare(e, "svc", nil, limits, nil); err != nil || string(r.Payload) != "null" {
		t.Errorf("nil payload: %q, %v", r.Payload, err)
	}
}

func TestTable(t *testing.T) {
	if got := (outbox.Table{}).Ident(); got != `"outbox_event"` {
		t.Errorf("default Ident = %s", got)
	}
	if got := (outbox.Table{Schema: "app", Name: "events"}).Ident(); got != `"app"."events"` {
		t.Errorf("Ident = %s", got)
	}
	for _, bad := range []outbox.Table{{Name: `x"; DROP TABLE users; --`}, {Schema: "a b"}, {Name: "1abc"}, {Name: strings.Repeat("n", 56)}} {
		if err := bad.Validate(); !errors.Is(err, outbox.ErrInvalidConfig) {
			t.Errorf("Validate(%+v) = %v, want ErrInvalidConfig", bad, err)
		}
	}
}
