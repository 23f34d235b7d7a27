package outboxtest_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/outboxtest"
	"github.com/fxoutbox/outbox/unitofwork"
)

// auditService is the second outbox of the tests: its own service name,
// topic naming and limits.
var auditService = &outboxtest.RecorderConfig{UnitOfWork: unitofwork.Config{
	Service: "audit", Topics: outbox.TopicPerAggregate, Limits: outbox.Limits{MaxTypeBytes: 20},
}}

func entry(id string) outbox.Event {
	return outbox.Event{AggregateType: "entry", AggregateID: id, Type: "entry.recorded.v1", Payload: map[string]any{"id": id}}
}

// payAndAudit is the pattern of docs/configuration.md's "Several outboxes": Do on the payments outbox, AddTx on
// the audit outbox in the same transaction.
func payAndAudit(ctx context.Context, payments unitofwork.Doer, audit unitofwork.TxAdder, id string, audited outbox.Event, fail error) error {
	return payments.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		if err := tx.Add(ctx, captured(id)); err != nil {
			return err
		}
		if err := audit.AddTx(ctx, unitofwork.PgxTx(tx), audited); err != nil {
			return err
		}
		return fail
	})
}

// Two recorders, one transaction: each validates and derives with its own
// outbox's configuration and records its own events, both only when the
// transaction commits.
func TestRecorderTwoOutboxesInOneDo(t *testing.T) {
	ctx := context.Background()
	payments, audit := newRecorder(t, payService), newRecorder(t, auditService)

	if err := payAndAudit(ctx, payments, audit, "p-1", entry("p-1"), nil); err != nil {
		t.Fatal(err)
	}
	ft := &fakeT{}
	outboxtest.RequireEvents(ft, payments, outboxtest.Want{Type: "payment.captured.v1", Topic: "payment-service.payment.captured", Key: "p-1"})
	outboxtest.RequireEvents(ft, audit, outboxtest.Want{Type: "entry.recorded.v1", Topic: "audit.entry", Key: "p-1", Payload: map[string]any{"id": "p-1"}})
	ft.passed(t)

	// The handler fails after both adds: neither outbox keeps anything.
	payments.Reset()
	audit.Reset()
	declined := errors.New("declined")
	if err := payAndAudit(ctx, payments, audit, "p-2", entry("p-2"), declined); err != declined {
		t.Fatalf("Do = %v, want the function's error", err)
	}
	outboxtest.RequireNoEvents(ft, payments)
	outboxtest.RequireNoEvents(ft, audit)
	ft.passed(t)

	// An event the audit outbox refuses (its Type is over the audit limit of
	// 20 bytes, not over the payments' default) fails the transaction with
	// the writer's error.
	long := entry("p-3")
	long.Type = "entry.recorded.with.a.long.name.v1"
	err := payAndAudit(ctx, payments, audit, "p-3", long, nil)
	var ee *outbox.EventError
	if !errors.As(err, &ee) || ee.Field != "Type" {
		t.Fatalf("Do with an event over the audit outbox's limit = %v, want an EventError for Type", err)
	}
	outboxtest.RequireNoEvents(ft, payments)
	outboxtest.RequireNoEvents(ft, audit)
	ft.passed(t)

	// AddTx on the recorder's own transaction is Add.
	err = payments.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		if err := tx.Add(ctx, captured("p-4")); err != nil {
			return err
		}
		return payments.AddTx(ctx, unitofwork.PgxTx(tx), captured("p-5"))
	})
	if err != nil {
		t.Fatal(err)
	}
	outboxtest.RequireEvents(ft, payments, outboxtest.Want{Key: "p-4"}, outboxtest.Want{Key: "p-5"})
	ft.passed(t)

	// After Do returned, the transaction is done for every recorder.
	var late unitofwork.Tx
	_ = payments.Do(ctx, func(_ context.Context, tx unitofwork.Tx) error { late = tx; return nil })
	if err := audit.AddTx(ctx, unitofwork.PgxTx(late), entry("p-6")); !errors.Is(err, unitofwork.ErrTxDone) {
		t.Fatalf("AddTx after Do = %v, want ErrTxDone", err)
	}
}

