package unitofwork

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/propagation"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/defaults"
	"github.com/fxoutbox/outbox/internal/record"
)

// Tx is the transaction a Do function works in. Exec, Query and QueryRow make
// it satisfy sqlc's generated DBTX interface (and CopyFrom and SendBatch the
// wider one sqlc emits for :copyfrom and :batch queries), so generated
// queries run on it unchanged: queries.New(tx).
type Tx interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	// Add validates events and records them to be written with the
	// transaction. It returns an *outbox.EventError (errors.Is
	// outbox.ErrInvalidEvent) for an invalid event and records none of the
	// events of that call then.
	Add(ctx context.Context, events ...outbox.Event) error
}

// Doer runs a function in a transaction that records outbox events: what a
// handler needs of a [UnitOfWork]. A handler that depends on a Doer rather
// than on *UnitOfWork can be unit tested without a database, with the
// recorder of package outboxtest.
type Doer interface {
	Do(ctx context.Context, fn func(ctx context.Context, tx Tx) error) error
}

// TxAdder adds events to a transaction the caller runs: what a handler
// needs of a second outbox that writes in the first one's transaction
// (AddTx with [PgxTx]), or of an outbox written from a transaction helper
// of the application's own. *UnitOfWork implements it, and so does the
// recorder of package outboxtest, so a handler that depends on a TxAdder
// can be unit tested without a database.
type TxAdder interface {
	AddTx(ctx context.Context, tx pgx.Tx, events ...outbox.Event) error
}

var (
	_ Doer    = (*UnitOfWork)(nil)
	_ TxAdder = (*UnitOfWork)(nil)
)

// Beginner starts transactions: a *pgxpool.Pool or a *pgx.Conn.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Config configures a UnitOfWork. The zero value is usable when every event
// names its Topic; set Service to derive topic names.
type Config struct {
	// Service is the first part of derived topic names
	// ("<service>.<aggregate-type>.<event-name>"), e.g. "order-service".
	// Default: "" (events must then name their Topic).
	Service string `env:"OUTBOX_SERVICE"`
	// Table is the outbox table. Default: outbox_event in the search_path.
	Table outbox.Table
	// Topics derives the topic of an event without one. Default:
	// outbox.TopicPerEvent; outbox.TopicPerAggregate is the alternative.
	Topics outbox.TopicFunc `env:"OUTBOX_TOPIC_NAMING"`
	// Limits bounds what one event may carry: the Kafka record it becomes
	// (MaxRecordBytes: give the relay the same number as its
	// MaxMessageBytes), the payload as stored, headers and text fields.
	// Default: see outbox.Limits.
	Limits outbox.Limits `env:""`
	// Propagator writes the trace context of ctx into each event's headers.
	// Default: W3C trace context and baggage, the same default as the relay,
	// whatever the global otel propagator is.
	Propagator propagation.TextMapPropagator
	// TxOptions are used to begin Do's transactions. Default: the server's
	// default isolation (READ COMMITTED), read-write.
	TxOptions pgx.TxOptions
	// OnCommit, if set, is called after Do commits a transaction that
	// recorded at least one event, with their number; and after a
	// transaction that AddTx wrote into commits (see AddTx). fxoutbox uses
	// it to wake an in-process relay, and relays in other processes through
	// a Notifier, at once instead of at their next tick. It must not block.
	// Default nil.
	OnCommit func(events int)
	// Logger receives the AddTx commit watcher's warnings (checks failing).
	// Default: slog.Default().
	Logger *slog.Logger
}

// withDefaults sets each zero field to its default (the table's, the
// limits', outbox.TopicPerEvent and the W3C propagator), as relay and inbox
// do; validate checks the result.
func (c Config) withDefaults() Config {
	c.Table = c.Table.WithDefaults()
	c.Limits = record.LimitsWithDefaults(c.Limits)
	if c.Topics == nil {
		c.Topics = outbox.TopicPerEvent
	}
	if c.Propagator == nil {
		c.Propagator = defaults.Propagator()
	}
	return c
}

// validate checks a Config after withDefaults; each error names the field.
func (c Config) validate() error {
	if err := c.Table.Validate(); err != nil {
		return err
	}
	if err := c.Limits.Validate(); err != nil {
		return err
	}
	if c.Service != "" {
		if err := outbox.ValidateTopic(c.Service); err != nil {
			return &outbox.ConfigError{Field: "Service", Reason: "must be usable in a topic name: " + err.Error()}
		}
	}
	return nil
}

// UnitOfWork runs business transactions that record outbox events. It is
// safe for concurrent use.
type UnitOfWork struct {
	db     Beginner
	cfg    Config
	insert inserter
	watch  *watcher // nil without OnCommit or without a pool
}

