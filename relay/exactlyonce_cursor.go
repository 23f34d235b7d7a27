package relay

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox/relay/internal/cursor"
)

// Exactly once under cursor progress: the claim that takes lanes over and
// writes their recorded positions (see eoAcquire, txnPublisher, eoSettle).

// eoCursorClaim is the ExactlyOnce finder under ProgressCursor: the cursor
// claim's lanes, taken over by the batch's worker (see eoAcquire, which
// writes the position of each lane's last committed progress record to the
// positions table) before their positions are read. The idle lanes' sweep
// (cursor.Engine.Sweep) publishes nothing, so it takes no lane over.
func (r *Relay) eoCursorClaim(ctx context.Context, tx pgx.Tx, n int, held []string, b *eoBatch) (claimed, error) {
	client, err := r.eo.Connect(ctx)
	if err != nil {
		return claimed{}, &kafkaStepError{err}
	}
	b.w, b.started = r.eoTake(client, b), time.Now()
	if err := r.cur.Ready(ctx); err != nil {
		return claimed{}, err
	}
	if err := r.cur.Sweep(ctx); err != nil {
		return claimed{}, err
	}
	owned := make([]int32, 0, len(b.w.Owned))
	for lane := range b.w.Owned {
		owned = append(owned, lane)
	}
	found, seen, heldElsewhere, err := r.cur.Find(ctx, tx, n, owned, nil)
	if err != nil || len(found) == 0 {
		return claimed{heldElsewhere: err == nil && heldElsewhere && seen > 0}, err
	}
	lanes := map[int32]bool{}
	for _, lane := range found {
		lanes[lane] = true
	}
	if c, done, err := r.eoTakeOver(ctx, tx, client, b, lanes); done {
		return c, err
	}
	// A new statement: its snapshot sees the positions eoAcquire wrote.
	cc, err := r.cur.Read(ctx, tx, found, n, held, seen, b.lanes, nil, false)
	c := claimedOf(cc)
	if err != nil {
		return c, err
	}
	b.cur = c.cur
	b.laneOf = make(map[uuid.UUID]int32, len(c.rows))
	for _, x := range c.rows {
		b.laneOf[x.EventID] = c.cur.LaneOf[x.ID]
	}
	b.predicted = map[int32]cursor.Lane{}
	for _, l := range c.cur.Advance(func(id int64) bool { return !c.cur.Held[id] }) {
		b.predicted[l.Lane] = l
	}
	return c, nil
}
