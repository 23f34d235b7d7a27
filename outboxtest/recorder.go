package outboxtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/record"
	"github.com/fxoutbox/outbox/unitofwork"
)

// Record is an event as the writer stores it: every default applied (event
// id, topic, key, the trace context headers), the payload encoded as JSON.
// The Recorder records them; Inserted reads them back from a table.
type Record struct {
	ID            uuid.UUID
	AggregateType string
	AggregateID   string
	Type          string
	Payload       []byte // JSON, as given or marshalled
	Topic         string
	Key           string
	Headers       map[string]string // event headers plus trace context; nil when empty
	// PayloadBytes is the length of Payload as PostgreSQL's jsonb stores
	// and prints it: what the relay reads back and sends as the value.
	PayloadBytes int
}

// T is the part of *testing.T (and testing.TB) the assertions use.
type T interface {
	Helper()
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
}

// DBTX runs SQL: a *RecordingDB, a pgx.Tx, a *pgxpool.Pool, a *pgx.Conn
// or a mock.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// ErrNoDB is returned by the SQL methods of a Recorder's Tx when the
// recorder has no database to delegate them to.
var ErrNoDB = errors.New("the recorder has no database: set RecorderConfig.DB to an outboxtest.RecordingDB, which records the SQL " +
	"for RequireSQL with neither a database nor a mock library (DB: &outboxtest.RecordingDB{}), or to a pgx.Tx the test rolls back, a pool, or a mock")

// RecorderConfig configures a Recorder.
type RecorderConfig struct {
	// UnitOfWork is the configuration the handler's UnitOfWork has in
	// production: Service, Topics, Limits and Propagator name and validate
	// events exactly as there. Table, TxOptions and OnCommit are not used.
	// Default: the zero Config (events must name their Topic).
	UnitOfWork unitofwork.Config
	// DB runs the SQL methods of the recorder's Tx: a *RecordingDB (the
	// SQL recorded for RequireSQL, no database needed), a pgx.Tx the test
	// rolls back, a *pgxpool.Pool or *pgx.Conn, or a mock. When DB can
	// begin a transaction (a Begin(ctx) (pgx.Tx, error) method, as all
	// these have), each Do begins one on it and ends it as the real Do
	// ends its own: committed when the function returns nil, rolled back
	// when it returns an error or panics, so what the function wrote
	// through DB is gone after a failed Do, as in production. On a pgx.Tx
	// that is a savepoint (the test's transaction stays open), on a pool a
	// transaction of its own (committed writes stay: clean them up); a
	// mock must expect the Begin and the Commit or Rollback (pgxmock's
	// ExpectBegin, ExpectCommit, ExpectRollback). Begin, and Begin on a
	// recorder's transaction, do the same. A pgx.Tx or *pgx.Conn is one
	// connection: it serves one Do at a time, as pgx requires. Default:
	// nil, and those methods return ErrNoDB.
	DB DBTX
}

// ErrForeignTx is returned by [Recorder.AddTx] for a transaction that no
// recorder created: the recorder can keep events only with a transaction
// whose commit or rollback it sees.
var ErrForeignTx = errors.New("the recorder's AddTx takes the transaction of a Recorder: unitofwork.PgxTx(tx) inside a Recorder's Do, " +
	"or one from Recorder.Begin; to test AddTx on a real pgx.Tx, use a real UnitOfWork with outboxtest.Table and RequireInserted")

// ErrDoOwnsTx is returned by Commit and Rollback on the transaction of a
// Recorder's Do (through unitofwork.PgxTx): Do owns it, as with a real
// UnitOfWork, and fails with this error too.
var ErrDoOwnsTx = errors.New("the transaction belongs to Do: return from the function to commit it, return an error to roll it back")

