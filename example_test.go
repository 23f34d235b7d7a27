package outbox_test

import (
	"encoding/json"
	"errors"
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

// With per-aggregate topics every event type of one aggregate shares a
// topic, so a consumer sees one aggregate's events in order across types;
// the x-event-type header tells them apart.
func ExampleTopicPerAggregate() {
	for _, typ := range []string{"payment.created.v1", "payment.authorized.v1"} {
		topic, _ := outbox.TopicPerAggregate("payment-service", outbox.Event{AggregateType: "Payment", Type: typ})
		fmt.Println(topic)
	}
	// Output:
	// payment-service.payment
	// payment-service.payment
}

// A handler marks an error no retry can fix as permanent: the inbox parks
// its record at once instead of retrying it MaxAttempts times.
func ExamplePermanent() {
	decode := func(b []byte) error {
		var v map[string]any
		if err := json.Unmarshal(b, &v); err != nil {
			return outbox.Permanent(fmt.Errorf("decode order: %w", err))
		}
		return nil
	}
	err := decode([]byte("{not json"))
	fmt.Println(outbox.IsPermanent(err))
	fmt.Println(outbox.IsPermanent(errors.New("connection reset")))
	// Output:
	// true
	// false
}
