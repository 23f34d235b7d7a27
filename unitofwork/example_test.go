package unitofwork_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/unitofwork"
)

// A business change and its event commit together; a failed one leaves
// neither.
func Example() {
	pool, table, cleanup := testenv.ExampleDB() // a fresh schema on DATABASE_URL
	defer cleanup()
	ctx := context.Background()
	_, _ = pool.Exec(ctx, "CREATE TABLE "+table.Schema+".orders (id text PRIMARY KEY, status text)")
	_, _ = pool.Exec(ctx, "INSERT INTO "+table.Schema+".orders VALUES ('o-1', 'pending')")

	uow, err := unitofwork.New(pool, &unitofwork.Config{Service: "order-service", Table: table})
	if err != nil {
		panic(err)
	}
	confirm := func(id string, fail bool) error {
		return uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
			var status string
			if err := tx.QueryRow(ctx, "SELECT status FROM "+table.Schema+".orders WHERE id = $1 FOR UPDATE", id).Scan(&status); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "UPDATE "+table.Schema+".orders SET status = 'confirmed' WHERE id = $1", id); err != nil {
				return err
			}
			if err := tx.Add(ctx, outbox.Event{AggregateType: "Order", AggregateID: id, Type: "order.confirmed.v1",
				Payload: map[string]string{"orderId": id}}); err != nil {
				return err
			}
			if fail {
				return errors.New("payment declined")
			}
			return nil
		})
	}
	fmt.Println("failed confirm:", confirm("o-1", true))
	fmt.Println("confirm:", confirm("o-1", false))

	var topic, key, status string
	_ = pool.QueryRow(ctx, "SELECT topic, partition_key FROM "+table.Ident()).Scan(&topic, &key)
	_ = pool.QueryRow(ctx, "SELECT status FROM "+table.Schema+".orders").Scan(&status)
	fmt.Println("outbox:", topic, key, "- order:", status)
	// Output:
	// failed confirm: payment declined
	// confirm: <nil>
	// outbox: order-service.order.confirmed o-1 - order: confirmed
}

// An invalid event fails in the handler, naming the field.
func ExampleTx_Add_invalid() {
	pool, table, cleanup := testenv.ExampleDB()
	defer cleanup()
	uow, _ := unitofwork.New(pool, &unitofwork.Config{Service: "order-service", Table: table})
	err := uow.Do(context.Background(), func(ctx context.Context, tx unitofwork.Tx) error {
		return tx.Add(ctx, outbox.Event{AggregateType: "Order", AggregateID: "o-1", Type: "order.confirmed.v1", Payload: make(chan int)})
	})
	fmt.Println(err)
	fmt.Println(errors.Is(err, outbox.ErrInvalidEvent))
	// Output:
	// outbox: event 0 (type "order.confirmed.v1"): Payload cannot be encoded as JSON: json: unsupported type: chan int
	// true
}
