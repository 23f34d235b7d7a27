package unitofwork_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/unitofwork"
)

// A team with its own transaction helper adds events to the pgx.Tx it
// manages: they commit, or roll back, with it.
func ExampleUnitOfWork_AddTx() {
	pool, table, cleanup := testenv.ExampleDB() // a fresh schema on DATABASE_URL
	defer cleanup()
	ctx := context.Background()
	uow, err := unitofwork.New(pool, &unitofwork.Config{Service: "order-service", Table: table})
	if err != nil {
		panic(err)
	}
	defer uow.Close()

	placed := outbox.Event{AggregateType: "Order", AggregateID: "o-7", Type: "order.placed.v1", Payload: map[string]string{"orderId": "o-7"}}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return uow.AddTx(ctx, tx, placed)
	})
	fmt.Println("committed:", err)
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := uow.AddTx(ctx, tx, placed); err != nil {
			return err
		}
		return errors.New("stock check failed")
	})
	fmt.Println("rolled back:", err)

	var n int
	_ = pool.QueryRow(ctx, "SELECT count(*) FROM "+table.Schema+"."+outbox.DefaultTableName).Scan(&n)
	fmt.Println("events in the table:", n)
	// Output:
	// committed: <nil>
	// rolled back: stock check failed
	// events in the table: 1
}
