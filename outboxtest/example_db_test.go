package outboxtest_test

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/outboxtest"
	"github.com/fxoutbox/outbox/unitofwork"
)

// A test of the same handler against PostgreSQL (DATABASE_URL): the events
// UnitOfWork.Do inserted are in the table once Do has returned.
func ExampleRequireInserted() {
	t := newExampleT() // in a test: func TestCaptureDB(t *testing.T)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(pool.Close) // before outboxtest.Table: its cleanup drops the schema through the pool

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

// A test that asserts inside its own transaction, as a team whose
// transaction helpers write events with UnitOfWork.AddTx would: the rows are
// visible in that transaction only, and its rollback leaves nothing behind.
func ExampleRequireManyInserted() {
	t := newExampleT() // in a test: func TestRefundDB(t *testing.T)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(pool.Close) // before outboxtest.Table: its cleanup drops the schema through the pool

	table := outboxtest.Table(t, pool)
	uow, err := unitofwork.New(pool, &unitofwork.Config{Service: "payment-service", Table: table})
	if err != nil {
		t.Fatalf("unitofwork: %v", err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	defer func() { _ = tx.Rollback(ctx) }() // nothing the test writes is committed

	err = uow.AddTx(ctx, tx,
		outbox.Event{AggregateType: "payment", AggregateID: "p-1", Type: "payment.captured.v1", Payload: PaymentCaptured{PaymentID: "p-1", AmountCents: 1250}},
		outbox.Event{AggregateType: "payment", AggregateID: "p-1", Type: "payment.refunded.v1", Payload: map[string]int64{"amountCents": 250}})
	if err != nil {
		t.Fatalf("AddTx: %v", err)
	}
	rows := outboxtest.RequireManyInserted(ctx, t, tx, table,
		outboxtest.Want{Type: "payment.captured.v1", Key: "p-1"},
		outboxtest.Want{Type: "payment.refunded.v1", Key: "p-1", Payload: map[string]int64{"amountCents": 250}})
	for _, r := range rows {
		fmt.Println(r.Type, r.Topic)
	}
	// Other connections see nothing before COMMIT.
	outboxtest.RequireNotInserted(ctx, t, pool, table, outboxtest.Want{})
	// Output:
	// payment.captured.v1 payment-service.payment.captured
	// payment.refunded.v1 payment-service.payment.refunded
}

// The two-outbox handler against PostgreSQL: one migrated outbox table per
// outbox (each in a schema of its own), real units of work, one
// transaction. Both rows are committed together; an event the audit outbox
// refuses leaves neither.
func ExampleRequireInserted_twoOutboxes() {
	t := newExampleT() // in a test: func TestCreatePaymentDB(t *testing.T)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(pool.Close) // before outboxtest.Table: its cleanup drops the schema through the pool

	paymentsTable, auditTable := outboxtest.Table(t, pool), outboxtest.Table(t, pool)
	payments, err := unitofwork.New(pool, &unitofwork.Config{Service: "payment-service", Table: paymentsTable})
	if err != nil {
		t.Fatalf("payments: %v", err)
	}
	audit, err := unitofwork.New(pool, &unitofwork.Config{Service: "audit", Table: auditTable,
		Topics: outbox.TopicPerAggregate, Limits: outbox.Limits{MaxAggregateIDBytes: 16}})
	if err != nil {
		t.Fatalf("audit: %v", err)
	}
	checkout := &Checkout{Payments: payments, Audit: audit}

	if err := checkout.CreatePayment(ctx, "p-1", 1250); err != nil {
		t.Fatalf("CreatePayment: %v", err)
	}
	payment := outboxtest.RequireInserted(ctx, t, pool, paymentsTable, outboxtest.Want{Type: "payment.created.v1", Key: "p-1"})
	entry := outboxtest.RequireInserted(ctx, t, pool, auditTable, outboxtest.Want{Type: "entry.recorded.v1", Key: "p-1"})
	fmt.Println(payment.Topic, entry.Topic)

	err = checkout.CreatePayment(ctx, "p-with-a-longer-id", 990)
	fmt.Println(errors.Is(err, outbox.ErrInvalidEvent))
	outboxtest.RequireNotInserted(ctx, t, pool, paymentsTable, outboxtest.Want{Key: "p-with-a-longer-id"})
	outboxtest.RequireNotInserted(ctx, t, pool, auditTable, outboxtest.Want{Key: "p-with-a-longer-id"})
	// Output:
	// payment-service.payment.created audit.entry
	// true
}
