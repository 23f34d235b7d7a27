package outboxtest_test

import (
	"context"
	"errors"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/outboxtest"
	"github.com/fxoutbox/outbox/unitofwork"
)

// A unit test of a handler that runs SQL of its own and writes to two
// outboxes in one transaction, with neither a database nor a mock library:
// a RecordingDB, set as the shipping recorder's DB, records the handler's
// statements. When the handler fails, its Do rolls back what it wrote, as
// the real one does: the row's statement is then marked rolled back, and
// neither outbox keeps an event.
func ExampleRecordingDB() {
	t := newExampleT() // in a test: func TestShip(t *testing.T)
	ctx := context.Background()
	db := &outboxtest.RecordingDB{}
	shipping := outboxtest.NewRecorder(t, &outboxtest.RecorderConfig{
		UnitOfWork: unitofwork.Config{Service: "shipping"},
		DB:         db, // the handler's SQL goes here; each Do is a transaction on it
	})
	audit := outboxtest.NewRecorder(t, &outboxtest.RecorderConfig{
		UnitOfWork: unitofwork.Config{Service: "audit", Topics: outbox.TopicPerAggregate, Limits: outbox.Limits{MaxAggregateIDBytes: 16}},
	})
	shipments := &Shipments{Shipping: shipping, Audit: audit}

	if err := shipments.Ship(ctx, "o-1", "dhl"); err != nil {
		t.Fatalf("Ship: %v", err)
	}
	insert := outboxtest.RequireSQL(t, db, outboxtest.WantSQL{SQL: "INSERT INTO shipments", Args: []any{"o-1", "dhl"}})
	outboxtest.RequireEvent(t, shipping, outboxtest.Want{Type: "shipment.created.v1", Key: "o-1"})
	outboxtest.RequireEvent(t, audit, outboxtest.Want{Type: "entry.recorded.v1", Key: "o-1"})
	t.Logf("%s %v", insert.Method, insert.Args)

	// An order id over the audit outbox's limit fails the whole
	// transaction: the shipment's row is rolled back, no event is kept.
	if err := shipments.Ship(ctx, "o-with-a-longer-id", "dhl"); !errors.Is(err, outbox.ErrInvalidEvent) {
		t.Fatalf("Ship with an id too long for the audit outbox: %v, want outbox.ErrInvalidEvent", err)
	}
	outboxtest.RequireRolledBack(t, db, outboxtest.WantSQL{SQL: "INSERT INTO shipments", Args: []any{"o-with-a-longer-id", "dhl"}})
	outboxtest.RequireNoSQL(t, db, outboxtest.WantSQL{SQL: "INSERT INTO shipments", Args: []any{"o-with-a-longer-id", "dhl"}})
	outboxtest.RequireEvents(t, shipping, outboxtest.Want{Key: "o-1"})
	outboxtest.RequireEvents(t, audit, outboxtest.Want{Key: "o-1"})

	// A statement can fail as the database would: Ship fails with it.
	db.On("INSERT INTO shipments", outboxtest.SQLResult{Err: errors.New("duplicate key value violates unique constraint")})
	if err := shipments.Ship(ctx, "o-1", "ups"); err == nil {
		t.Fatalf("Ship of a shipment the database refuses succeeded")
	} else {
		t.Logf("%v", err)
	}
	outboxtest.RequireEvents(t, shipping, outboxtest.Want{Key: "o-1"})
	// Output:
	// Exec [o-1 dhl]
	// ship o-1: duplicate key value violates unique constraint
}
