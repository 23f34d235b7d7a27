package outboxtest_test

import (
	"context"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox/outboxtest"
	"github.com/fxoutbox/outbox/unitofwork"
)

// A test of the same handler against PostgreSQL (DATABASE_URL): the events
// UnitOfWork.Do inserted are in the table once Do has returned.
func ExampleRequireInserted() {
	t := &exampleT{} // in a test: func TestCaptureDB(t *testing.T)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer pool.Close()
	defer t.runCleanups() // a test does not need this line

	table := outboxtest.Table(t, pool) // a migrated outbox table in a schema of its own
	payments := pgx.Identifier{table.Schema, "payments"}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+payments.Sanitize()+" (id text PRIMARY KEY, captured_cents bigint)"); err != nil {
		t.Fatalf("create payments: %v", err)
	}
	uow, err := unitofwork.New(pool, &unitofwork.Config{Service: "payment-service", Table: table})
	if err != nil {
		t.Fatalf("unitofwork: %v", err)
	}
	h := &Payments{UOW: uow, Store: SQLStore{Table: payments}}

	if err := h.Capture(ctx, "p-1", 1250); err != nil {
		t.Fatalf("Capture: %v", err)
	}
	row := outboxtest.RequireInserted(ctx, t, pool, table, outboxtest.Want{Type: "payment.captured.v1", Key: "p-1"})
	fmt.Println(row.Topic, outboxtest.Payload[PaymentCaptured](t, row.Record).AmountCents, row.PublishedAt == nil)

	// A declined capture rolls back: neither the payment nor its event.
	fmt.Println(h.Capture(ctx, "p-declined", 990))
	outboxtest.RequireNotInserted(ctx, t, pool, table, outboxtest.Want{Type: "payment.captured.v1", Key: "p-declined"})
	var n int
	_ = pool.QueryRow(ctx, "SELECT count(*) FROM "+payments.Sanitize()).Scan(&n)
	fmt.Println("payments:", n)
	// Output:
	// payment-service.payment.captured 1250 true
	// capture p-declined: declined
	// payments: 1
}
