// Package lazytx is a transaction on a connection that begins with its
// first statement, BEGIN sent in that statement's round trip, and a way to
// send a statement outside it while it has not begun. The relay's workers
// that keep cursor lanes use it for each batch: one that reads its kept
// lanes and writes nothing sends that one statement.
package lazytx

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Tx is a batch's transaction on the connection of a worker that keeps
// lanes (cursor.Keeper), begun by its first statement, except the
// read of the kept lanes (cursor.Engine's readKept), which runs before it
// on its own (Outside).
// A batch that reads its kept lanes and has nothing to write (their
// positions are written when due, see cursor.Keeper's plan) so sends one
// statement in one round trip, where a transaction would add BEGIN and
// COMMIT, two more. That read needs no transaction: it is one statement
// (one snapshot), the lanes' session locks are the connection's and their
// positions the worker's, and what the batch then writes (an attempt, a
// park, the positions) is written in the transaction its first write
// begins. Commit and Rollback of a transaction that never began do nothing.
//
// A relay frozen in such a batch, outside a transaction, loses its
// connection, and so its lanes, after idle_session_timeout, which is longer
// than BatchTimeout as idle_in_transaction_session_timeout is (see
// cursor.Keeper).
type Tx struct {
	conn *pgx.Conn
	tx   pgx.Tx // nil until a statement begins it
	// ended: Commit or Rollback ran before anything began it.
	ended bool
}

// New returns a transaction on conn that begins with its first statement.
func New(conn *pgx.Conn) *Tx { return &Tx{conn: conn} }

// Outside reports whether tx is a Tx that has not begun, and returns its
// connection: a statement sent on it runs on its own.
func Outside(tx pgx.Tx) (*pgx.Conn, bool) {
	d, ok := tx.(*Tx)
	if !ok || d.started() {
		return nil, false
	}
	return d.conn, true
}

// started reports whether a statement began the transaction, or Commit or
// Rollback ended it unbegun: a statement then goes to the transaction.
func (d *Tx) started() bool { return d.tx != nil || d.ended }

// begun returns the transaction, begun first if it was not.
func (d *Tx) begun(ctx context.Context) (pgx.Tx, error) {
	if d.tx != nil {
		return d.tx, nil
	}
	if d.ended {
		return nil, pgx.ErrTxClosed
	}
	tx, err := d.conn.Begin(ctx)
	if err != nil {
		return nil, err
	}
	d.tx = tx
	return tx, nil
}

func (d *Tx) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := d.begun(ctx)
	if err != nil {
		return nil, err
	}
	return tx.Begin(ctx)
}

func (d *Tx) Commit(ctx context.Context) error {
	return d.end(func(tx pgx.Tx) error { return tx.Commit(ctx) })
}

func (d *Tx) Rollback(ctx context.Context) error {
	return d.end(func(tx pgx.Tx) error { return tx.Rollback(ctx) })
}

// end is Commit and Rollback: fin ends the transaction that began; one
// that never began ends without a statement.
func (d *Tx) end(fin func(pgx.Tx) error) error {
	if d.tx != nil {
		return fin(d.tx)
	}
	if d.ended {
		return pgx.ErrTxClosed
	}
	d.ended = true
	return nil
}

func (d *Tx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	tx, err := d.begun(ctx)
	if err != nil {
		return 0, err
	}
	return tx.CopyFrom(ctx, table, columns, src)
}

// SendBatch sends b in the transaction; when it has not begun, BEGIN goes
// in the same round trip (pgx.Batch.BeginTx).
func (d *Tx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if d.started() {
		tx, err := d.begun(ctx)
		if err != nil {
			return pgx.FailedBatchResults(b, err)
		}
		return tx.SendBatch(ctx, b)
	}
	withBegin := &pgx.Batch{}
	withBegin.BeginTx(pgx.TxOptions{})
	withBegin.QueuedQueries = append(withBegin.QueuedQueries, b.QueuedQueries...)
	br := d.conn.SendBatch(ctx, withBegin)
	d.tx = br.Tx()
	// The caller reads b's results: BEGIN's is read here.
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return pgx.FailedBatchResults(b, err)
	}
	return br
}

// LargeObjects begins the transaction without a deadline: the relay uses
// none.
func (d *Tx) LargeObjects() pgx.LargeObjects {
	tx, err := d.begun(context.Background())
	if err != nil {
		return pgx.LargeObjects{}
	}
	return tx.LargeObjects()
}

func (d *Tx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	tx, err := d.begun(ctx)
	if err != nil {
		return nil, err
	}
	return tx.Prepare(ctx, name, sql)
}

// Exec runs sql in the transaction; when it has not begun, BEGIN goes in
// the same round trip.
func (d *Tx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if d.started() {
		tx, err := d.begun(ctx)
		if err != nil {
			return pgconn.CommandTag{}, err
		}
		return tx.Exec(ctx, sql, args...)
	}
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	br := d.SendBatch(ctx, b)
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

// Query runs sql in the transaction; when it has not begun, BEGIN goes in
// the same round trip.
func (d *Tx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if d.started() {
		tx, err := d.begun(ctx)
		if err != nil {
			return nil, err
		}
		return tx.Query(ctx, sql, args...)
	}
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	br := d.SendBatch(ctx, b)
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return nil, err
	}
	return batchRows{rows, br}, nil
}

// batchRows are the rows of a batch's one query: closing them, or reading
// them to the end, closes the batch (which frees the connection).
type batchRows struct {
	pgx.Rows
	br pgx.BatchResults
}

func (r batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	_ = r.br.Close()
	return false
}

func (r batchRows) Close() {
	r.Rows.Close()
	_ = r.br.Close()
}

func (d *Tx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	tx, err := d.begun(ctx)
	if err != nil {
		return failedRow{err}
	}
	return tx.QueryRow(ctx, sql, args...)
}

func (d *Tx) Conn() *pgx.Conn { return d.conn }

// failedRow is the row of a statement that could not be sent.
type failedRow struct{ err error }

func (f failedRow) Scan(...any) error { return f.err }
