package unitofwork_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/unitofwork"
)

type setup struct {
	pool  *pgxpool.Pool
	table outbox.Table
	uow   *unitofwork.UnitOfWork
	ctx   context.Context
}

func newSetup(t *testing.T, cfg *unitofwork.Config) *setup {
	t.Helper()
	pool := testenv.Pool(t)
	tbl := testenv.Table(t, pool)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "CREATE TABLE "+tbl.Schema+".orders (id text PRIMARY KEY, status text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	c := unitofwork.Config{Service: "order-service"}
	if cfg != nil {
		c = *cfg
	}
	c.Table = tbl
	uow, err := unitofwork.New(pool, &c)
	if err != nil {
		t.Fatal(err)
	}
	return &setup{pool: pool, table: tbl, uow: uow, ctx: ctx}
}

func (s *setup) count(t *testing.T, from string) int {
	t.Helper()
	var n int
	if err := s.pool.QueryRow(s.ctx, "SELECT count(*) FROM "+from).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func created(id string) outbox.Event {
	return outbox.Event{AggregateType: "order", AggregateID: id, Type: "order.created.v1", Payload: map[string]any{"id": id, "total": 12.5}}
}

func TestDoCommitsBusinessRowAndEvents(t *testing.T) {
	t.Parallel()
	s := newSetup(t, nil)
	err := s.uow.Do(s.ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO "+s.table.Schema+".orders VALUES ('o-1', 'new')"); err != nil {
			return err
		}
		e := created("o-1")
		e.Headers = map[string]string{"tenant": "acme"}
		return tx.Add(ctx, e, outbox.Event{AggregateType: "order", AggregateID: "o-1", Type: "order.noted.v1", Key: "custom-key", Topic: "explicit.topic"})
	})
	if err != nil {
		t.Fatal(err)
	}
	rows, _ := s.pool.Query(s.ctx, "SELECT event_type, topic, partition_key, payload, coalesce(headers, '{}'), published_at IS NULL FROM "+sqlname.Ident(s.table)+" ORDER BY id")
	type rec struct {
		typ, topic, key string
		payload         map[string]any
		headers         map[string]string
		unpublished     bool
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (rec, error) {
		var x rec
		return x, r.Scan(&x.typ, &x.topic, &x.key, &x.payload, &x.headers, &x.unpublished)
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("got %d outbox rows, want 2", len(got))
	}
	if g := got[0]; g.typ != "order.created.v1" || g.topic != "order-service.order.created" || g.key != "o-1" ||
		g.payload["total"] != 12.5 || g.headers["tenant"] != "acme" || !g.unpublished {
		t.Errorf("first row = %+v", g)
	}
	if g := got[1]; g.topic != "explicit.topic" || g.key != "custom-key" {
		t.Errorf("second row = %+v", g)
	}
	if n := s.count(t, s.table.Schema+".orders"); n != 1 {
		t.Errorf("orders = %d, want 1", n)
	}
}

func TestErrorRollsBackEverything(t *testing.T) {
	t.Parallel()
	s := newSetup(t, nil)
	boom := errors.New("business rule violated")
	err := s.uow.Do(s.ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO "+s.table.Schema+".orders VALUES ('o-1', 'new')"); err != nil {
			return err
		}
		if err := tx.Add(ctx, created("o-1")); err != nil {
			return err
		}
		return boom
	})
	if err != boom {
		t.Fatalf("Do returned %v, want the function's error unchanged", err)
	}
	if n := s.count(t, sqlname.Ident(s.table)); n != 0 {
		t.Errorf("%d outbox rows after rollback, want 0", n)
	}
	if n := s.count(t, s.table.Schema+".orders"); n != 0 {
		t.Errorf("%d orders after rollback, want 0", n)
	}
}

