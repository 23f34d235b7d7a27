package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/parklog"
	"github.com/fxoutbox/outbox/internal/textcut"
	"github.com/fxoutbox/outbox/relay/internal/claim"
	"github.com/fxoutbox/outbox/relay/internal/cursor"
	"github.com/fxoutbox/outbox/relay/internal/failure"
	"github.com/fxoutbox/outbox/relay/internal/marks"
)

// finder finds a batch's rows in the batch's transaction: the polling
// claim (lanes, see claim), or the stream's claim of the streamed ids (see
// streamer.claim). isolate is set when the batch starts over in a new
// transaction because the finder returned marks.ErrIsolate.
type finder func(ctx context.Context, tx pgx.Tx, isolate bool) (claimed, error)

// pipeline is the one batch path, whatever finds the rows: in one
// transaction bounded by BatchTimeout, find claims the rows (locking them,
// or their lanes first and reading them in a new statement), the rows that
// cannot be read are charged (parked) under a savepoint without being
// read, and deliver publishes the rest, parks and marks (marks only for
// acknowledged events) and commits. It returns what find claimed and what
// deliver did (nothing when there was nothing to publish); an error when
// the database failed or nothing went through (see deliver), and
// errNotVisible, untouched and without counting a failed step, when the
// stream's finder asks to be run again.
func (r *Relay) pipeline(ctx context.Context, find finder) (c claimed, d delivery, err error) {
	return r.pipelineOn(ctx, r.db, find)
}

// pipelineOn is pipeline with the transaction begun on db (a worker's
// connection that keeps cursor lanes, see cursor.Keeper).
func (r *Relay) pipelineOn(ctx context.Context, db DB, find finder) (c claimed, d delivery, err error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.BatchTimeout)
	defer cancel()
	t := time.Now()
	tx, err := db.Begin(ctx)
	if err != nil {
		_, err = r.metrics.lap(ctx, StepClaim, t, fmt.Errorf("relay: begin: %w", err))
		return c, d, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if r.cur != nil {
		// The relay's copy of the positions takes what the batch
		// committed, or is read again after a failure.
		defer func() {
			switch {
			case c.cur != nil && (err == nil || c.cur.Committed):
				r.cur.Committed(ctx, c.cur)
			case err != nil:
				r.cur.Forget()
				if k, ok := db.(*cursor.Keeper); ok {
					k.Drop(ctx) // its kept positions may be lost: start from the rows
				}
			}
		}()
	}

	c, err = find(ctx, tx, false)
	if errors.Is(err, marks.ErrIsolate) {
		// The claim met a row it cannot read: start over, reading ids first.
		_ = tx.Rollback(ctx)
		if tx, err = db.Begin(ctx); err != nil {
			_, err = r.metrics.lap(ctx, StepClaim, t, fmt.Errorf("relay: begin: %w", err))
			return c, d, err
		}
		c, err = find(ctx, tx, true)
	}
	if errors.Is(err, errNotVisible) {
		return c, d, err
	}
	rows := c.rows
	var badParked []int64
	if err == nil && len(c.bad) > 0 {
		var kept []claim.Row
		kept, badParked, err = r.chargeUnreadable(ctx, tx, c.bad, rows)
		if c.cur != nil {
			c.cur.Parked = badParked
		}
		if !c.marked {
			// Rows claimed by marking them are delivered whatever: those
			// not acknowledged get their mark taken back.
			rows = kept
		}
	}
	if t, err = r.metrics.lap(ctx, StepClaim, t, err); err != nil {
		return c, d, err
	}
	if len(rows) == 0 {
		if c.cur != nil && (len(c.cur.IDs) == 0 || len(c.bad) > 0) {
			// Lanes whose windows held nothing close them; lanes past
			// rows that were parked move on.
			b := &pgx.Batch{}
			r.cur.Save(ctx, b, c.cur, nil, nil, nil)
			if b.Len() == 0 && len(c.bad) == 0 {
				return c, d, nil // nothing moved
			}
			if b.Len() > 0 {
				if err := tx.SendBatch(ctx, b).Close(); err != nil {
					_, err = r.metrics.lap(ctx, StepMark, t, fmt.Errorf("relay: save the lanes' positions: %w", err))
					return c, d, err
				}
			}
			if _, err := r.metrics.lap(ctx, StepCommit, t, tx.Commit(ctx)); err != nil {
				return c, d, fmt.Errorf("relay: commit: %w", err)
			}
			c.cur.Committed = true
			r.pacer.Done(badParked...)
			return c, d, nil
		}
		if len(c.bad) > 0 {
			if _, err := r.metrics.lap(ctx, StepCommit, t, tx.Commit(ctx)); err != nil {
				return c, d, fmt.Errorf("relay: commit: %w", err)
			}
			r.pacer.Done(badParked...)
		}
		return c, d, nil
	}
	d, err = r.deliver(ctx, tx, rows, t, len(c.bad) > 0 || c.cur != nil, badParked, c.marked, c.eo, c.cur)
	return c, d, err
}

