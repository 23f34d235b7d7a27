package outboxtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/unitofwork"
)

// T is the part of *testing.T (and testing.TB) the assertions use.
type T interface {
	Helper()
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
}

// DBTX runs SQL: a pgx.Tx, a *pgxpool.Pool, a *pgx.Conn or a mock.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// ErrNoDB is returned by the SQL methods of a Recorder's Tx when the
// recorder has no database to delegate them to.
var ErrNoDB = errors.New("the recorder has no database: set RecorderConfig.DB (a pgx.Tx, a pool or a mock such as pgxmock), " +
	"or move the SQL behind an interface the test fakes")

// RecorderConfig configures a Recorder.
type RecorderConfig struct {
	// UnitOfWork is the configuration the handler's UnitOfWork has in
	// production: Service, Topics, Limits and Propagator name and validate
	// events exactly as there. Table, TxOptions and OnCommit are not used.
	// Default: the zero Config (events must name their Topic).
	UnitOfWork unitofwork.Config
	// DB runs the SQL methods of the recorder's Tx. The recorder never
	// begins, commits or rolls back anything on it: pass a pgx.Tx the test
	// rolls back, or a mock. Default: nil, and those methods return ErrNoDB.
	DB DBTX
}

// Recorder is a [unitofwork.Doer] for unit tests: it records the events of
// the transactions that succeed instead of writing them. It is safe for
// concurrent use.
type Recorder struct {
	uow *unitofwork.UnitOfWork // prepares events; never begins a transaction
	db  DBTX

	mu     sync.Mutex
	events []outbox.Record
}

var _ unitofwork.Doer = (*Recorder)(nil)

// NewRecorder returns an empty Recorder. A nil cfg means the defaults; an
// invalid configuration fails the test, with the error New would return.
func NewRecorder(t T, cfg *RecorderConfig) *Recorder {
	t.Helper()
	var c RecorderConfig
	if cfg != nil {
		c = *cfg
	}
	uc := c.UnitOfWork
	uc.TxOptions, uc.OnCommit = pgx.TxOptions{}, nil
	uow, err := unitofwork.New(noBegin{}, &uc)
	if err != nil {
		t.Fatalf("outboxtest: NewRecorder: %v", err)
		return nil
	}
	return &Recorder{uow: uow, db: c.DB}
}

// Do runs fn with a Tx that records the events fn adds. When fn returns nil
// they are appended to the recorder's events; when fn returns an error, Do
// returns it unchanged and records nothing; when fn panics, Do records
// nothing and panics again.
func (r *Recorder) Do(ctx context.Context, fn func(ctx context.Context, tx unitofwork.Tx) error) error {
	tx := &recTx{r: r}
	defer tx.finish() // also on a panic: a late Add fails with ErrTxDone
	if err := fn(ctx, tx); err != nil {
		return err
	}
	pending := tx.finish()
	r.mu.Lock()
	r.events = append(r.events, pending...)
	r.mu.Unlock()
	return nil
}

// Events returns the events of the transactions that succeeded, in the order
// they were added, with their defaults applied (event id, topic, key, trace
// context headers) as the writer would store them.
func (r *Recorder) Events() []outbox.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// Reset forgets the recorded events.
func (r *Recorder) Reset() {
	r.mu.Lock()
	r.events = nil
	r.mu.Unlock()
}

type recTx struct {
	r       *Recorder
	mu      sync.Mutex
	pending []outbox.Record
	done    bool
}

func (x *recTx) finish() []outbox.Record {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.done = true
	return x.pending
}

func (x *recTx) Add(ctx context.Context, events ...outbox.Event) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.done {
		return unitofwork.ErrTxDone
	}
	recs, err := x.r.uow.Prepare(ctx, events...)
	if err != nil {
		return err
	}
	x.pending = append(x.pending, recs...)
	return nil
}

func noDB(method string) error {
	return fmt.Errorf("outboxtest: %s on a Recorder's Tx: %w", method, ErrNoDB)
}

func (x *recTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if x.r.db == nil {
		return pgconn.CommandTag{}, noDB("Exec")
	}
	return x.r.db.Exec(ctx, sql, args...)
}

func (x *recTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if x.r.db == nil {
		return nil, noDB("Query")
	}
	return x.r.db.Query(ctx, sql, args...)
}

func (x *recTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if x.r.db == nil {
		return errRow{noDB("QueryRow")}
	}
	return x.r.db.QueryRow(ctx, sql, args...)
}

func (x *recTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if x.r.db == nil {
		return 0, noDB("CopyFrom")
	}
	return x.r.db.CopyFrom(ctx, table, columns, src)
}

func (x *recTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if x.r.db == nil {
		return errBatch{noDB("SendBatch")}
	}
	return x.r.db.SendBatch(ctx, b)
}

var _ unitofwork.Tx = (*recTx)(nil)

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

type errBatch struct{ err error }

func (b errBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b errBatch) Query() (pgx.Rows, error)         { return nil, b.err }
func (b errBatch) QueryRow() pgx.Row                { return errRow(b) }
func (b errBatch) Close() error                     { return b.err }
func (b errBatch) Tx() pgx.Tx                       { return nil }

// noBegin lets the recorder build a UnitOfWork only to prepare events.
type noBegin struct{}

func (noBegin) Begin(context.Context) (pgx.Tx, error) {
	return nil, errors.New("outboxtest: the recorder never begins a transaction")
}