// A transaction no recorder created is refused with an error saying what
// to pass instead.
func TestRecorderAddTxOnAForeignTx(t *testing.T) {
	audit := newRecorder(t, auditService)
	for _, tx := range []pgx.Tx{nil, foreignTx{}} {
		err := audit.AddTx(context.Background(), tx, entry("e-1"))
		if !errors.Is(err, outboxtest.ErrForeignTx) {
			t.Errorf("AddTx on %T = %v, want ErrForeignTx", tx, err)
		}
	}
	if n := len(audit.Events()); n != 0 {
		t.Fatalf("recorded %d events", n)
	}
}

type foreignTx struct{ pgx.Tx }

// A handler that runs its own transaction (pgx.BeginFunc over something
// with Begin) takes the recorder as that too: events added with AddTx are
// recorded on commit, dropped on rollback; a savepoint's events join its
// transaction on Commit and are dropped on its Rollback.
func TestRecorderBeginCommitAndRollback(t *testing.T) {
	ctx := context.Background()
	payments, audit := newRecorder(t, payService), newRecorder(t, auditService)
	err := pgx.BeginFunc(ctx, payments, func(tx pgx.Tx) error {
		if err := payments.AddTx(ctx, tx, captured("p-1")); err != nil {
			return err
		}
		if err := audit.AddTx(ctx, tx, entry("p-1")); err != nil {
			return err
		}
		if n := len(payments.Events()) + len(audit.Events()); n != 0 {
			t.Errorf("%d events recorded before the commit", n)
		}
		kept, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		if err := audit.AddTx(ctx, kept, entry("kept")); err != nil {
			return err
		}
		if err := kept.Commit(ctx); err != nil {
			return err
		}
		dropped, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		if err := audit.AddTx(ctx, dropped, entry("dropped")); err != nil {
			return err
		}
		return dropped.Rollback(ctx)
	})
	if err != nil {
		t.Fatal(err)
	}
	ft := &fakeT{}
	outboxtest.RequireEvents(ft, payments, outboxtest.Want{Key: "p-1"})
	outboxtest.RequireEvents(ft, audit, outboxtest.Want{Key: "p-1"}, outboxtest.Want{Key: "kept"})
	ft.passed(t)

	payments.Reset()
	audit.Reset()
	failed := errors.New("failed")
	err = pgx.BeginFunc(ctx, payments, func(tx pgx.Tx) error {
		_ = payments.AddTx(ctx, tx, captured("p-2"))
		_ = audit.AddTx(ctx, tx, entry("p-2"))
		return failed
	})
	if err != failed {
		t.Fatalf("BeginFunc = %v, want the function's error", err)
	}
	outboxtest.RequireNoEvents(ft, payments)
	outboxtest.RequireNoEvents(ft, audit)
	ft.passed(t)

	// Ended transactions refuse more, as pgx's do.
	tx, _ := payments.Begin(ctx)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); !errors.Is(err, pgx.ErrTxClosed) {
		t.Errorf("Rollback after Commit = %v, want pgx.ErrTxClosed", err)
	}
	if err := tx.Commit(ctx); !errors.Is(err, pgx.ErrTxClosed) {
		t.Errorf("Commit after Commit = %v, want pgx.ErrTxClosed", err)
	}
	if err := audit.AddTx(ctx, tx, entry("late")); !errors.Is(err, unitofwork.ErrTxDone) {
		t.Errorf("AddTx after Commit = %v, want ErrTxDone", err)
	}
}

// Do owns its transaction: Commit or Rollback through PgxTx fails, and so
// does Do, recording nothing (a real UnitOfWork's Do fails too then).
func TestRecorderDoOwnsItsTransaction(t *testing.T) {
	ctx := context.Background()
	for _, end := range []func(pgx.Tx) error{
		func(tx pgx.Tx) error { return tx.Commit(ctx) },
		func(tx pgx.Tx) error { return tx.Rollback(ctx) },
	} {
		payments := newRecorder(t, payService)
		var endErr error
		err := payments.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
			if err := tx.Add(ctx, captured("p-1")); err != nil {
				return err
			}
			endErr = end(unitofwork.PgxTx(tx))
			return nil
		})
		if !errors.Is(endErr, outboxtest.ErrDoOwnsTx) || !errors.Is(err, outboxtest.ErrDoOwnsTx) {
			t.Errorf("ending Do's transaction: %v, then Do = %v; want ErrDoOwnsTx from both", endErr, err)
		}
		if n := len(payments.Events()); n != 0 {
			t.Errorf("recorded %d events", n)
		}
	}
}
