package relay_test

import (
	"context"
	"fmt"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// One batch: the relay claims what was committed, hands it to its publisher
// and marks it. Production code passes relay.NewSaramaPublisher; this
// publisher prints instead.
func ExampleRelay_RunOnce() {
	pool, table, cleanup := testenv.ExampleDB()
	defer cleanup()
	ctx := context.Background()
	uow, _ := unitofwork.New(pool, &unitofwork.Config{Service: "order-service", Table: table})
	_ = uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		return tx.Add(ctx,
			outbox.Event{AggregateType: "Order", AggregateID: "o-1", Type: "order.created.v1", Payload: map[string]int{"total": 42}},
			outbox.Event{AggregateType: "Order", AggregateID: "o-1", Type: "order.confirmed.v1", Payload: map[string]int{"total": 42}})
	})

	printer := relay.PublisherFunc(func(_ context.Context, msgs []relay.Message) error {
		for _, m := range msgs {
			var typ string
			for _, h := range m.Headers {
				if h.Key == outbox.HeaderEventType {
					typ = string(h.Value)
				}
			}
			fmt.Printf("%s key=%s type=%s value=%s\n", m.Topic, m.Key, typ, m.Value)
		}
		return nil
	})
	r, err := relay.New(pool, printer, &relay.Config{Table: table})
	if err != nil {
		panic(err)
	}
	n, err := r.RunOnce(ctx)
	fmt.Println("published:", n, err)
	n, err = r.RunOnce(ctx)
	fmt.Println("published:", n, err)
	// Output:
	// order-service.order.created key=o-1 type=order.created.v1 value={"total": 42}
	// order-service.order.confirmed key=o-1 type=order.confirmed.v1 value={"total": 42}
	// published: 2 <nil>
	// published: 0 <nil>
}

// A relay that publishes each batch in a Kafka transaction, for consumers
// that read committed (see Delivery ExactlyOnce). It needs the relay's own
// producer.
func ExampleConfig_exactlyOnce() {
	pub, err := relay.NewSaramaPublisher([]string{"localhost:9092"}, nil)
	if err != nil {
		panic(err)
	}
	defer pub.Close()
	pool, table, cleanup := testenv.ExampleDB()
	defer cleanup()
	cfg := &relay.Config{Table: table, Delivery: relay.ExactlyOnce} // OUTBOX_DELIVERY=exactly-once under fxoutbox
	r, err := relay.New(pool, pub, cfg)
	if err != nil {
		panic(err)
	}
	c := r.Config()
	fmt.Println(c.Delivery, c.TransactionTimeout, c.ProgressTopic == "fxoutbox.progress."+table.String())
	// Output: exactly-once 10s true
}
