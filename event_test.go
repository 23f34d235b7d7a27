package outbox_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/record"
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

func TestLimitsValidate(t *testing.T) {
	l := record.LimitsWithDefaults(outbox.Limits{})
	if l.MaxRecordBytes != outbox.DefaultMaxRecordBytes || l.MaxPayloadBytes != l.MaxRecordBytes || l.MaxTypeBytes != 255 ||
		l.MaxAggregateTypeBytes != 255 || l.MaxAggregateIDBytes != 1024 || l.MaxKeyBytes != 1024 || l.Validate() != nil {
		t.Errorf("defaults = %+v, %v", l, l.Validate())
	}
	for _, bad := range []outbox.Limits{{MaxPayloadBytes: 2 << 20}, {MaxKeyBytes: -1}, {MaxRecordBytes: 1000, MaxPayloadBytes: 1001}} {
		if err := record.LimitsWithDefaults(bad).Validate(); !errors.Is(err, outbox.ErrInvalidConfig) {
			t.Errorf("Validate(%+v) = %v, want ErrInvalidConfig", bad, err)
		}
	}
}

func TestTable(t *testing.T) {
	for _, bad := range []outbox.Table{{Name: `x"; DROP TABLE users; --`}, {Schema: "a b"}, {Name: "1abc"}, {Name: strings.Repeat("n", 56)}} {
		if err := bad.Validate(); !errors.Is(err, outbox.ErrInvalidConfig) {
			t.Errorf("Validate(%+v) = %v, want ErrInvalidConfig", bad, err)
		}
	}
}

func TestSlotAndPublicationNames(t *testing.T) {
	for _, c := range []struct {
		table     outbox.Table
		pub, slot string
	}{
		{outbox.Table{}, "outbox_event_fxoutbox", "orders_outbox_event_fxoutbox"},
		{outbox.Table{Schema: "billing", Name: "outbox"}, "billing_outbox_fxoutbox", "orders_billing_outbox_fxoutbox"},
	} {
		if got := c.table.Slot("orders"); got != c.slot || c.table.Publication() != c.pub {
			t.Errorf("%v: slot %q, publication %q, want %q and %q", c.table, got, c.table.Publication(), c.slot, c.pub)
		}
	}
	// Slot names are server-wide: two databases' outboxes get two slots.
	if (outbox.Table{}).Slot("orders") == (outbox.Table{}).Slot("billing") {
		t.Error("two databases share a slot name")
	}
	// Names a slot does not allow, or too long, get a hash of the names:
	// distinct tables keep distinct slots.
	a, b := outbox.Table{Name: "Outbox"}.Slot("db"), outbox.Table{Name: "outbox"}.Slot("db")
	long := outbox.Table{Schema: strings.Repeat("s", 40), Name: strings.Repeat("t", 40)}.Slot("db")
	for _, n := range []string{a, long, (outbox.Table{}).Slot("Orders-DB")} {
		if len(n) > 63 || strings.Trim(n, "abcdefghijklmnopqrstuvwxyz0123456789_") != "" {
			t.Errorf("slot name %q is not valid", n)
		}
	}
	if a == b {
		t.Errorf("Outbox and outbox share the slot %q", a)
	}
}
