// Package claim is what a batch's claim reads, shared by both progress
// modes and both deliveries: the claimed row, the row that cannot be read,
// and the reads that set such a row aside instead of failing the batch.
package claim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Row is a claimed outbox row.
type Row struct {
	ID        int64
	EventID   uuid.UUID
	EventType string
	Topic     string
	Key       string
	Payload   []byte
	Headers   []byte
	Attempts  int
	CreatedAt time.Time
	// Requeued: the row was requeued and has not failed since (attempts 0
	// with a last error): it is sent whatever the relay remembers of its
	// topic.
	Requeued bool
}

// Cols are the columns of a row that a claim reads, in the order Scan
// scans them (a cursor claim reads the same for alias e).
const Cols = "id, event_id, event_type, topic, partition_key, payload, headers, attempts, created_at, attempts = 0 AND last_error IS NOT NULL"

// Scan returns the destinations of a row's columns as the claims read
// them (Cols), followed by more.
func (x *Row) Scan(more ...any) []any {
	return append([]any{&x.ID, &x.EventID, &x.EventType, &x.Topic, &x.Key, &x.Payload, &x.Headers, &x.Attempts, &x.CreatedAt, &x.Requeued}, more...)
}

// Unreadable is a claimed row that PostgreSQL cannot print (or pgx cannot
// decode): it is charged, and parked, without being read.
type Unreadable struct {
	ID  int64
	Err error
}

// IsUnreadable reports an error that a row's stored data causes when it is
// read: a data exception (class 22), a program limit (class 54, e.g. a
// jsonb value too large to print), data corruption (XX001), or a value pgx
// cannot decode. Connection errors, timeouts and every other error are not.
func IsUnreadable(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return strings.HasPrefix(pe.Code, "22") || strings.HasPrefix(pe.Code, "54") || pe.Code == "XX001"
	}
	var se pgx.ScanArgError
	return errors.As(err, &se)
}

// Query runs sql and hands its rows to scan. A statement pre (the
// transaction's settings before the claim's first statement, a savepoint
// before the read of rows) goes in the same round trip.
func Query(ctx context.Context, tx pgx.Tx, pre string, preArgs []any, sql string, args pgx.NamedArgs, scan func(pgx.Rows) error) error {
	if pre == "" {
		rows, err := tx.Query(ctx, sql, args)
		if err != nil {
			return err
		}
		defer rows.Close()
		if err := scan(rows); err != nil {
			return err
		}
		rows.Close()
		return rows.Err()
	}
	b := &pgx.Batch{}
	b.Queue(pre, preArgs...)
	b.Queue(sql, args).Query(scan)
	return tx.SendBatch(ctx, b).Close()
}

// ReadRows runs a query of rows (pre in the same round trip, see Query)
// and returns the rows it read, also those that arrived before an error.
func ReadRows(ctx context.Context, tx pgx.Tx, pre string, preArgs []any, n int, sql string, args pgx.NamedArgs) ([]Row, error) {
	out := make([]Row, 0, n)
	var x Row
	err := Query(ctx, tx, pre, preArgs, sql, args, func(rs pgx.Rows) error {
		_, err := pgx.ForEachRow(rs, x.Scan(), func() error {
			out = append(out, x)
			x = Row{}
			return nil
		})
		return err
	})
	return out, err
}

// Guarded is the statements of a guarded read (ReadGuarded), and the
// table its errors name.
type Guarded struct {
	Table      string
	Savepoint  string // SAVEPOINT
	RollbackTo string // ROLLBACK TO SAVEPOINT
	// Read takes the rows @ids that are still waiting, at most @n, in id
	// order; FirstID is the id of the first waiting row of @ids.
	Read, FirstID string
}

// ReadGuarded reads up to n of the rows ids (sorted, locked by this
// transaction) in id order, under a savepoint. PostgreSQL sends rows as it
// prints them, so when one cannot be printed the rows before it have
// arrived: the unreadable one is the first claimable id after them, which a
// query reading only ids names. It is set aside (bad) and the read goes on
// after it, back at the savepoint. Each unreadable row costs one failed
// read and one id query; the happy path is the read alone, its savepoint in
// the same round trip. more says ids were left unread (n were read).
func (g Guarded) ReadGuarded(ctx context.Context, tx pgx.Tx, ids []int64, n int) (rows []Row, bad []Unreadable, more bool, err error) {
	pre := g.Savepoint
	for len(ids) > 0 && len(rows) < n {
		got, err := ReadRows(ctx, tx, pre, nil, n-len(rows), g.Read, pgx.NamedArgs{"ids": ids, "n": n - len(rows)})
		rows = append(rows, got...)
		if err == nil {
			return rows, bad, false, nil
		}
		if !IsUnreadable(err) {
			return nil, nil, false, fmt.Errorf("relay: claim from %s: %w", g.Table, err)
		}
		pre = "" // the savepoint stays: ROLLBACK TO keeps it
		if len(got) > 0 {
			last := got[len(got)-1].ID
			i, _ := slices.BinarySearch(ids, last)
			ids = ids[min(i+1, len(ids)):]
		}
		if _, e := tx.Exec(ctx, g.RollbackTo); e != nil {
			return nil, nil, false, fmt.Errorf("relay: claim from %s: isolate an unreadable row: %w", g.Table, e)
		}
		var first int64
		if e := tx.QueryRow(ctx, g.FirstID, pgx.NamedArgs{"ids": ids}).Scan(&first); e != nil {
			if errors.Is(e, pgx.ErrNoRows) {
				// Nothing left to blame: not a row's fault after all.
				return nil, nil, false, fmt.Errorf("relay: claim from %s: %w", g.Table, err)
			}
			return nil, nil, false, fmt.Errorf("relay: claim from %s: isolate an unreadable row: %w", g.Table, e)
		}
		bad = append(bad, Unreadable{ID: first, Err: err})
		i, _ := slices.BinarySearch(ids, first)
		ids = ids[min(i+1, len(ids)):]
	}
	return rows, bad, len(ids) > 0, nil
}

// Claimed is what a claim read: the readable rows, in order, the rows that
// cannot be read, in order, whether more waiting rows are likely, and
// whether it read nothing because the lanes of the waiting rows it saw are
// all held by other relays (per key only).
type Claimed struct {
	Rows          []Row
	Bad           []Unreadable
	More          bool
	HeldElsewhere bool
}
