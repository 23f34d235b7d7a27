package outboxtest_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/outboxtest"
	"github.com/fxoutbox/outbox/unitofwork"
)

// shipIn is the trial's handler: a business row through the shipping
// recorder's Do, its event, and an audit entry through the audit
// recorder's AddTx on the same transaction.
func shipIn(ctx context.Context, shipping *outboxtest.Recorder, audit *outboxtest.Recorder, table pgx.Identifier, id string) error {
	return shipping.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO "+table.Sanitize()+" (id) VALUES ($1)", id); err != nil {
			return err
		}
		if err := tx.Add(ctx, outbox.Event{AggregateType: "shipment", AggregateID: id, Type: "shipment.created.v1"}); err != nil {
			return err
		}
		return audit.AddTx(ctx, unitofwork.PgxTx(tx), outbox.Event{AggregateType: "entry", AggregateID: id, Type: "entry.recorded.v1"})
	})
}

// With RecorderConfig.DB a pgx.Tx, a failed Do rolls back what it wrote,
// as production would (a savepoint per Do): the trial found "shipments
// row: 1" after a failing handler. The test's transaction stays usable,
// and a Do that succeeds keeps its row in it.
func TestRecorderFailedDoRollsBackOnTx(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	ctx := context.Background()
	ptx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ptx.Rollback(ctx) }()
	if _, err := ptx.Exec(ctx, "CREATE TEMP TABLE shipments (id text PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	shipping := newRecorder(t, &outboxtest.RecorderConfig{UnitOfWork: unitofwork.Config{Service: "shipping"}, DB: ptx})
	audit := newRecorder(t, &outboxtest.RecorderConfig{UnitOfWork: unitofwork.Config{Service: "audit", Limits: outbox.Limits{MaxAggregateIDBytes: 8}}})
	table := pgx.Identifier{"shipments"}
	rows := func() (ids []string) {
		t.Helper()
		r, err := ptx.Query(ctx, "SELECT id FROM shipments ORDER BY id")
		if err != nil {
			t.Fatal(err)
		}
		ids, err = pgx.CollectRows(r, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}

	if err := shipIn(ctx, shipping, audit, table, "s-1"); err != nil {
		t.Fatal(err)
	}
	if err := shipIn(ctx, shipping, audit, table, "s-with-a-long-id"); !errors.Is(err, outbox.ErrInvalidEvent) {
		t.Fatalf("ship with an id over the audit limit = %v, want ErrInvalidEvent", err)
	}
	// A statement error aborts the Do's savepoint only: the test's
	// transaction goes on.
	if err := shipIn(ctx, shipping, audit, table, "s-1"); err == nil {
		t.Fatal("a duplicate row did not fail")
	}
	func() {
		defer func() { _ = recover() }()
		_ = shipping.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
			_, _ = tx.Exec(ctx, "INSERT INTO shipments (id) VALUES ('s-panic')")
			panic("boom")
		})
	}()
	if got := rows(); len(got) != 1 || got[0] != "s-1" {
		t.Fatalf("shipments rows %q after one good and three failed Do, want [s-1]", got)
	}

	// Transactions of the code's own, and savepoints in them.
	err = pgx.BeginFunc(ctx, shipping, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO shipments (id) VALUES ('s-own')"); err != nil {
			return err
		}
		sp, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := sp.Exec(ctx, "INSERT INTO shipments (id) VALUES ('s-sp')"); err != nil {
			return err
		}
		return sp.Rollback(ctx)
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = pgx.BeginFunc(ctx, shipping, func(tx pgx.Tx) error {
		_, _ = tx.Exec(ctx, "INSERT INTO shipments (id) VALUES ('s-rolled')")
		return errors.New("no")
	})
	if got := rows(); len(got) != 2 || got[0] != "s-1" || got[1] != "s-own" {
		t.Fatalf("shipments rows %q, want [s-1 s-own]", got)
	}
	ft := &fakeT{}
	outboxtest.RequireEvents(ft, shipping, outboxtest.Want{Key: "s-1"})
	outboxtest.RequireEvents(ft, audit, outboxtest.Want{Key: "s-1"})
	ft.passed(t)
}

// With RecorderConfig.DB a pool, each Do is a transaction of its own:
// committed when the function returns nil, rolled back when it fails.
func TestRecorderDoIsATransactionOnPool(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	ctx := context.Background()
	table := pgx.Identifier{testenv.Table(t, pool).Schema, "shipments"}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+table.Sanitize()+" (id text PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	shipping := newRecorder(t, &outboxtest.RecorderConfig{UnitOfWork: unitofwork.Config{Service: "shipping"}, DB: pool})
	audit := newRecorder(t, &outboxtest.RecorderConfig{UnitOfWork: unitofwork.Config{Service: "audit", Limits: outbox.Limits{MaxAggregateIDBytes: 8}}})
	if err := shipIn(ctx, shipping, audit, table, "s-1"); err != nil {
		t.Fatal(err)
	}
	if err := shipIn(ctx, shipping, audit, table, "s-with-a-long-id"); !errors.Is(err, outbox.ErrInvalidEvent) {
		t.Fatalf("ship = %v, want ErrInvalidEvent", err)
	}
	var ids []string
	r, err := pool.Query(ctx, "SELECT id FROM "+table.Sanitize())
	if err == nil {
		ids, err = pgx.CollectRows(r, pgx.RowTo[string])
	}
	if err != nil || len(ids) != 1 || ids[0] != "s-1" {
		t.Fatalf("rows %q, %v; want [s-1]: the failed Do's row must be rolled back, the good one's committed", ids, err)
	}
}
