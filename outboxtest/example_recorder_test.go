package outboxtest_test

import (
	"context"
	"fmt"

	"github.com/fxoutbox/outbox/outboxtest"
	"github.com/fxoutbox/outbox/unitofwork"
)

// A unit test of a handler without a database: the recorder stands in for
// the UnitOfWork, validates events as it would and keeps those of the
// transactions that succeed.
func ExampleRecorder() {
	t := &exampleT{} // in a test: func TestCapture(t *testing.T)
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
