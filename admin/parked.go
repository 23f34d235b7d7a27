package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/tablesql"
)

// ParkedEvent is an event the relay set aside after it failed permanently
// (too large, invalid or missing topic, rejected record) MaxAttempts times.
// In marks mode it stays in its row (parked_at set); in cursor mode
// (relay.ProgressCursor) it moved to the table's parked table, <name>_parked
// (see sqlname.Parked), which the functions below read instead.
type ParkedEvent struct {
	// ID is the row's id in the table (when it was parked), in write
	// order: the paging cursor (Filter.After) and the bound of
	// Filter.FromID/ToID.
	ID            int64     `json:"id"`
	EventID       uuid.UUID `json:"event_id"`
	EventType     string    `json:"event_type"`
	AggregateType string    `json:"aggregate_type"`
	AggregateID   string    `json:"aggregate_id"`
	Topic         string    `json:"topic"`
	Key           string    `json:"key"`
	Attempts      int       `json:"attempts"`
	// Reason is the stable text of the cause ("[<error.type>] <message>",
	// see docs/operating.md), what status groups by. LastError is the last
	// try's error: in marks mode the same text; in cursor mode the error
	// in full, with what the reason leaves out.
	Reason    string    `json:"reason"`
	LastError string    `json:"last_error"`
	CreatedAt time.Time `json:"created_at"`
	// FirstTryAt is when the event first failed; nil in marks mode, and
	// for an event parked in its row before it moved to the parked table.
	FirstTryAt *time.Time `json:"first_try_at,omitempty"`
	// ParkedAt is when it was parked (its last try).
	ParkedAt time.Time `json:"parked_at"`
	// Payload is the event's JSON payload; only GetParked reads it.
	Payload json.RawMessage `json:"payload,omitempty"`
	// Headers are the event's own headers and the writer's trace context;
	// only GetParked reads them.
	Headers map[string]string `json:"headers,omitempty"`
}

// parkedCols are the columns of ParkedEvent (without payload and headers)
// in the table p, in scanParked's order.
func parkedCols(p tablesql.ParkedRows) string {
	if p.Moved {
		// Every column but the ids may be NULL in the parked table: an
		// unreadable row parks with what the server could copy.
		return "id, event_id, coalesce(event_type, ''), coalesce(aggregate_type, ''), coalesce(aggregate_id, ''), coalesce(topic, ''), coalesce(partition_key, '')," +
			" attempts, reason, coalesce(last_error, reason), coalesce(created_at, parked_at), first_try_at, parked_at"
	}
	return "id, event_id, event_type, aggregate_type, aggregate_id, topic, partition_key, attempts, coalesce(last_error, ''), coalesce(last_error, ''), created_at, NULL::timestamptz, parked_at"
}

func scanParked(r pgx.CollectableRow) (ParkedEvent, error) {
	var p ParkedEvent
	err := r.Scan(&p.ID, &p.EventID, &p.EventType, &p.AggregateType, &p.AggregateID, &p.Topic, &p.Key, &p.Attempts, &p.Reason, &p.LastError, &p.CreatedAt, &p.FirstTryAt, &p.ParkedAt)
	return p, err
}

// ListParked returns the parked events that match f, oldest (lowest id)
// first, at most f.Limit (default DefaultLimit), without their payloads
// and headers. For the next page, call it again with f.After set to the
// last event's ID. It reads the partial index on parked rows (in cursor
// mode, the parked table's primary key).
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
	p, err := tablesql.ParkedIn(ctx, db, table)
	if err != nil {
		return nil, fmt.Errorf("admin: list parked events in %s: %w", table, err)
	}
	r := parkedRel(p)
	args := pgx.NamedArgs{"after": f.After, "limit": f.Limit}
	rows, err := db.Query(ctx, "SELECT "+parkedCols(p)+" FROM "+sqlname.Ident(p.Table)+
		" WHERE "+string(r.st)+" AND id > @after"+f.whereErr(args, r.errExpr)+" ORDER BY id LIMIT @limit", args)
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
	if err := table.Validate(); err != nil {
		return 0, err
	}
	p, err := tablesql.ParkedIn(ctx, db, table)
	if err == nil {
		var n int
		if n, err = count(ctx, db, parkedRel(p), f); err == nil {
			return n, nil
		}
	}
	return 0, fmt.Errorf("admin: count parked events in %s: %w", table, err)
}