// When the outbox INSERT or the COMMIT fails, nothing of the transaction
// stays and OnCommit is not called.
func TestFailedInsertOrCommitKeepsNothing(t *testing.T) {
	t.Parallel()
	var commits atomic.Int64
	s := newSetup(t, &unitofwork.Config{Service: "order-service", OnCommit: func(int) { commits.Add(1) }})
	// A deferred unique constraint fails at COMMIT; a CHECK on the outbox
	// table fails the outbox INSERT.
	if _, err := s.pool.Exec(s.ctx, "CREATE TABLE "+s.table.Schema+".ledger (n int UNIQUE DEFERRABLE INITIALLY DEFERRED);"+
		" INSERT INTO "+s.table.Schema+".ledger VALUES (1);"+
		" ALTER TABLE "+sqlname.Ident(s.table)+" ADD CONSTRAINT no_rejects CHECK (aggregate_id <> 'reject')"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, orderID, ledger, wantErr string
	}{
		{"commit", "o-1", "INSERT INTO " + s.table.Schema + ".ledger VALUES (1)", "commit"},
		{"insert", "reject", "SELECT 1", "insert 1 outbox events"},
	} {
		err := s.uow.Do(s.ctx, func(ctx context.Context, tx unitofwork.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO "+s.table.Schema+".orders VALUES ($1, 'new')", tc.orderID); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, tc.ledger); err != nil {
				return err
			}
			return tx.Add(ctx, created(tc.orderID))
		})
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%s: Do = %v, want the database's error wrapped with %q", tc.name, err, tc.wantErr)
		}
	}
	if n := s.count(t, sqlname.Ident(s.table)); n != 0 {
		t.Errorf("%d outbox rows after failed transactions, want 0", n)
	}
	if n := s.count(t, s.table.Schema+".orders"); n != 0 {
		t.Errorf("%d orders after failed transactions, want 0", n)
	}
	if n := commits.Load(); n != 0 {
		t.Errorf("OnCommit called %d times for failed transactions", n)
	}
}

func TestPanicRollsBackAndRepanics(t *testing.T) {
	t.Parallel()
	s := newSetup(t, nil)
	func() {
		defer func() {
			if r := recover(); r != "handler bug" {
				t.Errorf("recovered %v, want the handler's panic value", r)
			}
		}()
		_ = s.uow.Do(s.ctx, func(ctx context.Context, tx unitofwork.Tx) error {
			_, _ = tx.Exec(ctx, "INSERT INTO "+s.table.Schema+".orders VALUES ('o-1', 'new')")
			_ = tx.Add(ctx, created("o-1"))
			panic("handler bug")
		})
	}()
	if n := s.count(t, sqlname.Ident(s.table)); n != 0 {
		t.Errorf("%d outbox rows after panic, want 0", n)
	}
	if n := s.count(t, s.table.Schema+".orders"); n != 0 {
		t.Errorf("%d orders after panic, want 0", n)
	}
	// The pool is healthy afterwards: the connection was released.
	if err := s.uow.Do(s.ctx, func(ctx context.Context, tx unitofwork.Tx) error { return tx.Add(ctx, created("o-2")) }); err != nil {
		t.Fatal(err)
	}
}

func TestInvalidEventFailsAddAndRecordsNothing(t *testing.T) {
	t.Parallel()
	s := newSetup(t, nil)
	bad := created("o-1")
	bad.AggregateID = ""
	var addErr error
	err := s.uow.Do(s.ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		addErr = tx.Add(ctx, created("o-0"), bad)
		return nil // the handler ignores the error: the valid event of that call must not be recorded either
	})
	if err != nil {
		t.Fatal(err)
	}
	var ee *outbox.EventError
	if !errors.As(addErr, &ee) || ee.Index != 1 || ee.Field != "AggregateID" || !errors.Is(addErr, outbox.ErrInvalidEvent) {
		t.Fatalf("Add error = %v, want an EventError for event 1, AggregateID", addErr)
	}
	if n := s.count(t, sqlname.Ident(s.table)); n != 0 {
		t.Errorf("%d outbox rows, want 0", n)
	}
}

func TestAddAfterDoReturnsFails(t *testing.T) {
	t.Parallel()
	s := newSetup(t, nil)
	var leaked unitofwork.Tx
	_ = s.uow.Do(s.ctx, func(ctx context.Context, tx unitofwork.Tx) error { leaked = tx; return nil })
	if err := leaked.Add(s.ctx, created("o-1")); !errors.Is(err, unitofwork.ErrTxDone) {
		t.Errorf("Add after Do = %v, want ErrTxDone", err)
	}
}

