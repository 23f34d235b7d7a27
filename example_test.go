package outbox_test

import (
	"fmt"

	"github.com/fxoutbox/outbox"
)

func ExampleTopicPerEvent() {
	for _, typ := range []string{"order.confirmed.v1", "OrderCancelled.v2"} {
		topic, _ := outbox.TopicPerEvent("order-service", outbox.Event{AggregateType: "Order", Type: typ})
		fmt.Println(topic)
	}
	// Output:
	// order-service.order.confirmed
	// order-service.order.cancelled
}

func ExamplePrepare_invalid() {
	_, err := outbox.Prepare(outbox.Event{AggregateType: "order", Type: "order.created.v1"},
		"order-service", nil, outbox.Limits{}.WithDefaults(), nil)
	fmt.Println(err)
	// Output:
	// outbox: event 0 (type "order.created.v1"): AggregateID is empty: set the id of the entity the event is about
}
