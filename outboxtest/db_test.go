package outboxtest_test

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/migrations"
	"github.com/fxoutbox/outbox/outboxtest"
	"github.com/fxoutbox/outbox/unitofwork"
)

func newUOW(t *testing.T, db unitofwork.Beginner, table outbox.Table) *unitofwork.UnitOfWork {
	t.Helper()
	uow, err := unitofwork.New(db, &unitofwork.Config{Service: "payment-service", Table: table})
	if err != nil {
		t.Fatal(err)
	}
	return uow
}

// Events that Do added are in the table once Do has returned, not inside
// its function (Do inserts them just before COMMIT).
func TestRequireInsertedAfterDo(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	table := outboxtest.Table(t, pool)
	uow := newUOW(t, pool, table)
	tp := sdktrace.NewTracerProvider()
	defer func() { _ = tp.Shutdown(context.Background()) }()
	ctx, span := tp.Tracer("test").Start(context.Background(), "handler")
	defer span.End()
	id := uuid.Must(uuid.NewV7())
	first := captured("p-1")
	first.ID = id
	ft := &fakeT{}
	err := uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		if err := tx.Add(ctx, first, captured("p-2")); err != nil {
			return err
		}
		outboxtest.RequireNotInserted(ctx, ft, tx, table, outboxtest.Want{}) // not yet: inserted at commit
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ft.passed(t)

	row := outboxtest.RequireInserted(ctx, ft, pool, table, outboxtest.Want{Type: "payment.captured.v1", Key: "p-1",
		Topic: "payment-service.payment.captured", Payload: map[string]string{"id": "p-1"}})
	ft.passed(t)
	traceparent := "00-" + span.SpanContext().TraceID().String() + "-" + span.SpanContext().SpanID().String() + "-01"
	if row.ID != id || row.Seq == 0 || row.CreatedAt.IsZero() || row.PublishedAt != nil || row.ParkedAt != nil ||
		row.Attempts != 0 || row.LastError != "" || row.Headers["traceparent"] != traceparent {
		t.Fatalf("row = %+v: want the event's id, its trace context, and an unpublished row", row)
	}
	if got := outboxtest.Payload[map[string]string](ft, row.Record); got["id"] != "p-1" {
		t.Fatalf("payload = %v", got)
	}
	rows := outboxtest.RequireManyInserted(ctx, ft, pool, table,
		outboxtest.Want{Type: "payment.captured.v1", Key: "p-1"}, outboxtest.Want{Type: "payment.captured.v1", Key: "p-2"})
	ft.passed(t)
	if len(rows) != 2 || rows[0].Seq >= rows[1].Seq {
		t.Fatalf("RequireManyInserted returned %+v, want both rows in insertion order", rows)
	}

	// Wrong expectations fail.
	outboxtest.RequireInserted(ctx, ft, pool, table, outboxtest.Want{Type: "payment.captured.v1", Key: "p-3"})
	ft.failed(t, "no event matches", "the table "+table.String()+" holds 2", `Key is "p-1", want "p-3"`)
	outboxtest.RequireInserted(ctx, ft, pool, table, outboxtest.Want{Type: "payment.captured.v1"})
	ft.failed(t, "2 events match")
	outboxtest.RequireInserted(ctx, ft, pool, table, outboxtest.Want{Type: "payment.refunded.v1"})
	ft.failed(t, "no event matches", "holds none")
	outboxtest.RequireManyInserted(ctx, ft, pool, table, outboxtest.Want{Type: "payment.captured.v1", Key: "p-2"}, outboxtest.Want{Type: "payment.captured.v1", Key: "p-1"})
	ft.failed(t, `Key is "p-1", want "p-2"`)
	outboxtest.RequireManyInserted(ctx, ft, pool, table, outboxtest.Want{Type: "payment.captured.v1", Key: "p-1"})
	ft.failed(t, "holds 2 events, want 1", "is not expected")
	outboxtest.RequireManyInserted(ctx, ft, pool, table, outboxtest.Want{Key: "p-1"})
	ft.failed(t, "names no Type")
	outboxtest.RequireNotInserted(ctx, ft, pool, table, outboxtest.Want{Key: "p-2"})
	ft.failed(t, "holds 1 events matching", `Key="p-2"`)

	// The other columns are read as stored.
	if _, err := pool.Exec(ctx, "UPDATE "+sqlname.Ident(table)+" SET attempts = 3, last_error = 'rejected', parked_at = now(), published_at = now() WHERE event_id = $1", id); err != nil {
		t.Fatal(err)
	}
	row = outboxtest.RequireInserted(ctx, ft, pool, table, outboxtest.Want{Key: "p-1"})
	ft.passed(t)
	if row.Attempts != 3 || row.LastError != "rejected" || row.ParkedAt == nil || row.PublishedAt == nil {
		t.Fatalf("row = %+v: want the bookkeeping columns", row)
	}
}

