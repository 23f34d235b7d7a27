package record_test

import (
	"fmt"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/record"
)

func ExamplePrepare_invalid() {
	_, err := record.Prepare(outbox.Event{AggregateType: "order", Type: "order.created.v1"},
		"order-service", nil, record.LimitsWithDefaults(outbox.Limits{}), nil)
	fmt.Println(err)
	// Output:
	// outbox: event 0 (type "order.created.v1"): AggregateID is empty: set the id of the entity the event is about
}
