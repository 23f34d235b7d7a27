package outboxtest_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox/outboxtest"
	"github.com/fxoutbox/outbox/unitofwork"
)

// A RecordingDB answers each statement from its rules, in order, and
// records it; without a rule Exec affects nothing, Query has no rows and
// QueryRow is pgx.ErrNoRows.
func TestRecordingDBAnswers(t *testing.T) {
	ctx := context.Background()
	db := (&outboxtest.RecordingDB{}).
		On("UPDATE stock", outboxtest.SQLResult{RowsAffected: 2}).
		On("insert into   shipments", outboxtest.SQLResult{Err: errors.New("duplicate key")}).
		On("SELECT id, carrier, weight FROM shipments", outboxtest.SQLResult{Columns: []string{"id", "carrier", "weight"},
			Rows: [][]any{{"s-1", "dhl", 3}, {"s-2", nil, int64(5)}}}).
		On("SELECT status", outboxtest.SQLResult{Columns: []string{"status"}, Rows: [][]any{{"paid"}}})

	tag, err := db.Exec(ctx, "UPDATE stock SET n = n - 1 WHERE sku = $1", "sku-1")
	if err != nil || tag.String() != "UPDATE 2" || tag.RowsAffected() != 2 {
		t.Errorf("Exec UPDATE = %q, %v; want UPDATE 2", tag, err)
	}
	if tag, err := db.Exec(ctx, "INSERT INTO audit VALUES ($1)", 1); err != nil || tag.String() != "INSERT 0 0" {
		t.Errorf("Exec without a rule = %q, %v; want INSERT 0 0", tag, err)
	}
	if _, err := db.Exec(ctx, "INSERT INTO\n\tshipments (id) VALUES ($1)", "s-1"); err == nil || err.Error() != "duplicate key" {
		t.Errorf("Exec with an error rule = %v, want it", err)
	}
	type shipment struct {
		ID      string
		Carrier *string
		Weight  int64
	}
	rows, err := db.Query(ctx, "SELECT id, carrier, weight FROM shipments WHERE order_id = $1", "o-1")
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByName[shipment])
	if err != nil || len(got) != 2 || got[0].ID != "s-1" || *got[0].Carrier != "dhl" || got[0].Weight != 3 || got[1].Carrier != nil || got[1].Weight != 5 {
		t.Errorf("CollectRows = %+v, %v", got, err)
	}
	var status string
	if err := db.QueryRow(ctx, "SELECT status FROM orders WHERE id = $1", "o-1").Scan(&status); err != nil || status != "paid" {
		t.Errorf("QueryRow = %q, %v; want paid", status, err)
	}
	var n int
	if err := db.QueryRow(ctx, "SELECT count(*) FROM returns").Scan(&n); !errors.Is(err, pgx.ErrNoRows) {
		t.Errorf("QueryRow without a rule = %v, want pgx.ErrNoRows", err)
	}
	if err := db.QueryRow(ctx, "SELECT status FROM orders").Scan(&n); err == nil || !strings.Contains(err.Error(), "cannot scan string") {
		t.Errorf("Scan of a string into an int = %v, want an error", err)
	}
	if err := db.QueryRow(ctx, "SELECT id, carrier, weight FROM shipments").Scan(new(string)); err == nil {
		t.Error("Scan into too few destinations succeeded")
	}
	if n, err := db.CopyFrom(ctx, pgx.Identifier{"parcels"}, []string{"id"}, pgx.CopyFromRows([][]any{{"p-1"}, {"p-2"}})); err != nil || n != 2 {
		t.Errorf("CopyFrom = %d, %v", n, err)
	}
	br := db.SendBatch(ctx, &pgx.Batch{QueuedQueries: []*pgx.QueuedQuery{{SQL: "UPDATE stock SET n = 0"}, {SQL: "SELECT status FROM orders"}}})
	if tag, err := br.Exec(); err != nil || tag.RowsAffected() != 2 {
		t.Errorf("batch Exec = %q, %v", tag, err)
	}
	if err := br.QueryRow().Scan(&status); err != nil || status != "paid" {
		t.Errorf("batch QueryRow = %q, %v", status, err)
	}
	_ = br.Close()

	calls := db.Calls()
	if len(calls) != 11 {
		t.Fatalf("recorded %d calls, want 11: %v", len(calls), calls)
	}
	if c := calls[8]; c.Method != "CopyFrom" || c.SQL != `COPY "parcels" ("id") FROM STDIN` || len(c.Args) != 2 {
		t.Errorf("CopyFrom recorded as %+v", c)
	}
	if c := calls[0]; c.Method != "Exec" || len(c.Args) != 1 || c.Args[0] != "sku-1" || c.RolledBack {
		t.Errorf("first call recorded as %+v", c)
	}
	db.Reset()
	if len(db.Calls()) != 0 {
		t.Error("Reset kept calls")
	}
}

