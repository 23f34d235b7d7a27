package outboxtest_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/outboxtest"
	"github.com/fxoutbox/outbox/unitofwork"
)

// Two outbox tables in one transaction, on PostgreSQL: Do on the payments
// unit of work, AddTx on the audit one with PgxTx. Inside the function the
// audit row is visible through the transaction (AddTx inserts at once) and
// the payment's is not yet (Do inserts before COMMIT); after the commit
// both are, each in its table with its own service's topic; a failing
// function leaves neither.
func TestTwoTablesInOneTransaction(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	ctx := context.Background()
	payTable, auditTable := outboxtest.Table(t, pool), outboxtest.Table(t, pool)
	payments := newUOW(t, pool, payTable)
	audit, err := unitofwork.New(pool, &unitofwork.Config{Service: "audit", Table: auditTable, Topics: outbox.TopicPerAggregate})
	if err != nil {
		t.Fatal(err)
	}
	ft := &fakeT{}
	fail := errors.New("declined")
	for _, wantErr := range []error{nil, fail} {
		id := "p-ok"
		if wantErr != nil {
			id = "p-failed"
		}
		err := payments.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
			if err := tx.Add(ctx, captured(id)); err != nil {
				return err
			}
			if err := audit.AddTx(ctx, unitofwork.PgxTx(tx), entry(id)); err != nil {
				return err
			}
			outboxtest.RequireInserted(ctx, ft, unitofwork.PgxTx(tx), auditTable, outboxtest.Want{Key: id, Topic: "audit.entry"})
			outboxtest.RequireNotInserted(ctx, ft, tx, payTable, outboxtest.Want{Key: id})
			outboxtest.RequireNotInserted(ctx, ft, pool, auditTable, outboxtest.Want{Key: id}) // not committed yet
			return wantErr
		})
		if err != wantErr {
			t.Fatalf("Do = %v, want %v", err, wantErr)
		}
		ft.passed(t)
	}
	outboxtest.RequireManyInserted(ctx, ft, pool, payTable, outboxtest.Want{Type: "payment.captured.v1", Key: "p-ok", Topic: "payment-service.payment.captured"})
	outboxtest.RequireManyInserted(ctx, ft, pool, auditTable, outboxtest.Want{Type: "entry.recorded.v1", Key: "p-ok", Topic: "audit.entry"})
	ft.passed(t)
}

// A pool closed before the test's end (defer pool.Close()) cannot drop the
// test schema: the failure says how to close it instead.
func TestTableNeedsTheDatabaseUntilTheEnd(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	own, err := pgxpool.New(context.Background(), pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	ft := &fakeT{}
	table := outboxtest.Table(ft, own)
	own.Close()
	for _, f := range ft.cleanups {
		f()
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{table.Schema}.Sanitize()+" CASCADE")
	})
	if len(ft.errs) != 1 || !contains(ft.errs[0], "closed pool", "t.Cleanup(pool.Close)", "before outboxtest.Table") {
		t.Fatalf("cleanup with a closed pool reported %q, want one error saying to close the pool with t.Cleanup before Table", ft.errs)
	}
}

func contains(s string, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}