// Recorder stands in for a [unitofwork.UnitOfWork] in unit tests: it is a
// [unitofwork.Doer], a [unitofwork.TxAdder] and a transaction starter
// (Begin, as pgx.BeginFunc takes), and records the events of the
// transactions that commit instead of writing them. Give each outbox of a
// service a recorder of its own, built from that outbox's configuration:
// the events another recorder adds with AddTx in a recorder's transaction
// (two outboxes in one transaction, docs/configuration.md) are validated by, and
// recorded in, the recorder whose AddTx was called, and are kept only if
// that transaction commits. It is safe for concurrent use.
type Recorder struct {
	w  record.Writer // prepares events as the UnitOfWork of its configuration does
	db DBTX

	mu     sync.Mutex
	events []Record
}

var (
	_ unitofwork.Doer     = (*Recorder)(nil)
	_ unitofwork.TxAdder  = (*Recorder)(nil)
	_ unitofwork.Beginner = (*Recorder)(nil)
)

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
	if _, err := unitofwork.New(noBegin{}, &uc); err != nil {
		t.Fatalf("outboxtest: NewRecorder: %v", err)
		return nil
	}
	w := record.Writer{Service: uc.Service, Topics: uc.Topics, Limits: uc.Limits, Propagator: uc.Propagator}
	return &Recorder{w: w, db: c.DB}
}

// Do runs fn with a Tx that records the events fn adds. When fn returns nil
// they are appended to the recorder's events, and the events other
// recorders added to the same transaction with AddTx to theirs; when fn
// returns an error, Do returns it unchanged and records nothing; when fn
// panics, Do records nothing and panics again. unitofwork.PgxTx(tx) is the
// transaction as a pgx.Tx, for AddTx; Do owns it: its Commit and Rollback
// fail with ErrDoOwnsTx, and so does Do.
//
// With a RecorderConfig.DB that begins transactions, Do runs fn's SQL in a
// transaction of its own on it (a savepoint on a pgx.Tx) and commits it
// with the events, or rolls it back when it records nothing.
func (r *Recorder) Do(ctx context.Context, fn func(ctx context.Context, tx unitofwork.Tx) error) error {
	tx, err := r.begin(ctx, nil, true)
	if err != nil {
		return fmt.Errorf("outboxtest: Do: %w", err)
	}
	committed := false
	defer func() { // also on a panic: a late Add fails with ErrTxDone
		tx.end()
		if !committed {
			tx.rollbackDB(ctx)
		}
	}()
	if err := fn(ctx, tx); err != nil {
		return err
	}
	pending, misuse := tx.end()
	if misuse != nil {
		return fmt.Errorf("outboxtest: Do: %w", misuse)
	}
	if err := tx.commitDB(ctx); err != nil {
		return fmt.Errorf("outboxtest: Do: %w", err) // records nothing, as a failed commit keeps nothing
	}
	committed = true
	keep(pending)
	return nil
}

// beginner begins a transaction: a pgx.Tx (a savepoint), a pool, a
// connection, a RecordingDB, a mock.
type beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// begin starts a recorder transaction (in parent, for a savepoint) and,
// when the database its SQL goes to can begin one, a transaction there for
// it.
func (r *Recorder) begin(ctx context.Context, parent *recTx, ofDo bool) (*recTx, error) {
	x := &recTx{owner: r, ofDo: ofDo, parent: parent, db: r.db}
	if parent != nil {
		x.owner, x.db = parent.owner, parent.db
	}
	if b, ok := x.db.(beginner); ok {
		t, err := b.Begin(ctx)
		if err != nil {
			return nil, fmt.Errorf("begin a transaction on RecorderConfig.DB: %w", err)
		}
		x.db, x.dbTx = t, t
	}
	return x, nil
}

// AddTx validates events as the writer's AddTx does and adds them to tx,
// which must be a recorder's transaction: that of a Do (unitofwork.PgxTx of
// its Tx, this or another recorder's) or one from Begin. They are recorded
// by r when that transaction commits, and dropped when it rolls back. Any
// other pgx.Tx gets ErrForeignTx; a transaction that has ended,
// unitofwork.ErrTxDone.
func (r *Recorder) AddTx(ctx context.Context, tx pgx.Tx, events ...outbox.Event) error {
	x, ok := tx.(*recTx)
	if !ok {
		return fmt.Errorf("outboxtest: AddTx on a %T: %w", tx, ErrForeignTx)
	}
	return x.add(ctx, r, events)
}

