package unitofwork_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/migrations"
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
	_ = pool.QueryRow(ctx, "SELECT topic, partition_key FROM "+sqlname.Ident(table)).Scan(&topic, &key)
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

// One transaction writes to two outbox tables (here: payments and an audit
// trail with its own service name): Do on one unit of work, AddTx on the
// other with the transaction's pgx.Tx. Both commit together.
func ExamplePgxTx() {
	pool, payments, cleanup := testenv.ExampleDB()
	defer cleanup()
	ctx := context.Background()
	audit := outbox.Table{Schema: payments.Schema, Name: "audit_outbox"}
	if err := migrations.Outbox.Up(ctx, pool, audit); err != nil {
		panic(err)
	}
	pay, _ := unitofwork.New(pool, &unitofwork.Config{Service: "payment-service", Table: payments})
	trail, _ := unitofwork.New(pool, &unitofwork.Config{Service: "audit", Table: audit})
	defer trail.Close()

	err := pay.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		if err := tx.Add(ctx, outbox.Event{AggregateType: "payment", AggregateID: "p-1", Type: "payment.created.v1"}); err != nil {
			return err
		}
		return trail.AddTx(ctx, unitofwork.PgxTx(tx), outbox.Event{AggregateType: "entry", AggregateID: "p-1", Type: "entry.recorded.v1"})
	})
	fmt.Println("commit:", err)
	for _, t := range []outbox.Table{payments, audit} {
		var topic string
		_ = pool.QueryRow(ctx, "SELECT topic FROM "+sqlname.Ident(t)).Scan(&topic)
		fmt.Println(t.WithDefaults().Name+":", topic)
	}
	// Output:
	// commit: <nil>
	// outbox_event: payment-service.payment.created
	// audit_outbox: audit.entry.recorded
}
