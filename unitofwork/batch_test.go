package unitofwork_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/unitofwork"
)

// roundTrips counts what a connection sends: statements on their own and
// batches (a batch is one round trip however many statements it holds).
type roundTrips struct{ queries, batches atomic.Int64 }

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	r.queries.Add(1)
	return ctx
}
func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.batches.Add(1)
	return ctx
}
func (r *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// tracedSetup is newSetup on a pool of its own whose connections count
// their round trips.
func tracedSetup(t *testing.T, cfg unitofwork.Config) (*setup, *roundTrips) {
	t.Helper()
	s := newSetup(t, nil)
	pc := s.pool.Config()
	tr := &roundTrips{}
	pc.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(s.ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	cfg.Table = s.table
	if s.uow, err = unitofwork.New(pool, &cfg); err != nil {
		t.Fatal(err)
	}
	s.pool = pool
	return s, tr
}

// onlyBegin hides SendBatch: DoBatch must then begin first and send the
// batch inside the transaction.
type onlyBegin struct{ p *pgxpool.Pool }

func (o onlyBegin) Begin(ctx context.Context) (pgx.Tx, error) { return o.p.Begin(ctx) }

func TestDoBatchSendsBeginWithItsStatements(t *testing.T) {
	t.Parallel()
	s, tr := tracedSetup(t, unitofwork.Config{Service: "order-service"})
	queries, batches := tr.queries.Load(), tr.batches.Load()
	var tag pgconn.CommandTag
	b := &pgx.Batch{}
	b.Queue("INSERT INTO "+s.table.Schema+".orders VALUES ($1, 'new') ON CONFLICT DO NOTHING", "o-1").Exec(func(ct pgconn.CommandTag) error {
		tag = ct
		return nil
	})
	called := false
	err := s.uow.DoBatch(s.ctx, b, func(ctx context.Context, tx unitofwork.Tx) error {
		called = true
		if tag.RowsAffected() != 1 {
			t.Errorf("the batched INSERT's result was not read before fn: %q", tag)
		}
		if q, bs := tr.queries.Load()-queries, tr.batches.Load()-batches; q != 0 || bs != 1 {
			t.Errorf("before fn: %d statements and %d batches sent; want BEGIN and the INSERT in one batch, nothing else", q, bs)
		}
		var status string
		if err := tx.QueryRow(ctx, "SELECT status FROM "+s.table.Schema+".orders WHERE id = 'o-1'").Scan(&status); err != nil {
			t.Errorf("the batched row is not visible in fn's transaction: %v", err)
		}
		return tx.Add(ctx, created("o-1"))
	})
	if err != nil || !called {
		t.Fatalf("DoBatch = %v (fn called: %v)", err, called)
	}
	// Three round trips in all: BEGIN with the INSERT; fn's SELECT; the
	// outbox INSERT; COMMIT.
	if q, bs := tr.queries.Load()-queries, tr.batches.Load()-batches; q != 3 || bs != 1 {
		t.Errorf("DoBatch sent %d statements and %d batches; want 3 and 1", q, bs)
	}
	if n := s.count(t, s.table.Schema+".orders"); n != 1 {
		t.Errorf("%d orders committed, want 1", n)
	}
	if n := s.count(t, sqlname.Ident(s.table)); n != 1 {
		t.Errorf("%d events committed, want 1", n)
	}
}

func TestDoBatchFailureRollsBackWithoutCallingFn(t *testing.T) {
	t.Parallel()
	s := newSetup(t, nil)
	if _, err := s.pool.Exec(s.ctx, "INSERT INTO "+s.table.Schema+".orders VALUES ('taken', 'new')"); err != nil {
		t.Fatal(err)
	}
	errStop := errors.New("the callback says stop")
	cases := []struct {
		name  string
		queue func(b *pgx.Batch)
		want  func(error) bool
	}{
		{"failing statement", func(b *pgx.Batch) {
			b.Queue("INSERT INTO " + s.table.Schema + ".orders VALUES ('o-2', 'new')")
			b.Queue("INSERT INTO " + s.table.Schema + ".orders VALUES ('taken', 'new')")
		}, func(err error) bool {
			var pe *pgconn.PgError
			return errors.As(err, &pe) && pe.Code == "23505"
		}},
		{"callback error", func(b *pgx.Batch) {
			b.Queue("INSERT INTO " + s.table.Schema + ".orders VALUES ('o-2', 'new')").Exec(func(pgconn.CommandTag) error { return errStop })
		}, func(err error) bool { return errors.Is(err, errStop) }},
	}
	// A pool of its own: if a failed batch kept its connection (and its
	// aborted transaction's locks), closing the pool and dropping the
	// schema would wait forever; the test ends its sessions instead.
	pc := s.pool.Config()
	app := testenv.Name("dobatch_")
	pc.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(s.ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if pool.Stat().AcquiredConns() == 0 {
			pool.Close()
			return
		}
		_, _ = s.pool.Exec(s.ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1", app)
	}()
	for _, db := range []struct {
		name string
		db   unitofwork.Beginner
	}{{"pool", pool}, {"no SendBatch", onlyBegin{pool}}} {
		uow, err := unitofwork.New(db.db, &unitofwork.Config{Table: s.table})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cases {
			b := &pgx.Batch{}
			c.queue(b)
			called := false
			// A bound, so that a transaction left open by an earlier case
			// (holding 'o-2') fails the test instead of blocking it.
			ctx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
			err := uow.DoBatch(ctx, b, func(context.Context, unitofwork.Tx) error { called = true; return nil })
			cancel()
			if !c.want(err) || called {
				t.Errorf("%s, %s: DoBatch = %v, fn called %v; want the batch's error and fn not called", db.name, c.name, err, called)
			}
			if n := pool.Stat().AcquiredConns(); n != 0 {
				t.Errorf("%s, %s: %d connections still acquired after the failed batch", db.name, c.name, n)
			}
		}
	}
	if n := s.count(t, s.table.Schema+".orders"); n != 1 {
		t.Errorf("%d orders, want only the one inserted before: a failed batch committed", n)
	}
}

func TestDoBatchBeginsWithTheConfiguredTxOptions(t *testing.T) {
	t.Parallel()
	s := newSetup(t, nil)
	uow, err := unitofwork.New(s.pool, &unitofwork.Config{Table: s.table, TxOptions: pgx.TxOptions{AccessMode: pgx.ReadOnly}})
	if err != nil {
		t.Fatal(err)
	}
	b := &pgx.Batch{}
	b.Queue("INSERT INTO " + s.table.Schema + ".orders VALUES ('o-3', 'new')")
	err = uow.DoBatch(s.ctx, b, func(context.Context, unitofwork.Tx) error { return nil })
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "25006" {
		t.Fatalf("DoBatch in a read-only unit of work = %v; want 25006 (read-only transaction): TxOptions not used", err)
	}
}

func TestDoBatchWithoutSendBatchRunsTheSameStatements(t *testing.T) {
	t.Parallel()
	s := newSetup(t, nil)
	uow, err := unitofwork.New(onlyBegin{s.pool}, &unitofwork.Config{Service: "order-service", Table: s.table})
	if err != nil {
		t.Fatal(err)
	}
	var tag pgconn.CommandTag
	b := &pgx.Batch{}
	b.Queue("INSERT INTO " + s.table.Schema + ".orders VALUES ('o-4', 'new')").Exec(func(ct pgconn.CommandTag) error { tag = ct; return nil })
	err = uow.DoBatch(s.ctx, b, func(ctx context.Context, tx unitofwork.Tx) error {
		if tag.RowsAffected() != 1 {
			t.Errorf("the batched INSERT's result was not read before fn: %q", tag)
		}
		return tx.Add(ctx, created("o-4"))
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := s.count(t, s.table.Schema+".orders"); n != 1 {
		t.Errorf("%d orders committed, want 1", n)
	}
	if n := s.count(t, sqlname.Ident(s.table)); n != 1 {
		t.Errorf("%d events committed, want 1", n)
	}
}
