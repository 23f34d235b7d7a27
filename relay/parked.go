package relay

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fxoutbox/outbox"
)

// PoisonPolicy says what the relay does with an event that keeps failing
// permanently.
type PoisonPolicy int

const (
	// Park sets the event aside after MaxAttempts permanent failures, or at
	// once when it can never go as stored (unreadable row, malformed
	// headers, invalid topic, too large, missing topic): it is no longer
	// claimed, and later events of its key are published without it
	// (consumers see a gap in that key's sequence). List parked events with
	// ListParked and put them back with Requeue once the cause is fixed.
	Park PoisonPolicy = iota
	// Hold never parks: the event is retried, paced up to MaxBackoff apart
	// (with its attempts and last error recorded), and later events of its
	// key wait behind it, so the key's order is kept at the price of
	// blocking the key; the other keys flow.
	Hold
)

// ParkedEvent is an event the relay set aside.
type ParkedEvent struct {
	EventID   uuid.UUID
	EventType string
	Topic     string
	Key       string
	Attempts  int
	LastError string
	CreatedAt time.Time
	ParkedAt  time.Time
}

// Querier runs statements: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// ListParked returns up to limit parked events of table, oldest first.
func ListParked(ctx context.Context, db Querier, table outbox.Table, limit int) ([]ParkedEvent, error) {
	if err := table.Validate(); err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, "SELECT event_id, event_type, topic, partition_key, attempts, coalesce(last_error, ''), created_at, parked_at FROM "+
		table.Ident()+" WHERE parked_at IS NOT NULL ORDER BY id LIMIT $1", limit)
	if err != nil {
		return nil, fmt.Errorf("relay: list parked events in %s: %w", table, err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (ParkedEvent, error) {
		var p ParkedEvent
		err := r.Scan(&p.EventID, &p.EventType, &p.Topic, &p.Key, &p.Attempts, &p.LastError, &p.CreatedAt, &p.ParkedAt)
		return p, err
	})
}

// Requeue puts parked events back in line, with their attempts reset, and
// returns how many it requeued. A requeued event is published after the
// events of its key already published: per-key order is not restored.
func Requeue(ctx context.Context, db Querier, table outbox.Table, eventIDs ...uuid.UUID) (int, error) {
	if err := table.Validate(); err != nil {
		return 0, err
	}
	tag, err := db.Exec(ctx, "UPDATE "+table.Ident()+" SET parked_at = NULL, attempts = 0 WHERE event_id = ANY($1) AND parked_at IS NOT NULL", eventIDs)
	if err != nil {
		return 0, fmt.Errorf("relay: requeue events in %s: %w", table, err)
	}
	return int(tag.RowsAffected()), nil
}
