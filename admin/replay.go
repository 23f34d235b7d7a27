package admin

import (
	"context"
	"fmt"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/tablesql"
)

// Replay makes the relays publish again the published events that match f,
// for a consumer that lost data: it sets their published_at back to NULL
// (and their attempts to 0), ChunkSize rows per statement in id order, and
// returns how many it reset. An empty filter needs f.All. Only events still
// in the table can be replayed: the relay deletes published rows after its
// Retention (default 72h).
//
// What consumers see:
//
//   - Duplicates: a replayed event is the same event, with the same
//     x-event-id header. A consumer that drops ids it has seen (the inbox
//     does, per consumer name) drops it; to make such a consumer apply it
//     again, remove its record of the event first. Every other consumer of
//     the topic receives it a second time.
//   - Order: per key, the replayed events go out in their original order
//     (the relay claims by id), but after the newer events of the key that
//     were already delivered; and they interleave with new writes by id
//     order. A consumer that keeps only the latest state per key must not
//     apply an older replayed event over a newer one.
//   - Load: the relay claims the oldest unpublished rows first, so a large
//     replay delays events written meanwhile until it has drained; replay
//     in ranges (f.Since/Until, FromID/ToID) to spread it.
//
// Parked events are not replayed (requeue them).
//
// Replay leaves a last error on each row, "[outbox.replayed] …", with its
// attempts at 0, as a requeue does: a relay in exactly-once delivery that
// takes a lane over marks the events of the lane's last Kafka transaction
// published, but not one so replayed since.
func Replay(ctx context.Context, db Querier, table outbox.Table, f Filter, opts *BulkOptions) (int, error) {
	st, change := published, "published_at = NULL, attempts = 0, last_error = '"+replayedReason+"'"
	if cursor, err := tablesql.InCursorMode(ctx, db, table); err != nil {
		return 0, fmt.Errorf("admin: replay published events in %s: %w", table, err)
	} else if cursor {
		st, change = cursorState(table, published), change+", txid = pg_current_xact_id()"
	}
	r := in(table, st)
	n, err := bulk(ctx, db, r, updateRows(r, change), f, opts)
	if err != nil {
		return n, fmt.Errorf("admin: replay published events in %s (%d reset): %w", table, n, err)
	}
	return n, nil
}

// replayedReason is the last_error Replay leaves on the rows it resets.
const replayedReason = "[outbox.replayed] replayed by an operator: the relay sends it again"

// CountPublished returns how many published events match f (at most
// f.Limit, when set): what Replay with f would reset. Without an id range
// or a time range it reads the whole table.
func CountPublished(ctx context.Context, db Querier, table outbox.Table, f Filter) (int, error) {
	st := published
	if cursor, err := tablesql.InCursorMode(ctx, db, table); err != nil {
		return 0, fmt.Errorf("admin: count published events in %s: %w", table, err)
	} else if cursor {
		st = cursorState(table, published)
	}
	n, err := count(ctx, db, in(table, st), f)
	if err != nil {
		return 0, fmt.Errorf("admin: count published events in %s: %w", table, err)
	}
	return n, nil
}
