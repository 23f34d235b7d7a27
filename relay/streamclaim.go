package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox/relay/internal/claim"
)

// publish handles the ready rows as one batch and confirms their end.
//
// In one transaction it locks the lanes of the rows' keys (try-locks, as
// polling relays do, so that a relay polling during a switch of modes never
// publishes a key at the same time), and reads, in a new statement, which
// rows are still unpublished and which keys have an older unpublished row
// outside the batch. Rows published meanwhile (by the sweep, a polling
// relay, or before a restart that made the server send them again) are
// skipped; rows whose lane another relay holds, or whose key waits behind
// an older row (failed and waiting for its retry, requeued, or written
// before the slot existed), are left in the table for the sweep, which
// publishes them in order. The rest goes through the one publish, park and
// mark path. The position is confirmed once the transaction committed.
func (s *streamer) publish(ctx context.Context) error {
	// The server sends a transaction once its commit record is flushed,
	// which is a moment before the transaction is visible to other
	// sessions' snapshots: a row the claim cannot see yet is waited for,
	// up to visibleWait after its transaction committed. A row of an older
	// transaction that is missing was deleted (the stream is replaying what
	// retention has removed since) and is not waited for, or a batch of
	// them would wait visibleWait each.
	var deadline time.Time
	for _, x := range s.ready[:min(len(s.ready), s.r.cfg.MaxBatchSize)] {
		if x.visibleBy.After(deadline) {
			deadline = x.visibleBy
		}
	}
	for attempt, wait := 0, 200*time.Microsecond; ; attempt, wait = attempt+1, min(2*wait, 50*time.Millisecond) {
		err := s.publishOnce(ctx, attempt, time.Now().After(deadline))
		if !errors.Is(err, errNotVisible) {
			return err
		}
		if !s.r.sleep(wait, nil) {
			return nil
		}
	}
}

// visibleWait bounds the wait for streamed rows to become visible, from
// their transaction's commit (server's clock); rows still missing after it
// were deleted (by an operator, or by the retention of published rows when
// the stream is that far behind) and are skipped, and a sweep follows for
// any that was merely slow to become visible.
const visibleWait = 5 * time.Second

// visibleRetries is how many times an Unordered batch is claimed again
// when a row it did not claim is unpublished (its transaction not visible
// yet, or a polling relay holds the row); after that it is left to the
// sweep. Under PerKey the claim knows which: it waits for a row that is
// not visible yet (up to visibleWait) and leaves at once a row whose lane
// another relay holds or whose key waits.
const visibleRetries = 3

// errNotVisible says a streamed row is not visible to the claim yet.
var errNotVisible = errors.New("relay: streamed row not visible yet")

// publishOnce runs one batch of the ready rows through the pipeline, with
// the stream's claim as the finder, then drops them from ready and, once
// none is left, confirms their end.
func (s *streamer) publishOnce(ctx context.Context, attempt int, skipMissing bool) error {
	r := s.r
	// At most MaxBatchSize rows a batch: a transaction that wrote more is
	// published in several, in order, and its end confirmed after the last.
	rows := s.ready[:min(len(s.ready), r.cfg.MaxBatchSize)]
	c, d, err := r.pipeline(ctx, func(ctx context.Context, tx pgx.Tx, _ bool) (claimed, error) {
		return s.claim(ctx, tx, rows, attempt, skipMissing)
	})
	if c.deferred {
		s.needSweep = true
	}
	if err != nil {
		// Not visible yet (claimed again), the database failed (nothing is
		// confirmed; on the next connection the table's waiting rows go
		// first), or nothing went through: the batch is tried again after
		// a backoff, its failed events (paced now) left to the sweep.
		return err
	}
	if len(d.transient) > 0 || len(d.failed) > 0 || d.heldBehind {
		s.needSweep = true
	}
	s.ready = append(s.ready[:0], s.ready[len(rows):]...)
	if len(s.ready) > 0 {
		return nil
	}
	s.conn.Confirm(s.readyTo)
	r.stream.oldest.Store(0)
	// The position reaches the server with the next status report, within
	// StatusInterval: a report per batch would cost the server a wake-up
	// of its walsender per batch, and the position matters only to what a
	// restart sends again (rows already published are skipped).
	return nil
}