// countingTracer counts statements sent on a connection.
type countingTracer struct{ n atomic.Int64 }

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func TestAllEventsCostOneStatement(t *testing.T) {
	t.Parallel()
	base := testenv.Pool(t)
	tbl := testenv.Table(t, base)
	cfg := base.Config()
	tr := &countingTracer{}
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	uow, err := unitofwork.New(pool, &unitofwork.Config{Service: "order-service", Table: tbl})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	statements := func(events int) int64 {
		before := tr.n.Load()
		err := uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
			if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
				return err
			}
			for i := range events {
				if err := tx.Add(ctx, created("o-"+strings.Repeat("x", i))); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return tr.n.Load() - before
	}
	none, one, many := statements(0), statements(1), statements(25)
	if one != none+1 || many != none+1 {
		t.Errorf("statements per Do: 0 events %d, 1 event %d, 25 events %d; want events to add exactly one", none, one, many)
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+sqlname.Ident(tbl)).Scan(&n); err != nil || n != 26 {
		t.Errorf("rows = %d, %v; want 26", n, err)
	}
	// The multi-row insert keeps the order of Add calls in id order.
	rows, _ := pool.Query(ctx, "SELECT aggregate_id FROM "+sqlname.Ident(tbl)+" ORDER BY id")
	ids, _ := pgx.CollectRows(rows, pgx.RowTo[string])
	for i, id := range ids[1:] {
		if want := "o-" + strings.Repeat("x", i); id != want {
			t.Fatalf("row %d has aggregate %q, want %q: rows out of Add order", i+1, id, want)
		}
	}
}

func TestTraceContextIsStored(t *testing.T) {
	t.Parallel()
	s := newSetup(t, &unitofwork.Config{Service: "order-service", Propagator: propagation.TraceContext{}})
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ctx := trace.ContextWithSpanContext(s.ctx, trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled}))
	if err := s.uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error { return tx.Add(ctx, created("o-1")) }); err != nil {
		t.Fatal(err)
	}
	var h map[string]string
	if err := s.pool.QueryRow(s.ctx, "SELECT headers FROM "+sqlname.Ident(s.table)).Scan(&h); err != nil {
		t.Fatal(err)
	}
	if want := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"; h["traceparent"] != want {
		t.Errorf("stored traceparent = %q, want %q", h["traceparent"], want)
	}
}

func TestAddTxInCallersTransaction(t *testing.T) {
	t.Parallel()
	s := newSetup(t, nil)
	err := pgx.BeginFunc(s.ctx, s.pool, func(tx pgx.Tx) error {
		return s.uow.AddTx(s.ctx, tx, created("o-1"), created("o-2"))
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := s.count(t, sqlname.Ident(s.table)); n != 2 {
		t.Errorf("rows = %d, want 2", n)
	}
	// Rolled back by the caller: nothing.
	_ = pgx.BeginFunc(s.ctx, s.pool, func(tx pgx.Tx) error {
		if err := s.uow.AddTx(s.ctx, tx, created("o-3")); err != nil {
			return err
		}
		return errors.New("caller rolls back")
	})
	if n := s.count(t, sqlname.Ident(s.table)); n != 2 {
		t.Errorf("rows after rollback = %d, want 2", n)
	}
}

func TestOnCommitHook(t *testing.T) {
	t.Parallel()
	var calls, events atomic.Int64
	s := newSetup(t, &unitofwork.Config{Service: "svc", OnCommit: func(n int) { calls.Add(1); events.Add(int64(n)) }})
	_ = s.uow.Do(s.ctx, func(ctx context.Context, tx unitofwork.Tx) error { return tx.Add(ctx, created("a"), created("b")) })
	_ = s.uow.Do(s.ctx, func(ctx context.Context, tx unitofwork.Tx) error { return nil }) // no events: no call
	_ = s.uow.Do(s.ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		_ = tx.Add(ctx, created("c"))
		return errors.New("x")
	}) // rolled back: no call
	if calls.Load() != 1 || events.Load() != 2 {
		t.Errorf("OnCommit calls=%d events=%d, want 1 and 2", calls.Load(), events.Load())
	}
}

func TestConfigErrors(t *testing.T) {
	pool := &pgxpool.Pool{}
	for _, c := range []*unitofwork.Config{
		{Table: outbox.Table{Name: "bad name"}},
		{Service: "has space"},
		{Limits: outbox.Limits{MaxPayloadBytes: -1}},
	} {
		if _, err := unitofwork.New(pool, c); !errors.Is(err, outbox.ErrInvalidConfig) {
			t.Errorf("New(%+v) = %v, want ErrInvalidConfig", c, err)
		}
	}
	if _, err := unitofwork.New(nil, nil); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Errorf("New(nil) = %v", err)
	}
}