// AddTx inserts at once into the caller's transaction: a test sees the rows
// through that transaction, nobody else does, and a rollback leaves none.
func TestRequireInsertedInCallerTx(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	table := outboxtest.Table(t, pool)
	uow := newUOW(t, pool, table)
	ctx := context.Background()
	ptx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ptx.Rollback(ctx) }()
	if err := uow.AddTx(ctx, ptx, captured("p-1")); err != nil {
		t.Fatal(err)
	}
	ft := &fakeT{}
	want := outboxtest.Want{Type: "payment.captured.v1", Key: "p-1"}
	outboxtest.RequireInserted(ctx, ft, ptx, table, want)
	ft.passed(t)
	outboxtest.RequireNotInserted(ctx, ft, pool, table, want)
	ft.passed(t)
	outboxtest.RequireNotInserted(ctx, ft, ptx, table, want)
	ft.failed(t, "holds 1 events matching")
	if err := ptx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	outboxtest.RequireNotInserted(ctx, ft, pool, table, outboxtest.Want{})
	ft.passed(t)
}

func TestInsertedReportsQueryErrors(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	ctx := context.Background()
	ft := &fakeT{}
	missing := outbox.Table{Schema: testenv.Name("none_")}
	outboxtest.RequireInserted(ctx, ft, pool, missing, outboxtest.Want{Type: "x"})
	ft.failed(t, "read the outbox rows of "+missing.String(), "does not exist")
	outboxtest.Inserted(ctx, ft, pool, outbox.Table{Name: `x"; DROP TABLE y; --`})
	ft.failed(t, "Table.Name")
	outboxtest.RequireNotInserted(ctx, ft, pool, missing, outboxtest.Want{})
	ft.failed(t, "does not exist")
	outboxtest.RequireManyInserted(ctx, ft, pool, missing, outboxtest.Want{Type: "x"})
	ft.failed(t, "does not exist")
}

func TestTableIsMigratedAndDropped(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	ctx := context.Background()
	var table outbox.Table
	t.Run("test", func(t *testing.T) {
		table = outboxtest.Table(t, pool)
		if err := migrations.Outbox.Check(ctx, pool, table); err != nil {
			t.Fatal(err)
		}
		versions := outbox.Table{Schema: table.Schema, Name: table.WithDefaults().Name + "_migrations"}
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+sqlname.Ident(versions)).Scan(&n); err != nil || n != 3 {
			t.Fatalf("applied migrations: %d, %v", n, err)
		}
	})
	var exists bool
	if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)", table.Schema).Scan(&exists); err != nil || exists {
		t.Fatalf("schema %s still exists after the test (%v)", table.Schema, err)
	}
}

// The recorder's Tx runs SQL on the database it is given and records the
// events as before.
func TestRecorderDelegatesSQL(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	ctx := context.Background()
	ptx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ptx.Rollback(ctx) }()
	rec := newRecorder(t, &outboxtest.RecorderConfig{UnitOfWork: payService.UnitOfWork, DB: ptx})
	var n int
	err = rec.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		if _, err := tx.Exec(ctx, "CREATE TEMP TABLE payments (id text)"); err != nil {
			return err
		}
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{"payments"}, []string{"id"}, pgx.CopyFromRows([][]any{{"p-1"}, {"p-2"}})); err != nil {
			return err
		}
		br := tx.SendBatch(ctx, &pgx.Batch{QueuedQueries: []*pgx.QueuedQuery{{SQL: "INSERT INTO payments VALUES ('p-3')"}}})
		if err := br.Close(); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, "SELECT id FROM payments")
		if err != nil {
			return err
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil || len(ids) != 3 {
			return errors.Join(err, errors.New("want 3 payments"))
		}
		if err := tx.QueryRow(ctx, "SELECT count(*) FROM payments").Scan(&n); err != nil {
			return err
		}
		return tx.Add(ctx, captured("p-1"))
	})
	if err != nil || n != 3 {
		t.Fatalf("Do = %v, count %d", err, n)
	}
	ft := &fakeT{}
	outboxtest.RequireEvent(ft, rec, outboxtest.Want{Key: "p-1"})
	ft.passed(t)
}

