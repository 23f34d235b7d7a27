package outboxtest_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/unitofwork"
)

// The handler the examples test: it captures a payment and records
// payment.captured.v1 in the same transaction.

// PaymentCaptured is the payload of payment.captured.v1.
type PaymentCaptured struct {
	PaymentID   string `json:"paymentId"`
	AmountCents int64  `json:"amountCents"`
}

// PaymentStore changes payments inside the handler's transaction.
type PaymentStore interface {
	Capture(ctx context.Context, tx unitofwork.Tx, id string, cents int64) error
}

// Payments depends on unitofwork.Doer, not on *unitofwork.UnitOfWork, so a
// unit test can pass an outboxtest.Recorder.
type Payments struct {
	UOW   unitofwork.Doer
	Store PaymentStore
}

// Capture captures a payment and records its event; a store error rolls
// both back.
func (p *Payments) Capture(ctx context.Context, id string, cents int64) error {
	if cents <= 0 {
		return fmt.Errorf("capture %s: amount must be positive", id)
	}
	return p.UOW.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		if err := p.Store.Capture(ctx, tx, id, cents); err != nil {
			return err
		}
		return tx.Add(ctx, outbox.Event{
			AggregateType: "payment",
			AggregateID:   id,
			Type:          "payment.captured.v1",
			Payload:       PaymentCaptured{PaymentID: id, AmountCents: cents},
		})
	})
}

// ErrDeclined is returned when the payment provider declines a capture.
var ErrDeclined = errors.New("declined")

// SQLStore keeps payments in a PostgreSQL table.
type SQLStore struct{ Table pgx.Identifier }

func (s SQLStore) Capture(ctx context.Context, tx unitofwork.Tx, id string, cents int64) error {
	if _, err := tx.Exec(ctx, "INSERT INTO "+s.Table.Sanitize()+" (id, captured_cents) VALUES ($1, $2)", id, cents); err != nil {
		return err
	}
	if id == "p-declined" { // stands in for a call to a payment provider
		return fmt.Errorf("capture %s: %w", id, ErrDeclined)
	}
	return nil
}

// fakeStore is the unit test's PaymentStore: no database.
type fakeStore struct{ declined string }

func (s fakeStore) Capture(_ context.Context, _ unitofwork.Tx, id string, _ int64) error {
	if id == s.declined {
		return fmt.Errorf("capture %s: %w", id, ErrDeclined)
	}
	return nil
}

// exampleT stands in for the t *testing.T of a test function, which an
// example does not have: copy the body of an example into a test and drop
// it.
type exampleT struct{ cleanups []func() }

func (*exampleT) Helper()                           {}
func (*exampleT) Errorf(format string, args ...any) { fmt.Printf("FAIL: "+format+"\n", args...) }
func (*exampleT) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
func (t *exampleT) Cleanup(f func())                { t.cleanups = append(t.cleanups, f) }
func (t *exampleT) runCleanups() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
}
