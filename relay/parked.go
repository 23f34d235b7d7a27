package relay

import (
	"context"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/admin"
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
	// ListParked (or `outboxctl parked list`) and put them back with Requeue
	// (`outboxctl parked requeue`) once the cause is fixed.
	Park PoisonPolicy = iota
	// Hold never parks: the event is retried, paced up to MaxBackoff apart
	// (with its attempts and last error recorded), and later events of its
	// key wait behind it, so the key's order is kept at the price of
	// blocking the key; the other keys flow.
	Hold
)

// ParkedEvent is an event the relay set aside (see package admin, which
// also reads its payload and headers).
type ParkedEvent = admin.ParkedEvent

// Querier runs statements: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

var _ admin.Querier = Querier(nil)

// ListParked returns up to limit parked events of table, oldest first,
// without their payloads (limit 0 means admin.DefaultLimit). It is
// admin.ListParked without filters: the outboxctl command (`outboxctl
// parked list`) and package admin filter, page and show payloads.
func ListParked(ctx context.Context, db Querier, table outbox.Table, limit int) ([]ParkedEvent, error) {
	return admin.ListParked(ctx, db, table, admin.Filter{Limit: limit})
}

// Requeue puts parked events back in line, with their attempts reset, and
// returns how many it requeued. A requeued event is published after the
// events of its key already published: per-key order is not restored. It
// is sent on its next claim, also when a relay was told moments ago that
// its topic is missing: fix the cause, then requeue, at once. It
// is admin.Requeue by event ids (`outboxctl parked requeue <id>...`).
func Requeue(ctx context.Context, db Querier, table outbox.Table, eventIDs ...uuid.UUID) (int, error) {
	if len(eventIDs) == 0 {
		return 0, nil
	}
	return admin.Requeue(ctx, db, table, admin.Filter{EventIDs: eventIDs}, nil)
}
