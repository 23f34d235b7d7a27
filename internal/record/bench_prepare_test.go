package record_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/record"
)

// typicalPayload is a 1 KB order event: nested objects, an array of lines,
// strings, integers and decimals.
type orderLine struct {
	SKU      string  `json:"sku"`
	Name     string  `json:"name"`
	Quantity int     `json:"quantity"`
	Price    float64 `json:"price"`
}

type orderPlaced struct {
	OrderID    string            `json:"orderId"`
	CustomerID string            `json:"customerId"`
	Currency   string            `json:"currency"`
	Total      float64           `json:"total"`
	Lines      []orderLine       `json:"lines"`
	Shipping   map[string]string `json:"shipping"`
	Note       string            `json:"note"`
}

func typicalPayload() orderPlaced {
	p := orderPlaced{
		OrderID: "0191b3c2-7a4e-7cc1-9d1e-5c3b2a1f0e9d", CustomerID: "c-20481", Currency: "EUR", Total: 1234.56,
		Shipping: map[string]string{"street": "Hauptstraße 12", "city": "Köln", "zip": "50667", "country": "DE"},
		Note:     "Please deliver after 5 pm; ring twice. \"Fragile\" items inside.",
	}
	for i := range 8 {
		p.Lines = append(p.Lines, orderLine{SKU: fmt.Sprintf("SKU-%06d", i*7919), Name: fmt.Sprintf("Item number %d with a name", i), Quantity: i + 1, Price: 9.99 + float64(i)})
	}
	return p
}

// BenchmarkPrepare measures Prepare on a typical 1 KB payload, given as a
// value to marshal and as raw JSON.
//
//	go test -run '^$' -bench Prepare -benchmem ./internal/record/
func BenchmarkPrepare(b *testing.B) {
	limits := record.LimitsWithDefaults(outbox.Limits{})
	p := typicalPayload()
	raw, _ := json.Marshal(p)
	trace := map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	for _, v := range []struct {
		name    string
		payload any
	}{{"value", p}, {"raw", json.RawMessage(raw)}} {
		b.Run(fmt.Sprintf("%s-%dB", v.name, len(raw)), func(b *testing.B) {
			e := outbox.Event{AggregateType: "order", AggregateID: "o-1", Type: "order.placed.v1", Payload: v.payload}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := record.Prepare(e, "order-service", nil, limits, trace); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