// New returns a UnitOfWork over db (normally the app's *pgxpool.Pool). A nil
// cfg means the defaults. It does no I/O.
func New(db Beginner, cfg *Config) (*UnitOfWork, error) {
	if db == nil {
		return nil, &outbox.ConfigError{Field: "db", Reason: "is nil: pass the application's *pgxpool.Pool"}
	}
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	c = c.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	if _, ok := db.(txBeginner); !ok && c.TxOptions != (pgx.TxOptions{}) {
		return nil, &outbox.ConfigError{Field: "TxOptions", Reason: "are set but the db has no BeginTx method: pass a *pgxpool.Pool or *pgx.Conn"}
	}
	u := &UnitOfWork{db: db, cfg: c, insert: newInserter(c.Table)}
	if q, ok := db.(querier); ok && c.OnCommit != nil {
		if _, pool := db.(interface {
			Acquire(ctx context.Context) (*pgxpool.Conn, error)
		}); pool {
			u.watch = newWatcher(q, c.OnCommit, c.Logger)
		}
	}
	return u, nil
}

// Close stops the AddTx commit watcher, if one runs, and waits for it.
// Transactions still open are no longer watched: their events wait for the
// relay's poll. Do and AddTx keep working. fxoutbox closes its units of
// work when the application stops.
func (u *UnitOfWork) Close() {
	if u.watch != nil {
		u.watch.close()
	}
}

// Do runs fn in a transaction and commits it together with the events fn
// recorded. If fn returns an error, Do rolls back and returns that error
// unchanged; if fn panics, Do rolls back and panics again. No event survives
// either. A commit error is returned wrapped; its outcome may be unknown
// (connection lost during COMMIT), as with any database transaction.
func (u *UnitOfWork) Do(ctx context.Context, fn func(ctx context.Context, tx Tx) error) error {
	ptx, err := u.begin(ctx)
	if err != nil {
		return fmt.Errorf("unitofwork: begin: %w", err)
	}
	return u.run(ctx, ptx, fn)
}

// DoBatch runs fn like Do, in a transaction whose BEGIN goes to the
// database in one round trip together with the statements queued on b
// (pgx's Batch.BeginTx): for statements that start every transaction of a
// kind, such as a consumer's inbox row or a lock on the aggregate, so that
// they cost no round trip of their own. Their results are read before fn
// runs, through the callbacks set with QueuedQuery.Exec, Query or
// QueryRow; a statement that fails, or a callback's error, rolls the
// transaction back and is returned wrapped, without calling fn. b must
// not have been sent, nor BeginTx called on it; DoBatch sends a copy of
// its queue, once.
//
// On a db without SendBatch (neither a *pgxpool.Pool nor a *pgx.Conn)
// DoBatch begins the transaction first and sends b in it: the same
// statements and outcome, one round trip more.
func (u *UnitOfWork) DoBatch(ctx context.Context, b *pgx.Batch, fn func(ctx context.Context, tx Tx) error) error {
	n := 0
	if b != nil {
		n = b.Len()
	}
	sender, ok := u.db.(batchSender)
	if !ok || n == 0 {
		ptx, err := u.begin(ctx)
		if err != nil {
			return fmt.Errorf("unitofwork: begin: %w", err)
		}
		if n > 0 {
			if err := ptx.SendBatch(ctx, b).Close(); err != nil {
				_ = ptx.Rollback(context.WithoutCancel(ctx))
				return fmt.Errorf("unitofwork: begin with %d batched statements: %w", n, err)
			}
		}
		return u.run(ctx, ptx, fn)
	}
	first := &pgx.Batch{}
	first.BeginTx(u.cfg.TxOptions)
	first.QueuedQueries = append(first.QueuedQueries, b.QueuedQueries...)
	br := sender.SendBatch(ctx, first)
	ptx := br.Tx()
	if err := br.Close(); err != nil {
		// Closed already when BEGIN itself failed (ErrTxClosed then);
		// otherwise this ends the aborted transaction and frees the
		// connection.
		_ = ptx.Rollback(context.WithoutCancel(ctx))
		return fmt.Errorf("unitofwork: begin with %d batched statements: %w", n, err)
	}
	return u.run(ctx, ptx, fn)
}

type batchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// run runs fn in ptx and commits it with the events fn recorded; on an
// error or a panic in fn it rolls back.
func (u *UnitOfWork) run(ctx context.Context, ptx pgx.Tx, fn func(ctx context.Context, tx Tx) error) error {
	// Safe after Commit; on an error or a panic in fn it rolls back, and the
	// panic goes on.
	defer func() { _ = ptx.Rollback(context.WithoutCancel(ctx)) }()
	t := &tx{Tx: ptx, u: u}
	err := fn(ctx, t)
	t.done = true
	if err != nil {
		return err
	}
	if err := u.write(ctx, ptx, t.pending); err != nil {
		return err
	}
	if err := ptx.Commit(ctx); err != nil {
		return fmt.Errorf("unitofwork: commit: %w", err)
	}
	if len(t.pending) > 0 && u.cfg.OnCommit != nil {
		u.cfg.OnCommit(len(t.pending))
	}
	for _, f := range t.after {
		f()
	}
	return nil
}

