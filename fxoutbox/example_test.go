package fxoutbox_test

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/fx"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/fxoutbox"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// An fx application records an event in a handler's transaction; the
// module's relay, woken by the commit, publishes it. Production code sets
// Config.Brokers and lets the module build the sarama producer; this
// application supplies a publisher that prints.
func Example() {
	pool, table, cleanup := testenv.ExampleDB()
	defer cleanup()
	published := make(chan struct{})
	printer := relay.PublisherFunc(func(_ context.Context, msgs []relay.Message) error {
		for _, m := range msgs {
			fmt.Printf("published %s key=%s\n", m.Topic, m.Key)
		}
		close(published)
		return nil
	})

	app := fx.New(
		fx.NopLogger,
		fx.Supply(pool, fxoutbox.Config{Service: "order-service", Table: table}),
		fx.Supply(fx.Annotate(printer, fx.As(new(relay.Publisher)))),
		fxoutbox.Module,
		fx.Invoke(func(lc fx.Lifecycle, uow *unitofwork.UnitOfWork) {
			lc.Append(fx.StartHook(func(ctx context.Context) error {
				return uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
					return tx.Add(ctx, outbox.Event{AggregateType: "Order", AggregateID: "o-1", Type: "order.confirmed.v1"})
				})
			}))
		}),
	)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := app.Start(ctx); err != nil {
		panic(err)
	}
	<-published
	if err := app.Stop(ctx); err != nil {
		panic(err)
	}
	fmt.Println("stopped")
	// Output:
	// published order-service.order.confirmed key=o-1
	// stopped
}