// claim claims the batch's rows in one statement (streamClaim): it marks
// published, in tx, the rows still unpublished whose lane this transaction
// holds or gets (try-locks, as polling relays take lanes, so that a relay
// polling during a switch of modes never publishes a key at the same time)
// and whose key has no older unpublished row outside the batch. An UPDATE
// re-checks a row another transaction changed after its snapshot, so a row
// a polling relay published meanwhile is not claimed again. Rows of keys
// the pacer holds, and rows that could not be decoded, are not claimed.
//
// It returns the rows to publish (claimed, in stream order), the rows to
// park unread, and whether rows were left to the sweep (deferred). It returns
// errNotVisible when a row is missing (its transaction not yet visible;
// unless skipMissing), or when a row it left is unpublished and would have
// been claimed (its transaction became visible just after the claim's
// snapshot); under Unordered, where it cannot tell, on the first
// visibleRetries attempts.
func (s *streamer) claim(ctx context.Context, tx pgx.Tx, rows []streamRow, attempt int, skipMissing bool) (c claimed, err error) {
	c.marked = true
	r := s.r
	held := map[string]bool{}
	for _, k := range r.heldKeys() {
		held[k] = true
	}
	ids := make([]int64, 0, len(rows))
	for _, x := range rows {
		switch {
		case x.ID == 0:
		case x.bad != nil:
			c.bad = append(c.bad, claim.Unreadable{ID: x.ID, Err: x.bad})
		case held[x.Key]:
			c.deferred = true
		default:
			ids = append(ids, x.ID)
		}
	}
	if len(ids) == 0 {
		return c, nil
	}
	took := make(map[int64]bool, len(ids))
	b := &pgx.Batch{}
	b.Queue(r.txSettings, r.idleMillis)
	sql, args := r.q.StreamClaim, pgx.NamedArgs{"ids": ids, "batch": ids, "ns": r.q.ns, "lanes": r.cfg.Lanes, "top": slices.Max(ids)}
	if r.cfg.Ordering == Unordered {
		sql, args = r.q.StreamClaimUnordered, pgx.NamedArgs{"ids": ids}
	}
	b.Queue(sql, args).Query(func(rs pgx.Rows) error {
		var id int64
		_, err := pgx.ForEachRow(rs, []any{&id}, func() error { took[id] = true; return nil })
		return err
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return claimed{}, fmt.Errorf("relay: claim streamed rows in %s: %w", r.cfg.Table, err)
	}
	if len(took) < len(ids) {
		var rest []int64
		for _, id := range ids {
			if !took[id] {
				rest = append(rest, id)
			}
		}
		type state struct{ pending, claimable bool }
		states := map[int64]state{} // the present rows
		sql, args := r.q.StreamState, pgx.NamedArgs{"ids": rest, "batch": ids, "ns": r.q.ns, "lanes": r.cfg.Lanes, "top": slices.Max(ids)}
		if r.cfg.Ordering == Unordered {
			sql, args = r.q.StreamStateUnordered, pgx.NamedArgs{"ids": rest}
		}
		rs, err := tx.Query(ctx, sql, args)
		if err == nil {
			var id int64
			var st state
			_, err = pgx.ForEachRow(rs, []any{&id, &st.pending, &st.claimable}, func() error { states[id] = st; return nil })
		}
		if err != nil {
			return claimed{}, fmt.Errorf("relay: claim streamed rows in %s: %w", r.cfg.Table, err)
		}
		var missing []int64
		defer func() {
			if len(missing) > 0 && err == nil {
				// Gone (deleted after another relay published them), or, with
				// the relay's clock far ahead of the server's, not visible
				// yet: then the sweep publishes them.
				r.cfg.Logger.Warn("outbox relay: streamed events are missing from the table (deleted by retention or by hand, or not visible yet); skipped, a sweep follows",
					"table", r.cfg.Table.String(), "events", len(missing), "first_id", missing[0])
				c.deferred = true
			}
		}()
		for _, id := range rest {
			st, present := states[id]
			switch {
			case !present && !skipMissing, st.pending && st.claimable && !skipMissing,
				st.pending && r.cfg.Ordering == Unordered && attempt < visibleRetries:
				// Not visible yet to the claim (or, under Unordered,
				// perhaps locked by a polling relay): claim again.
				return claimed{}, errNotVisible
			case !present:
				missing = append(missing, id)
			case st.pending:
				// Another relay holds the lane, or the key waits behind
				// an older row: the sweep publishes it, in order.
				c.deferred = true
			}
		}
	}
	for _, x := range rows {
		if took[x.ID] {
			c.rows = append(c.rows, x.Row)
		}
	}
	return c, nil
}