// AddTx in a transaction the caller commits runs OnCommit after that commit
// (the commit watcher), never before it and never for a rollback.
func TestAddTxRunsOnCommitAfterCallersCommit(t *testing.T) {
	t.Parallel()
	commits := make(chan int, 10)
	s := newSetup(t, &unitofwork.Config{Service: "svc", OnCommit: func(n int) { commits <- n }})
	t.Cleanup(s.uow.Close)
	tx, err := s.pool.Begin(s.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.uow.AddTx(s.ctx, tx, created("o-1"), created("o-2")); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-commits:
		t.Fatalf("OnCommit(%d) before the caller committed", n)
	case <-time.After(300 * time.Millisecond): // the watcher checked many times meanwhile
	}
	if err := tx.Commit(s.ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-commits:
		if n != 2 {
			t.Errorf("OnCommit(%d), want 2", n)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("OnCommit not called after the caller's commit")
	}
	// Rolled back: no call.
	_ = pgx.BeginFunc(s.ctx, s.pool, func(tx pgx.Tx) error {
		if err := s.uow.AddTx(s.ctx, tx, created("o-3")); err != nil {
			return err
		}
		return errors.New("caller rolls back")
	})
	select {
	case n := <-commits:
		t.Errorf("OnCommit(%d) after a rollback", n)
	case <-time.After(300 * time.Millisecond):
	}
}

// One Do writes to two outbox tables: the second through the other unit of
// work's AddTx on PgxTx(tx). Both commit together, both roll back together,
// and each unit of work's OnCommit runs after the commit.
func TestPgxTxWritesASecondTableInTheSameTransaction(t *testing.T) {
	t.Parallel()
	var firstCalls, secondEvents atomic.Int64
	s := newSetup(t, &unitofwork.Config{Service: "svc", OnCommit: func(int) { firstCalls.Add(1) }})
	audit := testenv.Table(t, s.pool)
	second, err := unitofwork.New(s.pool, &unitofwork.Config{Service: "audit", Table: audit,
		OnCommit: func(n int) { secondEvents.Add(int64(n)) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(second.Close)
	err = s.uow.Do(s.ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		if err := tx.Add(ctx, created("o-1")); err != nil {
			return err
		}
		if err := second.AddTx(ctx, unitofwork.PgxTx(tx), created("a-1"), created("a-2")); err != nil {
			return err
		}
		if secondEvents.Load() != 0 {
			t.Error("second OnCommit ran before the commit")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if a, b := s.count(t, sqlname.Ident(s.table)), s.count(t, sqlname.Ident(audit)); a != 1 || b != 2 {
		t.Errorf("rows = %d and %d, want 1 and 2", a, b)
	}
	if firstCalls.Load() != 1 || secondEvents.Load() != 2 {
		t.Errorf("OnCommit: first %d calls, second %d events; want 1 and 2", firstCalls.Load(), secondEvents.Load())
	}
	err = s.uow.Do(s.ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		_ = tx.Add(ctx, created("o-2"))
		_ = second.AddTx(ctx, unitofwork.PgxTx(tx), created("a-3"))
		return errors.New("handler fails")
	})
	if err == nil {
		t.Fatal("Do succeeded")
	}
	if a, b := s.count(t, sqlname.Ident(s.table)), s.count(t, sqlname.Ident(audit)); a != 1 || b != 2 {
		t.Errorf("rows after rollback = %d and %d, want 1 and 2", a, b)
	}
	if secondEvents.Load() != 2 {
		t.Errorf("second OnCommit after rollback: %d events", secondEvents.Load())
	}
	var late unitofwork.Tx
	_ = s.uow.Do(s.ctx, func(ctx context.Context, tx unitofwork.Tx) error { late = tx; return nil })
	if err := second.AddTx(s.ctx, unitofwork.PgxTx(late), created("a-4")); !errors.Is(err, unitofwork.ErrTxDone) {
		t.Errorf("AddTx after Do returned = %v, want ErrTxDone", err)
	}
}

// PgxTx gives the pgx.Tx of a Tx that is one (a test double's transaction,
// such as outboxtest's recorder's), and nil for a Tx that is not.
func TestPgxTxOfATestDouble(t *testing.T) {
	double := &pgxTxDouble{}
	if got := unitofwork.PgxTx(double); got != double {
		t.Errorf("PgxTx(a Tx that is a pgx.Tx) = %v, want it as it is", got)
	}
	if got := unitofwork.PgxTx(txOnly{}); got != nil {
		t.Errorf("PgxTx(a Tx that is no pgx.Tx) = %v, want nil", got)
	}
}

type pgxTxDouble struct{ pgx.Tx }

func (*pgxTxDouble) Add(context.Context, ...outbox.Event) error { return nil }

type txOnly struct{ unitofwork.Tx }