// GetParked returns one parked event with its payload and headers. An
// event id the table does not hold is ErrNotFound; an event that is not
// parked is ErrNotParked, with its state in the message.
func GetParked(ctx context.Context, db Querier, table outbox.Table, eventID uuid.UUID) (ParkedEvent, error) {
	if err := table.Validate(); err != nil {
		return ParkedEvent{}, err
	}
	p, err := tablesql.ParkedIn(ctx, db, table)
	if err != nil {
		return ParkedEvent{}, fmt.Errorf("admin: read event %s in %s: %w", eventID, table, err)
	}
	var (
		ev      ParkedEvent
		headers []byte
	)
	read := func(r pgx.CollectableRow) (ParkedEvent, error) {
		var ev ParkedEvent
		err := r.Scan(&ev.ID, &ev.EventID, &ev.EventType, &ev.AggregateType, &ev.AggregateID, &ev.Topic, &ev.Key, &ev.Attempts, &ev.Reason, &ev.LastError, &ev.CreatedAt,
			&ev.FirstTryAt, &ev.ParkedAt, &ev.Payload, &headers)
		return ev, err
	}
	if p.Moved {
		rows, err := db.Query(ctx, "SELECT "+parkedCols(p)+", payload, headers FROM "+sqlname.Ident(p.Table)+" WHERE event_id = $1", eventID)
		if err == nil {
			ev, err = pgx.CollectExactlyOneRow(rows, read)
		}
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			// Not parked: waiting, delivered, or not in the table.
			return ParkedEvent{}, notParked(ctx, db, table, eventID)
		case err != nil:
			return ParkedEvent{}, fmt.Errorf("admin: read event %s in %s: %w", eventID, table, err)
		}
	} else {
		var (
			parkedAt    *time.Time
			publishedAt *time.Time
		)
		rows, err := db.Query(ctx, "SELECT id, event_id, event_type, aggregate_type, aggregate_id, topic, partition_key, attempts, coalesce(last_error, ''), coalesce(last_error, ''), created_at,"+
			" parked_at, payload, headers, published_at FROM "+sqlname.Ident(table)+" WHERE event_id = $1", eventID)
		if err == nil {
			ev, err = pgx.CollectExactlyOneRow(rows, func(r pgx.CollectableRow) (ParkedEvent, error) {
				var ev ParkedEvent
				err := r.Scan(&ev.ID, &ev.EventID, &ev.EventType, &ev.AggregateType, &ev.AggregateID, &ev.Topic, &ev.Key, &ev.Attempts, &ev.Reason, &ev.LastError, &ev.CreatedAt,
					&parkedAt, &ev.Payload, &headers, &publishedAt)
				return ev, err
			})
		}
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return ParkedEvent{}, fmt.Errorf("admin: event %s in %s: %w", eventID, table, ErrNotFound)
		case err != nil:
			return ParkedEvent{}, fmt.Errorf("admin: read event %s in %s: %w", eventID, table, err)
		case publishedAt != nil:
			return ParkedEvent{}, fmt.Errorf("admin: event %s in %s was published at %s: %w", eventID, table, publishedAt.UTC().Format(time.RFC3339), ErrNotParked)
		case parkedAt == nil:
			return ParkedEvent{}, fmt.Errorf("admin: event %s in %s is waiting to be published (%d failed attempts): %w", eventID, table, ev.Attempts, ErrNotParked)
		}
		ev.ParkedAt = *parkedAt
	}
	if len(headers) > 0 {
		if err := json.Unmarshal(headers, &ev.Headers); err != nil {
			return ParkedEvent{}, fmt.Errorf("admin: event %s in %s: headers are not a JSON object of strings: %w", eventID, table, err)
		}
	}
	return ev, nil
}