// The recorder accepts and refuses exactly what UnitOfWork.Do does, and
// records what Do stores: same errors, same derived topics, keys and
// headers.
func TestRecorderAgreesWithWriter(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	ctx := context.Background()
	for c, cfg := range []unitofwork.Config{
		{Service: "payment-service"},
		{Service: "payment-service", Topics: outbox.TopicPerAggregate, Limits: outbox.Limits{MaxPayloadBytes: 64, MaxHeaders: 2}},
		{},
	} {
		table := outboxtest.Table(t, pool)
		real := cfg
		real.Table = table
		uow, err := unitofwork.New(pool, &real)
		if err != nil {
			t.Fatal(err)
		}
		rec := newRecorder(t, &outboxtest.RecorderConfig{UnitOfWork: cfg})
		for i, e := range []outbox.Event{
			captured("p-1"),
			{AggregateType: "Payment", AggregateID: "p-2", Type: "PaymentRefunded.v2", Key: "k", Headers: map[string]string{"a": "1"}},
			{AggregateType: "payment", AggregateID: "p-3", Type: "payment.voided.v1", Topic: "voids", Payload: json.RawMessage(`{"b": 1, "a": [1, 2]}`)},
			{AggregateType: "payment", AggregateID: "p-4", Type: "payment.big.v1", Payload: strings.Repeat("x", 100)},
			{AggregateType: "payment", AggregateID: "p-5", Type: "payment.headers.v1", Headers: map[string]string{"a": "1", "b": "2", "c": "3"}},
			{AggregateType: "payment", AggregateID: "p-6", Type: ""},
			{AggregateType: "payment", AggregateID: "p-7\xff", Type: "payment.bad.v1"},
			{AggregateType: "payment", AggregateID: "p-8", Type: "payment.reserved.v1", Headers: map[string]string{"X-Event-Id": "1"}},
			{AggregateType: "payment", AggregateID: "p-9", Type: "payment.topic.v1", Topic: "no spaces"},
			{AggregateType: "payment", AggregateID: "p-10", Type: "payment.raw.v1", Payload: []byte("{")},
		} {
			e.ID = uuid.Must(uuid.NewV7())
			add := func(ctx context.Context, tx unitofwork.Tx) error { return tx.Add(ctx, outbox.Event{}, e) }
			realErr, recErr := uow.Do(ctx, add), rec.Do(ctx, add)
			if (realErr == nil) != (recErr == nil) || (realErr != nil && realErr.Error() != recErr.Error()) {
				t.Errorf("config %d, event %d: Do = %v, recorder = %v", c, i, realErr, recErr)
			}
			// The first event of the call is invalid in every case: neither records anything.
			add = func(ctx context.Context, tx unitofwork.Tx) error { return tx.Add(ctx, e) }
			realErr, recErr = uow.Do(ctx, add), rec.Do(ctx, add)
			if (realErr == nil) != (recErr == nil) || (realErr != nil && realErr.Error() != recErr.Error()) {
				t.Errorf("config %d, event %d: Do = %v, recorder = %v", c, i, realErr, recErr)
			}
		}
		var stored []outboxtest.Record
		for _, r := range outboxtest.Inserted(ctx, t, pool, table) {
			stored = append(stored, r.Record)
		}
		recorded := rec.Events()
		if len(stored) != len(recorded) || len(stored) == 0 {
			t.Fatalf("config %d: Do stored %d events, the recorder %d", c, len(stored), len(recorded))
		}
		for i := range stored {
			s, r := stored[i], recorded[i]
			sp, _ := decode(s.Payload)
			rp, _ := decode(r.Payload)
			s.Payload, r.Payload = nil, nil
			if !reflect.DeepEqual(s, r) || !reflect.DeepEqual(sp, rp) {
				t.Errorf("config %d, event %d:\nstored   %+v %v\nrecorded %+v %v", c, i, s, sp, r, rp)
			}
		}
	}
}

func decode(b []byte) (any, error) {
	var v any
	err := json.Unmarshal(b, &v)
	return v, err
}
