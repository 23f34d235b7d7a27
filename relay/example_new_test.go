package relay_test

import (
	"context"
	"fmt"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// A relay started with its owner and stopped with it, woken when a unit of
// work commits (the fxoutbox module wires the same hook). Production code
// passes relay.NewSaramaPublisher(brokers, relay.DefaultSaramaConfig());
// this publisher hands the records to the example instead.
func ExampleNew() {
	pool, table, cleanup := testenv.ExampleDB() // a fresh schema on DATABASE_URL
	defer cleanup()
	ctx := context.Background()

	published := make(chan relay.Message, 10)
	pub := relay.PublisherFunc(func(_ context.Context, msgs []relay.Message) error {
		for _, m := range msgs {
			published <- m
		}
		return nil
	})
	r, err := relay.New(pool, pub, &relay.Config{Table: table})
	if err != nil {
		panic(err)
	}
	if err := r.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = r.Stop(ctx) }()

	uow, err := unitofwork.New(pool, &unitofwork.Config{Service: "order-service", Table: table, OnCommit: func(int) { r.Wake() }})
	if err != nil {
		panic(err)
	}
	defer uow.Close()
	err = uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		return tx.Add(ctx, outbox.Event{AggregateType: "Order", AggregateID: "o-1", Type: "order.created.v1", Payload: map[string]int{"total": 42}})
	})
	fmt.Println("committed:", err)
	m := <-published // the relay publishes it after the commit
	fmt.Println(m.Topic, string(m.Key), string(m.Value))
	// Output:
	// committed: <nil>
	// order-service.order.created o-1 {"total": 42}
}
