package outboxtest_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/unitofwork"
)

// The handlers the examples test, as an application would write them. The
// examples' bodies, pasted into test functions beside this file, are run
// as tests by TestExamplesPastedIntoTests.

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

// PaymentCreated is the payload of payment.created.v1.
type PaymentCreated struct {
	PaymentID   string `json:"paymentId"`
	AmountCents int64  `json:"amountCents"`
}

// Checkout writes to two outboxes in one transaction: the payment's event
// to the payments outbox (Do) and an audit entry to the audit outbox
// (AddTx on the same transaction). With fx, both are the
// *unitofwork.UnitOfWork of fxoutbox.Named (or NamedFromEnv) "payments" and
// "audit"; in unit tests, two outboxtest.Recorders.
type Checkout struct {
	Payments unitofwork.Doer    // *unitofwork.UnitOfWork `name:"payments"`, or a recorder
	Audit    unitofwork.TxAdder // *unitofwork.UnitOfWork `name:"audit"`, or a recorder
}

// CreatePayment records payment.created.v1 and its audit entry, both or
// neither.
func (c *Checkout) CreatePayment(ctx context.Context, id string, cents int64) error {
	return c.Payments.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		err := tx.Add(ctx, outbox.Event{AggregateType: "payment", AggregateID: id, Type: "payment.created.v1",
			Payload: PaymentCreated{PaymentID: id, AmountCents: cents}})
		if err != nil {
			return err
		}
		return c.Audit.AddTx(ctx, unitofwork.PgxTx(tx), outbox.Event{AggregateType: "entry", AggregateID: id, Type: "entry.recorded.v1",
			Payload: map[string]string{"action": "payment.created", "paymentId": id}})
	})
}

// Shipments writes to two outboxes in one transaction, with SQL of its own
// in it: the shipment's row and event in the shipping outbox's transaction
// (Do), and an audit entry to the audit outbox (AddTx on the same
// transaction). All three are kept, or none.
type Shipments struct {
	Shipping unitofwork.Doer    // *unitofwork.UnitOfWork `name:"shipping"`, or a recorder
	Audit    unitofwork.TxAdder // *unitofwork.UnitOfWork `name:"audit"`, or a recorder
}

// Ship records the shipment of an order by a carrier.
func (s *Shipments) Ship(ctx context.Context, orderID, carrier string) error {
	return s.Shipping.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO shipments (order_id, carrier) VALUES ($1, $2)", orderID, carrier); err != nil {
			return fmt.Errorf("ship %s: %w", orderID, err)
		}
		err := tx.Add(ctx, outbox.Event{AggregateType: "shipment", AggregateID: orderID, Type: "shipment.created.v1",
			Payload: map[string]string{"orderId": orderID, "carrier": carrier}})
		if err != nil {
			return err
		}
		return s.Audit.AddTx(ctx, unitofwork.PgxTx(tx), outbox.Event{AggregateType: "entry", AggregateID: orderID, Type: "entry.recorded.v1",
			Payload: map[string]string{"action": "shipment.created", "orderId": orderID}})
	})
}
