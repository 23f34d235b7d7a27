package outboxtest_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/outboxtest"
	"github.com/fxoutbox/outbox/unitofwork"
)

// A unit test of a handler without a database: the recorder stands in for
// the UnitOfWork, validates events as it would and keeps those of the
// transactions that succeed.
func ExampleRecorder() {
	t := newExampleT() // in a test: func TestCapture(t *testing.T)
	ctx := context.Background()
	rec := outboxtest.NewRecorder(t, &outboxtest.RecorderConfig{
		UnitOfWork: unitofwork.Config{Service: "payment-service"}, // as in production: topics are derived the same way
	})
	payments := &Payments{UOW: rec, Store: fakeStore{declined: "p-2"}}

	if err := payments.Capture(ctx, "p-1", 1250); err != nil {
		t.Fatalf("Capture: %v", err)
	}
	ev := outboxtest.RequireEvent(t, rec, outboxtest.Want{Type: "payment.captured.v1", Key: "p-1"})
	captured := outboxtest.Payload[PaymentCaptured](t, ev)
	fmt.Println(ev.Topic, captured.PaymentID, captured.AmountCents)

	// A declined capture fails inside the transaction: nothing is recorded.
	rec.Reset()
	fmt.Println(payments.Capture(ctx, "p-2", 990))
	outboxtest.RequireNoEvents(t, rec)
	// Output:
	// payment-service.payment.captured p-1 1250
	// capture p-2: declined
}

// A unit test of a handler that writes to two outboxes in one transaction
// (Do on one, AddTx on the other): a recorder per outbox, each built with
// that outbox's configuration (service, topic naming, limits), validates
// and records its own events, and keeps them only if the transaction
// commits.
func ExampleRecorder_AddTx() {
	t := newExampleT() // in a test: func TestCreatePayment(t *testing.T)
	ctx := context.Background()
	payments := outboxtest.NewRecorder(t, &outboxtest.RecorderConfig{
		UnitOfWork: unitofwork.Config{Service: "payment-service"},
	})
	audit := outboxtest.NewRecorder(t, &outboxtest.RecorderConfig{
		UnitOfWork: unitofwork.Config{Service: "audit", Topics: outbox.TopicPerAggregate, Limits: outbox.Limits{MaxAggregateIDBytes: 16}},
	})
	checkout := &Checkout{Payments: payments, Audit: audit}

	if err := checkout.CreatePayment(ctx, "p-1", 1250); err != nil {
		t.Fatalf("CreatePayment: %v", err)
	}
	payment := outboxtest.RequireEvent(t, payments, outboxtest.Want{Type: "payment.created.v1", Key: "p-1"})
	entry := outboxtest.RequireEvent(t, audit, outboxtest.Want{Type: "entry.recorded.v1", Key: "p-1",
		Payload: map[string]string{"action": "payment.created", "paymentId": "p-1"}})
	if got := outboxtest.Payload[PaymentCreated](t, payment); got.AmountCents != 1250 {
		t.Fatalf("amount %d, want 1250", got.AmountCents)
	}
	t.Logf("topics %s and %s", payment.Topic, entry.Topic)

	// An id over the audit outbox's limit fails the whole transaction: the
	// payment's event is not kept either.
	if err := checkout.CreatePayment(ctx, "p-with-a-longer-id", 990); !errors.Is(err, outbox.ErrInvalidEvent) {
		t.Fatalf("CreatePayment with an id too long for the audit outbox: %v, want outbox.ErrInvalidEvent", err)
	}
	outboxtest.RequireEvents(t, payments, outboxtest.Want{Key: "p-1"})
	outboxtest.RequireEvents(t, audit, outboxtest.Want{Key: "p-1"})
	// Output:
	// topics payment-service.payment.created and audit.entry
}