func (u *UnitOfWork) begin(ctx context.Context) (pgx.Tx, error) {
	if u.cfg.TxOptions == (pgx.TxOptions{}) {
		return u.db.Begin(ctx)
	}
	return u.db.(txBeginner).BeginTx(ctx, u.cfg.TxOptions)
}

type txBeginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// AddTx validates events and inserts them at once, in one round trip, into
// a transaction the caller manages and commits. Use it with your own
// transaction helpers; inside Do of this UnitOfWork, use Tx.Add.
//
// The OnCommit hook runs after that transaction commits, as after Do:
//
//   - ptx is the transaction of a Do, of this or another UnitOfWork
//     ([PgxTx]): the hook runs right after that Do commits. This is how one
//     transaction writes to several outbox tables.
//   - otherwise, when the UnitOfWork was built on a *pgxpool.Pool: the
//     insert also returns the transaction's id, and a watcher goroutine
//     asks the server every few milliseconds (one statement for all open
//     AddTx transactions, backing off to 100ms while none ends) until the
//     commit is visible, then runs the hook. No NOTIFY is sent inside the
//     transaction. Close stops the watcher.
//   - on a single *pgx.Conn the hook does not run (the watcher would need a
//     second connection): the relay finds the events at its next poll.
func (u *UnitOfWork) AddTx(ctx context.Context, ptx pgx.Tx, events ...outbox.Event) error {
	if t, ok := ptx.(*tx); ok {
		return u.addToDo(ctx, t, events)
	}
	recs, err := u.prepare(ctx, events)
	if err != nil || len(recs) == 0 {
		return err
	}
	if u.watch == nil {
		return u.write(ctx, ptx, recs)
	}
	var xid int64
	if err := u.insert.run(ctx, ptx, recs, &xid); err != nil {
		return fmt.Errorf("unitofwork: insert %d outbox events into %s: %w", len(recs), u.cfg.Table, err)
	}
	u.watch.add(xid, len(recs))
	return nil
}

// addToDo adds events to the transaction of a running Do: buffered with
// that Do's own events when it is this UnitOfWork's, else inserted now with
// this UnitOfWork's OnCommit run after that Do commits.
func (u *UnitOfWork) addToDo(ctx context.Context, t *tx, events []outbox.Event) error {
	if t.done {
		return ErrTxDone
	}
	if t.u == u {
		return t.Add(ctx, events...)
	}
	recs, err := u.prepare(ctx, events)
	if err != nil || len(recs) == 0 {
		return err
	}
	if err := u.write(ctx, t.Tx, recs); err != nil {
		return err
	}
	if u.cfg.OnCommit != nil {
		n := len(recs)
		t.after = append(t.after, func() { u.cfg.OnCommit(n) })
	}
	return nil
}

// PgxTx returns the pgx.Tx behind a Tx that Do passed to its function, for
// code that takes a pgx.Tx: another UnitOfWork's AddTx (a second outbox
// table in the same transaction), or a library of your own. Do still owns
// it: do not Commit or Roll it back. A Tx that is itself a pgx.Tx, such as
// the transaction of outboxtest's recorder, is returned as it is, so the
// same handler code runs on recorders in unit tests. It returns nil for any
// other Tx.
func PgxTx(t Tx) pgx.Tx {
	if x, ok := t.(pgx.Tx); ok {
		return x
	}
	return nil
}

// write inserts recs, if any, in one statement.
func (u *UnitOfWork) write(ctx context.Context, db execer, recs []record.Record) error {
	if len(recs) == 0 {
		return nil
	}
	if err := u.insert.exec(ctx, db, recs); err != nil {
		return fmt.Errorf("unitofwork: insert %d outbox events into %s: %w", len(recs), u.cfg.Table, err)
	}
	return nil
}

func (u *UnitOfWork) prepare(ctx context.Context, events []outbox.Event) ([]record.Record, error) {
	w := record.Writer{Service: u.cfg.Service, Topics: u.cfg.Topics, Limits: u.cfg.Limits, Propagator: u.cfg.Propagator}
	return w.Prepare(ctx, events)
}

// ErrTxDone is returned by Tx.Add after the Do function has returned.
var ErrTxDone = errors.New("unitofwork: Add called after the Do function returned")

type tx struct {
	pgx.Tx
	u       *UnitOfWork
	pending []record.Record
	after   []func() // other units of work's OnCommit, for their AddTx
	done    bool
}

func (t *tx) Add(ctx context.Context, events ...outbox.Event) error {
	if t.done {
		return ErrTxDone
	}
	recs, err := t.u.prepare(ctx, events)
	if err != nil {
		return err
	}
	t.pending = append(t.pending, recs...)
	return nil
}

var _ Tx = (*tx)(nil)