// delivery is what deliver did with a batch's rows.
type delivery struct {
	errs       []error // each row's outcome: nil when published
	ids        []int64 // published and marked
	failed     []int   // permanent failures (charged, maybe parked)
	transient  []int   // transient failures (paced, left unpublished)
	parked     map[int64]bool
	heldBehind bool // some row waits behind its key's failure
}

// deliver is the pipeline's publish, park, mark and commit: it publishes
// rows (in order, locked or claimed in tx by the finder), marks the
// acknowledged ones published and charges the failed ones in tx, commits
// tx (also when nothing was acknowledged but commit is set), logs, counts,
// and paces the failed events with their keys. done lists ids the caller
// resolved otherwise (parked unreadable rows), forgotten by the pacer once
// tx committed. marked says the finder claimed the rows by marking them
// published in tx (the stream does): the acknowledged ones are left so,
// the others unmarked. It returns an error when the database failed, or
// when nothing went through because of transient failures (the broker, or
// the way to it, fails: the caller backs off).
func (r *Relay) deliver(ctx context.Context, tx pgx.Tx, rows []claim.Row, t time.Time, commit bool, done []int64, marked bool, eo *eoBatch, cur *cursor.Batch) (d delivery, err error) {
	msgs, spans, encErrs := r.messages(ctx, rows)
	pub := r.pub
	if eo != nil {
		pub = txnPublisher{r, eo}
	}
	errs, alone := r.publish(ctx, pub, rows, msgs, encErrs)
	if eo != nil {
		// Commit the Kafka transaction (with the lane's progress) before
		// the marks; if it does not commit, nothing was published.
		r.eoSettle(ctx, eo, rows, errs)
	}
	acked := r.metrics.publishLap(ctx, t, rows, errs)
	r.endSpans(spans, msgs, errs)
	d.errs = errs
	for i, err := range errs {
		switch {
		case err == nil:
			d.ids = append(d.ids, rows[i].ID)
		case outbox.IsPermanent(err):
			d.failed = append(d.failed, i)
		case errors.Is(err, ErrHeld):
			// Waits behind its key's failed event: not a failure of its own.
			d.heldBehind = true
		default:
			d.transient = append(d.transient, i)
		}
	}
	if len(d.ids) > 0 || len(d.failed) > 0 || commit {
		reasons := make([]string, len(d.failed)) // the stored reason of each failed row, also logged
		for j, i := range d.failed {
			reasons[j] = failure.Reason(errs[i], rows[i].Topic)
		}
		d.parked, err = r.record(ctx, tx, d.ids, rows, errs, d.failed, reasons, alone, marked, cur)
		if t, err = r.metrics.lap(ctx, StepMark, acked, err); err != nil {
			return d, err
		}
		if _, err := r.metrics.lap(ctx, StepCommit, t, tx.Commit(ctx)); err != nil {
			// Acknowledged events will be sent again (same x-event-id).
			return d, fmt.Errorf("relay: commit: %w", err)
		}
		if cur != nil {
			cur.Committed = true
		}
		r.logFailures(rows, errs, d.failed, reasons, d.parked)
	}
	r.metrics.record(ctx, rows, errs, acked)

	// Pace the events that failed, so they and their keys wait while the
	// rest flows; forget those that were published or parked.
	now := time.Now()
	for _, i := range d.failed {
		r.missing.Report(rows[i].Topic, errs[i], now)
	}
	r.missing.Forget(publishedTopics(errs, func(i int) string { return rows[i].Topic }))
	r.pacer.Done(d.ids...)
	r.pacer.Done(done...)
	for _, i := range d.failed {
		if d.parked[rows[i].ID] {
			r.pacer.Done(rows[i].ID)
		} else {
			r.pacer.Failed(rows[i].ID, rows[i].Key, now, r.backoff)
		}
	}
	if len(d.transient) > 0 {
		first := errs[d.transient[0]]
		if len(d.ids) == 0 {
			// Nothing went through: the broker (or the way to it) fails,
			// not an event. The relay backs off.
			return d, fmt.Errorf("relay: %d of %d events not published: %w", len(d.transient), len(rows), first)
		}
		for _, i := range d.transient {
			x := rows[i]
			if r.pacer.Failed(x.ID, x.Key, now, r.backoff) == 1 {
				r.cfg.Logger.Warn("outbox relay: event failed while others were published; it and its key are retried with backoff",
					"event_id", x.EventID, "event_type", textcut.Cut(x.EventType, logFieldMax), "topic", textcut.Cut(x.Topic, logFieldMax), "error", errs[i], "error.type", failure.Type(errs[i]))
			}
		}
	}
	return d, nil
}