func TestRecordingDBStrict(t *testing.T) {
	db := &outboxtest.RecordingDB{Strict: true}
	db.On("SELECT 1", outboxtest.SQLResult{})
	if _, err := db.Exec(context.Background(), "DELETE FROM shipments"); !errors.Is(err, outboxtest.ErrUnexpectedSQL) || !strings.Contains(err.Error(), "DELETE FROM shipments") {
		t.Errorf("Exec without a rule on a strict RecordingDB = %v, want ErrUnexpectedSQL naming the statement", err)
	}
	if _, err := db.Exec(context.Background(), "SELECT 1"); err != nil {
		t.Errorf("Exec with a rule = %v", err)
	}
}

// A Recorder's Do on a RecordingDB is a transaction there: a failed Do's
// statements are rolled back (recorded, marked), a successful one's kept;
// a savepoint of the code's own rolls back alone; a panic rolls back.
func TestRecorderRollsBackRecordingDB(t *testing.T) {
	ctx := context.Background()
	db := &outboxtest.RecordingDB{}
	rec := newRecorder(t, &outboxtest.RecorderConfig{UnitOfWork: payService.UnitOfWork, DB: db})
	insert := func(ctx context.Context, tx unitofwork.Tx, id string) error {
		_, err := tx.Exec(ctx, "INSERT INTO payments (id) VALUES ($1)", id)
		return err
	}
	if err := rec.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		if err := insert(ctx, tx, "p-1"); err != nil {
			return err
		}
		// A savepoint of the handler's own, rolled back: only its
		// statement goes.
		sp, err := unitofwork.PgxTx(tx).Begin(ctx)
		if err != nil {
			return err
		}
		if err := insert(ctx, sp.(unitofwork.Tx), "p-sp"); err != nil {
			return err
		}
		if err := sp.Rollback(ctx); err != nil {
			return err
		}
		return tx.Add(ctx, captured("p-1"))
	}); err != nil {
		t.Fatal(err)
	}
	declined := errors.New("declined")
	if err := rec.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		if err := insert(ctx, tx, "p-2"); err != nil {
			return err
		}
		return declined
	}); !errors.Is(err, declined) {
		t.Fatalf("Do = %v, want the function's error", err)
	}
	func() {
		defer func() { _ = recover() }()
		_ = rec.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
			_ = insert(ctx, tx, "p-3")
			panic("boom")
		})
	}()
	// Code with a transaction of its own: Begin, Rollback.
	own, err := rec.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := own.Exec(ctx, "INSERT INTO payments (id) VALUES ($1)", "p-4"); err != nil {
		t.Fatal(err)
	}
	_ = own.Rollback(ctx)

	ft := &fakeT{}
	outboxtest.RequireSQL(ft, db, outboxtest.WantSQL{SQL: "insert into payments", Args: []any{"p-1"}})
	for _, id := range []string{"p-sp", "p-2", "p-3", "p-4"} {
		outboxtest.RequireNoSQL(ft, db, outboxtest.WantSQL{SQL: "INSERT INTO payments", Args: []any{id}})
		outboxtest.RequireRolledBack(ft, db, outboxtest.WantSQL{SQL: "INSERT INTO payments", Args: []any{id}})
	}
	outboxtest.RequireEvents(ft, rec, outboxtest.Want{Key: "p-1"})
	ft.passed(t)

	// The failures say what was looked for and list what ran.
	outboxtest.RequireSQL(ft, db, outboxtest.WantSQL{SQL: "INSERT INTO payments", Args: []any{"p-2"}})
	ft.failed(t, `want one statement containing "INSERT INTO payments" with args [p-2] (not rolled back), found 0`,
		"the RecordingDB ran 5:", "1. Exec INSERT INTO payments (id) VALUES ($1) [p-1]", "[p-2] (rolled back)")
	outboxtest.RequireNoSQL(ft, db, outboxtest.WantSQL{SQL: "INSERT INTO payments"})
	ft.failed(t, "want no statement", "found Exec INSERT INTO payments (id) VALUES ($1) [p-1]")
	outboxtest.RequireRolledBack(ft, db, outboxtest.WantSQL{SQL: "INSERT INTO payments", Args: []any{"p-1"}})
	ft.failed(t, "want one rolled-back statement")
}

// Arguments compare by value across number types, so a test need not
// spell the handler's int64.
func TestWantSQLArgs(t *testing.T) {
	db := &outboxtest.RecordingDB{}
	_, _ = db.Exec(context.Background(), "UPDATE payments SET cents = $1 WHERE id = $2", int64(1250), "p-1")
	ft := &fakeT{}
	outboxtest.RequireSQL(ft, db, outboxtest.WantSQL{SQL: "UPDATE payments", Args: []any{1250, "p-1"}})
	outboxtest.RequireSQL(ft, db, outboxtest.WantSQL{SQL: "UPDATE payments"})
	ft.passed(t)
	outboxtest.RequireSQL(ft, db, outboxtest.WantSQL{Args: []any{1251, "p-1"}})
	ft.failed(t, "found 0")
}

// Without a DB the recorder's refusal points to the RecordingDB.
func TestErrNoDBPointsToRecordingDB(t *testing.T) {
	if !strings.Contains(outboxtest.ErrNoDB.Error(), "outboxtest.RecordingDB") {
		t.Errorf("ErrNoDB = %q, want it to suggest outboxtest.RecordingDB", outboxtest.ErrNoDB)
	}
}
