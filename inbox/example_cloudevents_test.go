package inbox_test

import (
	"fmt"

	"github.com/fxoutbox/outbox/inbox"
)

// A CloudEvent without x-event-id is deduplicated on its source and id:
// CloudEventID turns both into the UUID the inbox stores, the same for
// every delivery of the event and different for another source.
func ExampleCloudEventID() {
	a := inbox.CloudEventID("/order-service", "o-1042-confirmed")
	again := inbox.CloudEventID("/order-service", "o-1042-confirmed")
	other := inbox.CloudEventID("urn:acme:orders", "o-1042-confirmed")
	fmt.Println(len(a), a == again, a == other)
	// Output: 36 true false
}
