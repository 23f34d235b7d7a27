package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/tablesql"
)

// ParkedEvent is an event the relay set aside after it failed permanently
// (too large, invalid or missing topic, rejected record) MaxAttempts times.
type ParkedEvent struct {
	// ID is the row's id in the table, in write order: the paging cursor
	// (Filter.After) and the bound of Filter.FromID/ToID.
	ID            int64     `json:"id"`
	EventID       uuid.UUID `json:"event_id"`
	EventType     string    `json:"event_type"`
	AggregateType string    `json:"aggregate_type"`
	AggregateID   string    `json:"aggregate_id"`
	Topic         string    `json:"topic"`
	Key           string    `json:"key"`
	Attempts      int       `json:"attempts"`
	LastError     string    `json:"last_error"`
	CreatedAt     time.Time `json:"created_at"`
	ParkedAt      time.Time `json:"parked_at"`
	// Payload is the event's JSON payload; only GetParked reads it.
	Payload json.RawMessage `json:"payload,omitempty"`
	// Headers are the event's own headers and the writer's trace context;
	// only GetParked reads them.
	Headers map[string]string `json:"headers,omitempty"`
}

const parkedCols = "id, event_id, event_type, aggregate_type, aggregate_id, topic, partition_key, attempts, coalesce(last_error, ''), created_at"

func scanParked(r pgx.CollectableRow) (ParkedEvent, error) {
	var p ParkedEvent
	err := r.Scan(&p.ID, &p.EventID, &p.EventType, &p.AggregateType, &p.AggregateID, &p.Topic, &p.Key, &p.Attempts, &p.LastError, &p.CreatedAt, &p.ParkedAt)
	return p, err
}

// ListParked returns the parked events that match f, oldest (lowest id)
// first, at most f.Limit (default DefaultLimit), without their payloads
// and headers. For the next page, call it again with f.After set to the
// last event's ID. It reads the partial index on parked rows.
func ListParked(ctx context.Context, db Querier, table outbox.Table, f Filter) ([]ParkedEvent, error) {
	if err := table.Validate(); err != nil {
		return nil, err
	}
	if err := f.validate(); err != nil {
		return nil, err
	}
	if f.Limit == 0 {
		f.Limit = DefaultLimit
	}
	args := pgx.NamedArgs{"after": f.After, "limit": f.Limit}
	rows, err := db.Query(ctx, "SELECT "+parkedCols+", parked_at FROM "+table.Ident()+
		" WHERE parked_at IS NOT NULL AND id > @after"+f.where(args)+" ORDER BY id LIMIT @limit", args)
	if err != nil {
		return nil, fmt.Errorf("admin: list parked events in %s: %w", table, err)
	}
	out, err := pgx.CollectRows(rows, scanParked)
	if err != nil {
		return nil, fmt.Errorf("admin: list parked events in %s: %w", table, err)
	}
	return out, nil
}

// CountParked returns how many parked events match f (at most f.Limit,
// when set): what Requeue or Delete with f would change.
func CountParked(ctx context.Context, db Querier, table outbox.Table, f Filter) (int, error) {
	n, err := count(ctx, db, table, parked, f)
	if err != nil {
		return 0, fmt.Errorf("admin: count parked events in %s: %w", table, err)
	}
	return n, nil
}

// GetParked returns one parked event with its payload and headers. An
// event id the table does not hold is ErrNotFound; an event that is not
// parked is ErrNotParked, with its state in the message.
func GetParked(ctx context.Context, db Querier, table outbox.Table, eventID uuid.UUID) (ParkedEvent, error) {
	if err := table.Validate(); err != nil {
		return ParkedEvent{}, err
	}
	rows, err := db.Query(ctx, "SELECT "+parkedCols+", parked_at, payload, headers, published_at FROM "+table.Ident()+" WHERE event_id = $1", eventID)
	if err != nil {
		return ParkedEvent{}, fmt.Errorf("admin: read event %s in %s: %w", eventID, table, err)
	}
	var (
		p           ParkedEvent
		parkedAt    *time.Time
		publishedAt *time.Time
		headers     []byte
	)
	p, err = pgx.CollectExactlyOneRow(rows, func(r pgx.CollectableRow) (ParkedEvent, error) {
		var p ParkedEvent
		err := r.Scan(&p.ID, &p.EventID, &p.EventType, &p.AggregateType, &p.AggregateID, &p.Topic, &p.Key, &p.Attempts, &p.LastError, &p.CreatedAt,
			&parkedAt, &p.Payload, &headers, &publishedAt)
		return p, err
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return ParkedEvent{}, fmt.Errorf("admin: event %s in %s: %w", eventID, table, ErrNotFound)
	case err != nil:
		return ParkedEvent{}, fmt.Errorf("admin: read event %s in %s: %w", eventID, table, err)
	case publishedAt != nil:
		return ParkedEvent{}, fmt.Errorf("admin: event %s in %s was published at %s: %w", eventID, table, publishedAt.UTC().Format(time.RFC3339), ErrNotParked)
	case parkedAt == nil:
		return ParkedEvent{}, fmt.Errorf("admin: event %s in %s is waiting to be published (%d failed attempts): %w", eventID, table, p.Attempts, ErrNotParked)
	}
	p.ParkedAt = *parkedAt
	if len(headers) > 0 {
		if err := json.Unmarshal(headers, &p.Headers); err != nil {
			return ParkedEvent{}, fmt.Errorf("admin: event %s in %s: headers are not a JSON object of strings: %w", eventID, table, err)
		}
	}
	return p, nil
}

// Requeue puts the parked events that match f back in line, with their
// attempts reset, ChunkSize at a time, and returns how many it requeued.
// The relay publishes them with its next batches. Per-key order is not
// restored: a requeued event goes out after the events of its key that were
// published while it was parked. The relay sends a requeued event (attempts
// 0 with a last error) on its next claim whatever it remembers of its
// topic, so a requeue right after the fix is not refused. An empty filter
// needs f.All.
func Requeue(ctx context.Context, db Querier, table outbox.Table, f Filter, opts *BulkOptions) (int, error) {
	change := "parked_at = NULL, attempts = 0"
	if cursor, err := tablesql.InCursorMode(ctx, db, table); err != nil {
		return 0, fmt.Errorf("admin: requeue parked events in %s: %w", table, err)
	} else if cursor {
		change += ", txid = pg_current_xact_id()"
	}
	n, err := bulk(ctx, db, table, parked, change, f, opts)
	if err != nil {
		return n, fmt.Errorf("admin: requeue parked events in %s (%d requeued): %w", table, n, err)
	}
	return n, nil
}

// Delete deletes the parked events that match f, ChunkSize at a time, and
// returns how many it deleted. They are never published. An empty filter
// needs f.All.
func Delete(ctx context.Context, db Querier, table outbox.Table, f Filter, opts *BulkOptions) (int, error) {
	n, err := bulk(ctx, db, table, parked, "", f, opts)
	if err != nil {
		return n, fmt.Errorf("admin: delete parked events in %s (%d deleted): %w", table, n, err)
	}
	return n, nil
}