// notParked is GetParked's error for an event of a table in cursor mode
// that its parked table does not hold: ErrNotFound, or ErrNotParked with
// its state (delivered, or waiting).
func notParked(ctx context.Context, db Querier, table outbox.Table, eventID uuid.UUID) error {
	var attempts int
	var delivered, found bool
	rows, err := db.Query(ctx, "SELECT attempts, "+tablesql.Delivered(table)+" FROM "+sqlname.Ident(table)+" WHERE event_id = $1", eventID)
	if err == nil {
		_, err = pgx.ForEachRow(rows, []any{&attempts, &delivered}, func() error { found = true; return nil })
	}
	if err == nil && !found {
		err = pgx.ErrNoRows
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("admin: event %s in %s: %w", eventID, table, ErrNotFound)
	case err != nil:
		return fmt.Errorf("admin: read event %s in %s: %w", eventID, table, err)
	case delivered:
		return fmt.Errorf("admin: event %s in %s was published: %w", eventID, table, ErrNotParked)
	}
	return fmt.Errorf("admin: event %s in %s is waiting to be published (%d failed attempts): %w", eventID, table, attempts, ErrNotParked)
}

// Requeue puts the parked events that match f back in line, with their
// attempts reset, ChunkSize at a time, and returns how many it requeued.
// The relay publishes them with its next batches. Per-key order is not
// restored: a requeued event goes out after the events of its key that were
// published while it was parked. The relay sends a requeued event (attempts
// 0 with a last error) on its next claim whatever it remembers of its
// topic, so a requeue right after the fix is not refused. An empty filter
// needs f.All.
//
// In cursor mode each event moves back, in one transaction per chunk: it
// is inserted into the table (a new id from its sequence, the same event
// id, the requeue's transaction id, which the next window of its lane
// takes) and deleted from the parked table. An event whose id the table
// holds again meanwhile (written anew) stays parked.
func Requeue(ctx context.Context, db Querier, table outbox.Table, f Filter, opts *BulkOptions) (int, error) {
	if err := table.Validate(); err != nil {
		return 0, err
	}
	p, err := tablesql.ParkedIn(ctx, db, table)
	if err != nil {
		return 0, fmt.Errorf("admin: requeue parked events in %s: %w", table, err)
	}
	r := parkedRel(p)
	var change string
	switch {
	case p.Moved:
		change = requeueMoved(table, p.Table)
	default:
		set := "parked_at = NULL, attempts = 0"
		if cursor, err := tablesql.InCursorMode(ctx, db, table); err != nil {
			return 0, fmt.Errorf("admin: requeue parked events in %s: %w", table, err)
		} else if cursor {
			// Parked in place by a relay of an older version.
			set += ", txid = pg_current_xact_id()"
		}
		change = updateRows(r, set)
	}
	n, err := bulk(ctx, db, r, change, f, opts)
	if err != nil {
		return n, fmt.Errorf("admin: requeue parked events in %s (%d requeued): %w", table, n, err)
	}
	return n, nil
}

// requeueMoved is Requeue's change of a chunk (c) of the parked table p:
// insert the events into table, in id order, and delete those inserted
// from p. The insert leaves id, txid and published_at to their defaults;
// attempts 0 with the reason as last error marks it requeued (the relay
// sends it whatever it remembers of its topic).
func requeueMoved(table, p outbox.Table) string {
	const cols = "event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, headers, created_at"
	return "i AS (INSERT INTO " + sqlname.Ident(table) + " (" + cols + ", attempts, last_error)" +
		" SELECT x." + strings.ReplaceAll(cols, ", ", ", x.") + ", 0, x.reason FROM " + sqlname.Ident(p) + " x JOIN c ON x.id = c.id ORDER BY x.id" +
		" ON CONFLICT DO NOTHING RETURNING event_id)," +
		" u AS (DELETE FROM " + sqlname.Ident(p) + " x USING i WHERE x.event_id = i.event_id RETURNING 1)"
}

// Delete deletes the parked events that match f, ChunkSize at a time, and
// returns how many it deleted. They are never published. An empty filter
// needs f.All.
func Delete(ctx context.Context, db Querier, table outbox.Table, f Filter, opts *BulkOptions) (int, error) {
	if err := table.Validate(); err != nil {
		return 0, err
	}
	p, err := tablesql.ParkedIn(ctx, db, table)
	if err != nil {
		return 0, fmt.Errorf("admin: delete parked events in %s: %w", table, err)
	}
	r := parkedRel(p)
	n, err := bulk(ctx, db, r, updateRows(r, ""), f, opts)
	if err != nil {
		return n, fmt.Errorf("admin: delete parked events in %s (%d deleted): %w", table, n, err)
	}
	return n, nil
}