// Begin starts a transaction for code that runs its own (pgx.BeginFunc, or
// Begin, AddTx and Commit): the events added to it with AddTx, of any
// recorder, are recorded when it commits and dropped when it rolls back.
// Its SQL methods use RecorderConfig.DB as the Tx of Do does; Begin on it
// starts a nested transaction (a savepoint) whose events join it on
// Commit.
//
// With a RecorderConfig.DB that begins transactions, it begins one there
// too (a savepoint on a pgx.Tx), which its Commit commits and its Rollback
// rolls back.
func (r *Recorder) Begin(ctx context.Context) (pgx.Tx, error) {
	x, err := r.begin(ctx, nil, false)
	if err != nil {
		return nil, fmt.Errorf("outboxtest: Begin: %w", err)
	}
	return x, nil
}

// Events returns the events of the transactions that succeeded, in the order
// they were added, with their defaults applied (event id, topic, key, trace
// context headers) as the writer would store them.
func (r *Recorder) Events() []Record {
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

// pending is an event added to a transaction, with the recorder it goes to.
type pending struct {
	to  *Recorder
	rec Record
}

// keep records committed events, each in its recorder.
func keep(ps []pending) {
	for _, p := range ps {
		p.to.mu.Lock()
		p.to.events = append(p.to.events, p.rec)
		p.to.mu.Unlock()
	}
}

// recTx is a recorder's transaction: the Tx of Do, or a pgx.Tx from Begin
// (parent set when it is a savepoint). It is a unitofwork.Tx and a pgx.Tx.
type recTx struct {
	owner  *Recorder // its Add validates with owner's configuration
	ofDo   bool      // Do owns it: Commit and Rollback are refused
	parent *recTx    // for a savepoint: where its events go on Commit
	db     DBTX      // runs its SQL: dbTx, or RecorderConfig.DB when that cannot begin transactions
	dbTx   pgx.Tx    // begun for it on RecorderConfig.DB (or its parent's), ended with it; nil if none

	mu      sync.Mutex
	pending []pending
	done    bool
	misuse  error // Commit or Rollback called on Do's transaction
}

var (
	_ unitofwork.Tx = (*recTx)(nil)
	_ pgx.Tx        = (*recTx)(nil)
)

// end ends the transaction and returns its events, and the misuse that
// makes Do fail, if any.
func (x *recTx) end() ([]pending, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.done = true
	return x.pending, x.misuse
}

func (x *recTx) add(ctx context.Context, to *Recorder, events []outbox.Event) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.done {
		return unitofwork.ErrTxDone
	}
	recs, err := to.w.Prepare(ctx, events)
	if err != nil {
		return err
	}
	for _, rec := range recs {
		x.pending = append(x.pending, pending{to: to, rec: Record(rec)}) // the writer's record: the same fields
	}
	return nil
}

// Add validates events with the configuration of the recorder whose Do or
// Begin created the transaction, and adds them to it.
func (x *recTx) Add(ctx context.Context, events ...outbox.Event) error {
	return x.add(ctx, x.owner, events)
}

// commitDB commits the transaction begun for x on the database, if any.
func (x *recTx) commitDB(ctx context.Context) error {
	if x.dbTx == nil {
		return nil
	}
	if err := x.dbTx.Commit(ctx); err != nil {
		return fmt.Errorf("commit on RecorderConfig.DB: %w", err)
	}
	return nil
}

// rollbackDB rolls back the transaction begun for x on the database, if
// any; after a commit it does nothing.
func (x *recTx) rollbackDB(ctx context.Context) {
	if x.dbTx != nil {
		_ = x.dbTx.Rollback(context.WithoutCancel(ctx))
	}
}