// chargeUnreadable charges the rows that cannot be read, without reading
// them: parked at once with what PostgreSQL said and what to do, or, under
// Hold, charged and paced with their keys, whose later rows leave the batch.
// It returns the rows left to publish and the ids parked.
func (r *Relay) chargeUnreadable(ctx context.Context, tx pgx.Tx, bad []claim.Unreadable, rows []claim.Row) ([]claim.Row, []int64, error) {
	ids := make([]int64, len(bad))
	msgs := make([]string, len(bad))
	for i, b := range bad {
		ids[i] = b.ID
		msgs[i] = textcut.Cut("["+failure.Type(&failure.DBStep{Err: b.Err})+"] "+failure.UnreadableReason(b.Err), failure.ReasonMax)
	}
	park := r.cfg.Poison != outbox.Hold
	type charged struct {
		id      int64
		eventID uuid.UUID
		topic   string
		key     string
		parked  bool
	}
	var res []charged
	collect := func(rs pgx.Rows) (err error) {
		res, err = pgx.CollectRows(rs, func(row pgx.CollectableRow) (charged, error) {
			var c charged
			err := row.Scan(&c.id, &c.eventID, &c.topic, &c.key, &c.parked)
			return c, err
		})
		return err
	}
	err := r.prog.chargeUnreadable(ctx, tx, unreadableCharge{bad: bad, ids: ids, msgs: msgs, park: park}, collect)
	if err != nil {
		return nil, nil, fmt.Errorf("relay: park %d unreadable rows: %w", len(bad), err)
	}
	at := make(map[int64]int, len(bad)) // id -> its place in bad and msgs
	for i, b := range bad {
		at[b.ID] = i
	}
	var parked []int64
	heldFrom := map[string]int64{} // Hold: key -> its unreadable row
	now := time.Now()
	for _, c := range res {
		i := at[c.id]
		reason, detail := msgs[i], failure.UnreadableDetail(bad[i].Err)
		if c.parked {
			parked = append(parked, c.id)
			if r.parkLog.Parked(parklog.Cause{Topic: textcut.Cut(c.topic, logFieldMax), Reason: reason}) {
				r.cfg.Logger.Error("outbox relay: event parked: its stored row cannot be read; fix the row (or outboxctl parked delete "+c.eventID.String()+"), then outboxctl parked requeue "+c.eventID.String(),
					"event_id", c.eventID, "topic", textcut.Cut(c.topic, logFieldMax), "reason", reason, "detail", detail)
			}
			continue
		}
		if first, ok := heldFrom[c.key]; !ok || c.id < first {
			heldFrom[c.key] = c.id
		}
		r.pacer.Failed(c.id, c.key, now, r.backoff)
		r.cfg.Logger.Warn("outbox relay: event held: its stored row cannot be read (Poison is Hold); its key waits until the row is fixed or deleted",
			"event_id", c.eventID, "topic", textcut.Cut(c.topic, logFieldMax), "reason", reason, "detail", detail)
	}
	if len(heldFrom) > 0 {
		kept := rows[:0:0]
		for _, x := range rows {
			if first, ok := heldFrom[x.Key]; ok && x.ID > first {
				continue
			}
			kept = append(kept, x)
		}
		rows = kept
	}
	return rows, parked, nil
}

