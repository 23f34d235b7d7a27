package fxoutbox_test

import (
	"context"
	"fmt"
	"sync"
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
		fx.Supply(pool, fxoutbox.Config{Table: table, Writer: unitofwork.Config{Service: "order-service"}}),
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

// Two outboxes in one application, each with its own table, service name
// and relay, injected by name; one transaction writes to both. Production
// code sets Config.Brokers; here each instance gets a publisher that
// prints, supplied under the instance's name.
func ExampleNamed() {
	pool, payments, cleanup := testenv.ExampleDB()
	defer cleanup()
	audit := outbox.Table{Schema: payments.Schema, Name: "audit_outbox"}
	var wg sync.WaitGroup
	wg.Add(2)
	printer := func(name string) relay.Publisher {
		return relay.PublisherFunc(func(_ context.Context, msgs []relay.Message) error {
			for _, m := range msgs {
				fmt.Printf("%s relay published %s\n", name, m.Topic)
				wg.Done()
			}
			return nil
		})
	}
	type handlers struct {
		fx.In
		Payments *unitofwork.UnitOfWork `name:"payments"`
		Audit    *unitofwork.UnitOfWork `name:"audit"`
	}
	var h handlers
	app := fx.New(
		fx.NopLogger,
		fx.Supply(pool),
		fxoutbox.Named("payments", fxoutbox.Config{Table: payments, Writer: unitofwork.Config{Service: "payment-service"}}),
		fxoutbox.Named("audit", fxoutbox.Config{Table: audit, Migrate: true, Writer: unitofwork.Config{Service: "audit"}}),
		fx.Supply(
			fx.Annotate(printer("payments"), fx.As(new(relay.Publisher)), fx.ResultTags(`name:"payments"`)),
			fx.Annotate(printer("audit"), fx.As(new(relay.Publisher)), fx.ResultTags(`name:"audit"`)),
		),
		fx.Populate(&h),
	)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := app.Start(ctx); err != nil {
		panic(err)
	}
	err := h.Payments.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		if err := tx.Add(ctx, outbox.Event{AggregateType: "payment", AggregateID: "p-1", Type: "payment.created.v1"}); err != nil {
			return err
		}
		return h.Audit.AddTx(ctx, unitofwork.PgxTx(tx), outbox.Event{AggregateType: "entry", AggregateID: "p-1", Type: "entry.recorded.v1"})
	})
	if err != nil {
		panic(err)
	}
	wg.Wait()
	if err := app.Stop(ctx); err != nil {
		panic(err)
	}
	// Unordered output:
	// payments relay published payment-service.payment.created
	// audit relay published audit.entry.recorded
}