// Begin starts a savepoint: its events join x when it commits; on the
// database, a savepoint in x's transaction there.
func (x *recTx) Begin(ctx context.Context) (pgx.Tx, error) {
	x.mu.Lock()
	done := x.done
	x.mu.Unlock()
	if done {
		return nil, pgx.ErrTxClosed
	}
	sp, err := x.owner.begin(ctx, x, false)
	if err != nil {
		return nil, fmt.Errorf("outboxtest: Begin: %w", err)
	}
	return sp, nil
}

// Commit records the transaction's events (a savepoint's join its parent).
// On the transaction of a Do it fails with ErrDoOwnsTx, and so does Do.
func (x *recTx) Commit(ctx context.Context) error {
	if x.ofDo {
		return x.refuse("Commit")
	}
	x.mu.Lock()
	if x.done {
		x.mu.Unlock()
		return pgx.ErrTxClosed
	}
	x.done = true
	ps := x.pending
	x.mu.Unlock()
	if err := x.commitDB(ctx); err != nil {
		x.rollbackDB(ctx)
		return fmt.Errorf("outboxtest: %w", err) // its events are dropped, as a failed commit's
	}
	if x.parent == nil {
		keep(ps)
		return nil
	}
	p := x.parent
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return pgx.ErrTxClosed
	}
	p.pending = append(p.pending, ps...)
	return nil
}

// Rollback drops the transaction's events; after Commit it returns
// pgx.ErrTxClosed, as pgx does, so that a deferred Rollback is harmless. On
// the transaction of a Do it fails with ErrDoOwnsTx, and so does Do.
func (x *recTx) Rollback(ctx context.Context) error {
	if x.ofDo {
		return x.refuse("Rollback")
	}
	x.mu.Lock()
	if x.done {
		x.mu.Unlock()
		return pgx.ErrTxClosed
	}
	x.done = true
	x.mu.Unlock()
	x.rollbackDB(ctx)
	return nil
}

func (x *recTx) refuse(method string) error {
	err := fmt.Errorf("%s on the transaction of a Recorder's Do: %w", method, ErrDoOwnsTx)
	x.mu.Lock()
	if x.misuse == nil {
		x.misuse = err
	}
	x.mu.Unlock()
	return fmt.Errorf("outboxtest: %w", err)
}

func noDB(method string) error {
	return fmt.Errorf("outboxtest: %s on a Recorder's Tx: %w", method, ErrNoDB)
}

func (x *recTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if x.db == nil {
		return pgconn.CommandTag{}, noDB("Exec")
	}
	return x.db.Exec(ctx, sql, args...)
}

func (x *recTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if x.db == nil {
		return nil, noDB("Query")
	}
	return x.db.Query(ctx, sql, args...)
}

func (x *recTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if x.db == nil {
		return errRow{noDB("QueryRow")}
	}
	return x.db.QueryRow(ctx, sql, args...)
}

func (x *recTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if x.db == nil {
		return 0, noDB("CopyFrom")
	}
	return x.db.CopyFrom(ctx, table, columns, src)
}

func (x *recTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if x.db == nil {
		return errBatch{noDB("SendBatch")}
	}
	return x.db.SendBatch(ctx, b)
}

// Prepare delegates to RecorderConfig.DB when it can prepare statements (a
// pgx.Tx or a *pgx.Conn).
func (x *recTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if p, ok := x.db.(interface {
		Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error)
	}); ok {
		return p.Prepare(ctx, name, sql)
	}
	return nil, noDB("Prepare")
}

// LargeObjects is that of RecorderConfig.DB when it is a pgx.Tx; otherwise
// the zero value, whose methods must not be called.
func (x *recTx) LargeObjects() pgx.LargeObjects {
	if t, ok := x.db.(pgx.Tx); ok {
		return t.LargeObjects()
	}
	return pgx.LargeObjects{}
}

// Conn is that of RecorderConfig.DB when it has one (a pgx.Tx or a
// *pgx.Conn); otherwise nil.
func (x *recTx) Conn() *pgx.Conn {
	if c, ok := x.db.(interface{ Conn() *pgx.Conn }); ok {
		return c.Conn()
	}
	if c, ok := x.db.(*pgx.Conn); ok {
		return c
	}
	return nil
}

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
