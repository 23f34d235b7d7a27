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