// record marks the acknowledged events published and counts an attempt on
// each permanently failed one, parking those out of attempts, in one round
// trip, with reasons[j] as the reason of rows[failed[j]]. It returns which
// failed rows were parked.
//
// An event the relay cannot send, that the broker refused when it was sent
// alone for a reason of its own (too large for the topic, an invalid
// record), or whose topic does not exist, is parked at once: no retry
// changes it. (The producer has already waited for the topic's metadata, up
// to Metadata.Retry.Max times, and for 5s after that the relay parks the
// topic's events without sending them; a topic created later finds its
// events parked, and Requeue sends them.) Other permanent failures (no
// authorization for the topic, a policy violation, a publisher's own) are
// charged MaxAttempts times, paced (see pace.Pacer), so a cause fixed within
// seconds loses nothing.
func (r *Relay) record(ctx context.Context, tx pgx.Tx, ids []int64, rows []claim.Row, errs []error, failed []int, reasons []string, alone []int, marked bool, cur *cursor.Batch) (map[int64]bool, error) {
	rec := recording{ids: ids, rows: rows, errs: errs, failed: failed, reasons: reasons, marked: marked, cur: cur}
	if len(failed) > 0 {
		rec.fids, rec.limits = make([]int64, len(failed)), make([]int32, len(failed))
		for j, i := range failed {
			rec.fids[j] = rows[i].ID
			rec.limits[j] = r.parkLimit(errs[i], slices.Contains(alone, i))
		}
	}
	return r.prog.record(ctx, tx, rec)
}

// parkLimit is the attempts after which an event that failed permanently
// with err is parked (0: never, under Hold); alone says it failed when sent
// alone.
func (r *Relay) parkLimit(err error, alone bool) int32 {
	switch {
	case r.cfg.Poison == outbox.Hold:
		return 0 // never park
	case errors.Is(err, failure.ErrCannotSend):
		return 1 // can never be sent: park at once
	case alone && refusedForGood(err):
		return 1 // refused alone, for good: park at once
	case errors.Is(err, sarama.ErrUnknownTopicOrPartition):
		return 1 // the topic does not exist: park at once
	}
	return int32(r.cfg.MaxAttempts)
}

// lastErrorMax is how much of a parked event's last error (beside its
// reason) the parked table keeps.
const lastErrorMax = 4000

// refusedForGood reports an error with which a broker (or the producer)
// refuses one record for what it is: too large for the topic or the
// producer, or an invalid record. Sent alone, such an event can never go.
func refusedForGood(err error) bool {
	var cerr sarama.ConfigurationError
	return errors.Is(err, sarama.ErrMessageSizeTooLarge) || errors.Is(err, sarama.ErrInvalidRecord) ||
		errors.Is(err, sarama.ErrInvalidMessage) || errors.As(err, &cerr)
}

func (r *Relay) logFailures(rows []claim.Row, errs []error, failed []int, reasons []string, parked map[int64]bool) {
	for j, i := range failed {
		x, reason := rows[i], reasons[j]
		// Stored fields are cut: a row written by hand may hold anything.
		eventType, topic := textcut.Cut(x.EventType, logFieldMax), textcut.Cut(x.Topic, logFieldMax)
		if parked[x.ID] {
			if !r.parkLog.Parked(parklog.Cause{Topic: topic, Reason: reason}) {
				continue // counted in the cause's summary (see newParkLog)
			}
			r.cfg.Logger.Error("outbox relay: event parked: it cannot be published and no longer blocks its key; see it with outboxctl parked show "+
				x.EventID.String()+", fix the cause, then outboxctl parked requeue (or delete) it",
				"event_id", x.EventID, "event_type", eventType, "topic", topic, "reason", reason, "error", errs[i], "error.type", failure.Type(errs[i]))
		} else {
			if !r.failedLog.Parked(parklog.Cause{Topic: topic, Reason: reason}) {
				continue // counted in the cause's summary
			}
			r.cfg.Logger.Warn("outbox relay: event failed permanently; retrying until MaxAttempts, then parking it",
				"event_id", x.EventID, "event_type", eventType, "topic", topic, "reason", reason, "error", errs[i], "error.type", failure.Type(errs[i]))
		}
	}
}
