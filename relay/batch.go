package relay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/dberr"
	"github.com/fxoutbox/outbox/internal/parklog"
)

// row is a claimed outbox row.
type row struct {
	id        int64
	eventID   uuid.UUID
	eventType string
	topic     string
	key       string
	payload   []byte
	headers   []byte
	attempts  int
	createdAt time.Time
	// requeued: the row was requeued and has not failed since (attempts 0
	// with a last error): it is sent whatever the relay remembers of its
	// topic.
	requeued bool
}

// RunOnce claims one batch, publishes it, marks what was acknowledged and
// records failures, in one transaction bounded by BatchTimeout. It returns
// the number of events marked published, and an error when the batch as a
// whole failed: a database error, or a publish that failed transiently
// (broker unavailable, timeout) with nothing acknowledged; the caller should
// then back off. A failure of single events is not an error: a permanent
// one (see PermanentError) is charged to its event (attempts, last_error),
// which is parked at once or after MaxAttempts; an event the relay cannot
// read, decode or send is parked at once (both unless Poison is Hold); and a
// failed event and its key wait for their paced retry while the other keys
// flow. RunOnce may run concurrently with other relays on the same table.
func (r *Relay) RunOnce(ctx context.Context) (int, error) {
	n, _, err := r.runOnce(ctx, r.cfg.BatchSize, nil)
	return n, err
}

// batchInfo is what a batch tells the loop besides its counts.
type batchInfo struct {
	// heldElsewhere: the claim took nothing because the lanes of the
	// unpublished events it saw were all held by other relays (or workers).
	heldElsewhere bool
}

// runOnce is RunOnce with a claim of up to size rows. next is the size of
// the claim to run at once, when more events are waiting: twice size after a
// full batch (up to MaxBatchSize), size after a batch that other relays'
// lanes, held keys or failed events cut short; 0 when the relay has caught
// up.
func (r *Relay) runOnce(ctx context.Context, size int, info *batchInfo) (n, next int, err error) {
	n, next, err = r.batch(ctx, size, info)
	if err != nil && !errors.As(err, new(*dbError)) && dberr.Is(err) {
		err = &dbError{err}
	}
	return n, next, err
}

func (r *Relay) batch(ctx context.Context, size int, info *batchInfo) (n, next int, err error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.BatchTimeout)
	defer cancel()
	t := time.Now()
	tx, err := r.db.Begin(ctx)
	if err != nil {
		_, err = r.metrics.lap(ctx, StepClaim, t, fmt.Errorf("relay: begin: %w", err))
		return 0, 0, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	held := r.pacer.held(time.Now(), 2*r.cfg.MaxBackoff)
	c, err := r.claim(ctx, tx, size, held)
	if errors.Is(err, errIsolate) {
		// An Unordered claim met a row it cannot read: start over, reading
		// ids first.
		_ = tx.Rollback(ctx)
		if tx, err = r.db.Begin(ctx); err != nil {
			_, err = r.metrics.lap(ctx, StepClaim, t, fmt.Errorf("relay: begin: %w", err))
			return 0, 0, err
		}
		c, err = r.claimIsolating(ctx, tx, size, held)
	}
	if info != nil {
		info.heldElsewhere = err == nil && c.heldElsewhere
	}
	rows := c.rows
	var badParked []int64
	if err == nil && len(c.bad) > 0 {
		rows, badParked, err = r.chargeUnreadable(ctx, tx, c.bad, rows)
	}
	if t, err = r.metrics.lap(ctx, StepClaim, t, err); err != nil {
		return 0, 0, err
	}
	if len(rows) == 0 {
		if len(c.bad) > 0 {
			if _, err := r.metrics.lap(ctx, StepCommit, t, tx.Commit(ctx)); err != nil {
				return 0, 0, fmt.Errorf("relay: commit: %w", err)
			}
			r.pacer.done(badParked...)
			if c.more {
				next = size
			}
		}
		return 0, next, nil
	}
	d, err := r.deliver(ctx, tx, rows, t, len(c.bad) > 0, badParked, false)
	if err != nil {
		return 0, 0, err
	}
	progress := len(d.ids) > 0 || len(d.failed) > 0 || len(d.transient) > 0 || len(c.bad) > 0
	switch {
	case len(d.ids) == size:
		next = min(2*size, r.cfg.MaxBatchSize)
	case c.more && progress, len(d.failed) > 0 || d.heldBehind:
		// Paced events and their keys are left out of the next claim, so it
		// reaches further; events held behind one parked now, or not sent
		// in this batch, can go at once.
		next = size
	}
	return len(d.ids), next, nil
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

// deliver is the one publish, park and mark path, whatever found the rows
// (a claim, or the stream): it publishes rows (in order, locked or claimed
// in tx by the caller), marks the acknowledged ones published and charges
// the failed ones in tx, commits tx (also when nothing was acknowledged but
// commit is set), logs, counts, and paces the failed events with their
// keys. done lists ids the caller resolved otherwise (parked unreadable
// rows), forgotten by the pacer once tx committed. claimed says the caller
// claimed the rows by marking them published in tx (the stream does): the
// acknowledged ones are left so, the others unmarked. It returns an error when
// the database failed, or when nothing went through because of transient
// failures (the broker, or the way to it, fails: the caller backs off).
func (r *Relay) deliver(ctx context.Context, tx pgx.Tx, rows []row, t time.Time, commit bool, done []int64, claimed bool) (d delivery, err error) {
	msgs, spans, encErrs := r.messages(ctx, rows)
	errs, alone := r.publish(ctx, rows, msgs, encErrs)
	acked := r.metrics.publishLap(ctx, t, rows, errs)
	r.endSpans(spans, msgs, errs)
	d.errs = errs
	for i, err := range errs {
		switch {
		case err == nil:
			d.ids = append(d.ids, rows[i].id)
		case IsPermanent(err):
			d.failed = append(d.failed, i)
		case errors.Is(err, ErrHeld):
			// Waits behind its key's failed event: not a failure of its own.
			d.heldBehind = true
		default:
			d.transient = append(d.transient, i)
		}
	}
	if len(d.ids) > 0 || len(d.failed) > 0 || commit {
		d.parked, err = r.record(ctx, tx, d.ids, rows, errs, d.failed, alone, claimed)
		if t, err = r.metrics.lap(ctx, StepMark, acked, err); err != nil {
			return d, err
		}
		if _, err := r.metrics.lap(ctx, StepCommit, t, tx.Commit(ctx)); err != nil {
			// Acknowledged events will be sent again (same x-event-id).
			return d, fmt.Errorf("relay: commit: %w", err)
		}
		r.logFailures(rows, errs, d.failed, d.parked)
	}
	r.metrics.record(ctx, rows, errs, acked)

	// Pace the events that failed, so they and their keys wait while the
	// rest flows; forget those that were published or parked.
	now := time.Now()
	for _, i := range d.failed {
		if errors.Is(errs[i], sarama.ErrUnknownTopicOrPartition) && r.missing.get(rows[i].topic, now) == nil {
			r.missing.set(rows[i].topic, errs[i], now)
		}
	}
	r.missing.forget(rows, errs)
	r.pacer.done(d.ids...)
	r.pacer.done(done...)
	for _, i := range d.failed {
		if d.parked[rows[i].id] {
			r.pacer.done(rows[i].id)
		} else {
			r.pacer.failed(rows[i].id, rows[i].key, now, r.backoff)
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
			if r.pacer.failed(x.id, x.key, now, r.backoff) == 1 {
				r.cfg.Logger.Warn("outbox relay: event failed while others were published; it and its key are retried with backoff",
					"event_id", x.eventID, "event_type", truncate(x.eventType, 300), "topic", truncate(x.topic, 300), "error", errs[i], "error.type", ErrorType(errs[i]))
			}
		}
	}
	return d, nil
}

// chargeUnreadable charges the rows that cannot be read, without reading
// them: parked at once with what PostgreSQL said and what to do, or, under
// Hold, charged and paced with their keys, whose later rows leave the batch.
// It returns the rows left to publish and the ids parked.
func (r *Relay) chargeUnreadable(ctx context.Context, tx pgx.Tx, bad []unreadable, rows []row) ([]row, []int64, error) {
	ids := make([]int64, len(bad))
	msgs := make([]string, len(bad))
	for i, b := range bad {
		ids[i] = b.id
		msgs[i] = truncate("["+ErrorType(&dbError{b.err})+"] "+unreadableReason(b.err), reasonMax)
	}
	park := r.cfg.Poison != Hold
	type charged struct {
		id      int64
		eventID uuid.UUID
		topic   string
		key     string
		parked  bool
	}
	rs, err := tx.Query(ctx, r.q.unreadable, pgx.NamedArgs{"ids": ids, "errs": msgs, "park": park})
	var res []charged
	if err == nil {
		res, err = pgx.CollectRows(rs, func(row pgx.CollectableRow) (charged, error) {
			var c charged
			err := row.Scan(&c.id, &c.eventID, &c.topic, &c.key, &c.parked)
			return c, err
		})
	}
	if err != nil {
		return nil, nil, fmt.Errorf("relay: park %d unreadable rows: %w", len(bad), err)
	}
	var parked []int64
	heldFrom := map[string]int64{} // Hold: key -> its unreadable row
	now := time.Now()
	for _, c := range res {
		var reason, detail string
		for i, b := range bad {
			if b.id == c.id {
				reason, detail = msgs[i], unreadableDetail(b.err)
			}
		}
		if c.parked {
			parked = append(parked, c.id)
			if r.parkLog.Parked(parklog.Cause{Topic: truncate(c.topic, 300), Reason: reason}) {
				r.cfg.Logger.Error("outbox relay: event parked: its stored row cannot be read; fix the row (or outboxctl parked delete "+c.eventID.String()+"), then outboxctl parked requeue "+c.eventID.String(),
					"event_id", c.eventID, "topic", truncate(c.topic, 300), "reason", reason, "detail", detail)
			}
			continue
		}
		if first, ok := heldFrom[c.key]; !ok || c.id < first {
			heldFrom[c.key] = c.id
		}
		r.pacer.failed(c.id, c.key, now, r.backoff)
		r.cfg.Logger.Warn("outbox relay: event held: its stored row cannot be read (Poison is Hold); its key waits until the row is fixed or deleted",
			"event_id", c.eventID, "topic", truncate(c.topic, 300), "reason", reason, "detail", detail)
	}
	if len(heldFrom) > 0 {
		kept := rows[:0:0]
		for _, x := range rows {
			if first, ok := heldFrom[x.key]; ok && x.id > first {
				continue
			}
			kept = append(kept, x)
		}
		rows = kept
	}
	return rows, parked, nil
}

// isolateMax caps the events that failed before (attempts > 0) one batch
// sends alone first; the rest wait for the next batch. maxSends caps the
// sends one batch spends finding the events that fail a bulk send.
const (
	isolateMax = 10
	maxSends   = 24
)

// publish sends the messages that can be sent and returns each row's
// outcome (nil when acknowledged) and the rows found failing on their own.
//
// A broker rejects a partition's whole record batch for one bad record, so
// a permanent error in a bulk send does not say which event is bad. The
// events that failed so are sent again in two halves, in order, and each
// half that fails is split again, until the events that fail on their own
// are found; only those are charged (one the broker refuses for what it is,
// too large for the topic or an invalid record, is parked at once: see
// record), and the others are published in the same batch. Events that
// failed before (attempts > 0) are sent alone first, up to isolateMax.
// Errors that condemn a whole topic (missing, invalid, unauthorized) are
// charged to each event without that. encErrs holds the rows that could not
// be made into messages (see messages): they are not sent.
//
// After the first failure of a key its later events in the batch are
// ErrHeld: not sent when the failure was known before sending, not marked
// when it was not, so a key is not published around a gap that is filled
// later.
func (r *Relay) publish(ctx context.Context, rows []row, msgs []Message, encErrs []error) (errs []error, alone []int) {
	errs = make([]error, len(rows))
	blocked := map[string]bool{}
	inBulk := map[string]bool{} // keys with an earlier row in bulk
	var bulk []int
	now := time.Now()
	for i, m := range msgs {
		k := rows[i].key
		err := encErrs[i]
		if err == nil {
			err = r.precheck(m)
		}
		if err == nil && !rows[i].requeued {
			// A requeued event is sent: the operator says its cause is
			// fixed (a topic created since), whatever the relay remembers.
			err = r.missing.get(m.Topic, now)
		}
		switch {
		case blocked[k]:
			errs[i] = ErrHeld
		case err != nil:
			errs[i] = err
			blocked[k] = true
		case rows[i].attempts > 0 && len(alone) < isolateMax && !inBulk[k]:
			// Sent before the bulk: only when no earlier row of its key
			// is in it.
			alone = append(alone, i)
			blocked[k] = true
		case rows[i].attempts > 0:
			errs[i] = ErrHeld
			blocked[k] = true
		default:
			bulk = append(bulk, i)
			inBulk[k] = true
		}
	}
	for _, i := range alone {
		if ctx.Err() != nil {
			errs[i] = ctx.Err()
			continue
		}
		r.send(ctx, msgs, []int{i}, errs)
	}
	// The rows in bulk come before any failure of their key found above
	// (the rows after one are ErrHeld already, and a key sent alone has no
	// row in bulk): they are sent.
	sends := 0
	r.resolve(ctx, rows, msgs, bulk, errs, map[string]bool{}, &sends, &alone)
	blocked = map[string]bool{}
	for i := range rows {
		if blocked[rows[i].key] && errs[i] == nil {
			errs[i] = ErrHeld
		}
		if errs[i] != nil {
			blocked[rows[i].key] = true
		}
	}
	return errs, alone
}

// resolve sends the rows g (in order; none of their keys has failed so far)
// and, when some fail permanently but not on their own account, splits
// those in two halves and resolves each, so that every row ends published,
// failed on its own (added to alone), failed with its topic or transiently,
// or ErrHeld behind its key's failure or for want of sends.
func (r *Relay) resolve(ctx context.Context, rows []row, msgs []Message, g []int, errs []error, blocked map[string]bool, sends *int, alone *[]int) {
	h := g[:0:0]
	for _, i := range g {
		if blocked[rows[i].key] {
			errs[i] = ErrHeld
		} else {
			h = append(h, i)
		}
	}
	if len(h) == 0 {
		return
	}
	if *sends >= maxSends || ctx.Err() != nil {
		for _, i := range h {
			errs[i] = ErrHeld
		}
		return
	}
	*sends++
	r.send(ctx, msgs, h, errs)
	var failed []int
	split := map[string]int{} // keys with a row in failed: 1, and then ErrHeld (the rest of the key waits): 2
	for _, i := range h {
		k := rows[i].key
		switch err := errs[i]; {
		case err == nil:
		case blocked[k] || split[k] == 2:
			if IsPermanent(err) { // behind its key's failure: not charged
				errs[i] = ErrHeld
			}
		case IsPermanent(err) && !topicLevel(err):
			failed = append(failed, i)
			split[k] = 1
		case errors.Is(err, ErrHeld) && split[k] == 1:
			// Held by the publisher behind its key's failure, which the
			// split resolves: the rest of the key waits for the next batch.
			split[k] = 2
		default: // transient, held, or its topic's failure: the key stops here
			blocked[k] = true
		}
	}
	switch {
	case len(failed) == 0:
	case len(failed) == 1:
		// The only one of its send to fail: it failed on its own.
		*alone = append(*alone, failed[0])
		blocked[rows[failed[0]].key] = true
	default:
		half := len(failed) / 2
		r.resolve(ctx, rows, msgs, failed[:half], errs, blocked, sends, alone)
		r.resolve(ctx, rows, msgs, failed[half:], errs, blocked, sends, alone)
	}
}

// send publishes msgs[idx...] and stores each outcome in errs.
func (r *Relay) send(ctx context.Context, msgs []Message, idx []int, errs []error) {
	if len(idx) == 0 {
		return
	}
	sub := msgs
	if len(idx) < len(msgs) {
		sub = make([]Message, len(idx))
		for j, i := range idx {
			sub[j] = msgs[i]
		}
	}
	start := time.Now()
	err := r.pub.Publish(ctx, sub)
	var be *BatchError
	for j, i := range idx {
		msgs[i] = sub[j] // with what the publisher reported (Stored, Partition, ...)
		switch {
		case err == nil:
			errs[i] = nil
		case errors.As(err, &be):
			errs[i] = be.Failed[j]
		default:
			errs[i] = err
		}
	}
	r.metrics.sendDone(ctx, msgs, idx, errs, time.Since(start))
}

// record marks the acknowledged events published and counts an attempt on
// each permanently failed one, parking those out of attempts, in one round
// trip. It returns which failed rows were parked.
//
// An event the relay cannot send, that the broker refused when it was sent
// alone for a reason of its own (too large for the topic, an invalid
// record), or whose topic does not exist, is parked at once: no retry
// changes it. (The producer has already waited for the topic's metadata, up
// to Metadata.Retry.Max times, and for 5s after that the relay parks the
// topic's events without sending them; a topic created later finds its
// events parked, and Requeue sends them.) Other permanent failures (no
// authorization for the topic, a policy violation, a publisher's own) are
// charged MaxAttempts times, paced (see pacer), so a cause fixed within
// seconds loses nothing.
func (r *Relay) record(ctx context.Context, tx pgx.Tx, ids []int64, rows []row, errs []error, failed, alone []int, claimed bool) (map[int64]bool, error) {
	b := &pgx.Batch{}
	switch {
	case claimed:
		var back []int64
		for i, err := range errs {
			if err != nil {
				back = append(back, rows[i].id)
			}
		}
		if len(back) > 0 {
			b.Queue(r.q.unmark, back)
		}
	case len(ids) > 0:
		b.Queue(r.q.mark, ids)
	}
	parked := map[int64]bool{}
	if len(failed) > 0 {
		fids := make([]int64, len(failed))
		msgs := make([]string, len(failed))
		limits := make([]int32, len(failed))
		for j, i := range failed {
			fids[j], msgs[j] = rows[i].id, Reason(errs[i], rows[i].topic)
			switch {
			case r.cfg.Poison == Hold:
				limits[j] = 0 // never park
			case errors.Is(errs[i], errCannotSend):
				limits[j] = 1 // can never be sent: park at once
			case slices.Contains(alone, i) && refusedForGood(errs[i]):
				limits[j] = 1 // refused alone, for good: park at once
			case errors.Is(errs[i], sarama.ErrUnknownTopicOrPartition):
				limits[j] = 1 // the topic does not exist: park at once
			default:
				limits[j] = int32(r.cfg.MaxAttempts)
			}
		}
		b.Queue(r.q.attempt, fids, msgs, limits).Query(func(rows pgx.Rows) error {
			var id int64
			var p bool
			_, err := pgx.ForEachRow(rows, []any{&id, &p}, func() error {
				if p {
					parked[id] = true
				}
				return nil
			})
			return err
		})
	}
	if b.Len() == 0 {
		return parked, nil
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("relay: mark %d events published, %d failed: %w", len(ids), len(failed), err)
	}
	return parked, nil
}

// refusedForGood reports an error with which a broker (or the producer)
// refuses one record for what it is: too large for the topic or the
// producer, or an invalid record. Sent alone, such an event can never go.
func refusedForGood(err error) bool {
	var cerr sarama.ConfigurationError
	return errors.Is(err, sarama.ErrMessageSizeTooLarge) || errors.Is(err, sarama.ErrInvalidRecord) ||
		errors.Is(err, sarama.ErrInvalidMessage) || errors.As(err, &cerr)
}

func (r *Relay) logFailures(rows []row, errs []error, failed []int, parked map[int64]bool) {
	for _, i := range failed {
		x := rows[i]
		// Stored fields are cut: a row written by hand may hold anything.
		eventType, topic := truncate(x.eventType, 300), truncate(x.topic, 300)
		if parked[x.id] {
			reason := Reason(errs[i], x.topic)
			if !r.parkLog.Parked(parklog.Cause{Topic: topic, Reason: reason}) {
				continue // counted in the cause's summary (see ParkedLogFirst)
			}
			r.cfg.Logger.Error("outbox relay: event parked: it cannot be published and no longer blocks its key; see it with outboxctl parked show "+
				x.eventID.String()+", fix the cause, then outboxctl parked requeue (or delete) it",
				"event_id", x.eventID, "event_type", eventType, "topic", topic, "reason", reason, "error", errs[i], "error.type", ErrorType(errs[i]))
		} else {
			reason := Reason(errs[i], x.topic)
			if !r.failedLog.Parked(parklog.Cause{Topic: topic, Reason: reason}) {
				continue // counted in the cause's summary
			}
			r.cfg.Logger.Warn("outbox relay: event failed permanently; retrying until MaxAttempts, then parking it",
				"event_id", x.eventID, "event_type", eventType, "topic", topic, "reason", reason, "error", errs[i], "error.type", ErrorType(errs[i]))
		}
	}
}

// truncate cuts s to at most n bytes, on a character boundary (the text
// goes into a PostgreSQL text column, which refuses broken UTF-8).
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// messages turns rows into Kafka messages, each with a publish span whose
// parent is the trace context stored with its event. A row whose stored
// headers are not a JSON object of strings gets a permanent error in
// encErrs instead of a message: it is parked (or held), never sent with its
// headers changed.
func (r *Relay) messages(ctx context.Context, rows []row) (msgs []Message, spans []trace.Span, encErrs []error) {
	msgs = make([]Message, len(rows))
	spans = make([]trace.Span, len(rows))
	encErrs = make([]error, len(rows))
	for i, x := range rows {
		stored, err := storedHeaders(x.headers)
		if err != nil {
			encErrs[i] = Permanent(fmt.Errorf("%w: %w", errCannotSend, headersError{err}))
		}
		parent := r.cfg.Propagator.Extract(ctx, propagation.MapCarrier(stored))
		eventID := x.eventID.String()
		_, span := r.tracer.Start(parent, "publish "+x.topic,
			trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(
				semconv.MessagingSystemKafka,
				semconv.MessagingOperationName("publish"),
				semconv.MessagingOperationTypeSend,
				semconv.MessagingDestinationName(x.topic),
				semconv.MessagingMessageID(eventID),
				semconv.MessagingKafkaMessageKey(x.key),
			))
		spans[i] = span
		ce := r.cfg.CloudEvents.Mode == outbox.CloudEventsBinary
		hs := make([]Header, 0, len(stored)+10)
		for k, v := range stored {
			if !outbox.IsReservedHeader(k) && (!ce || !outbox.IsCloudEventsHeader(k)) {
				hs = append(hs, Header{Key: k, Value: []byte(v)})
			}
		}
		hs = append(hs,
			Header{Key: outbox.HeaderEventID, Value: []byte(eventID)},
			Header{Key: outbox.HeaderEventType, Value: []byte(x.eventType)})
		if ce {
			hs = append(hs, r.cloudEventsHeaders(x, eventID)...)
		}
		tc := propagation.MapCarrier{}
		r.cfg.Propagator.Inject(trace.ContextWithSpan(parent, span), tc)
		for k, v := range tc {
			hs = append(hs, Header{Key: k, Value: []byte(v)})
		}
		msgs[i] = Message{EventID: x.eventID, Topic: x.topic, Key: []byte(x.key), Value: x.payload, Headers: hs}
	}
	return msgs, spans, encErrs
}

// cloudEventsHeaders returns the headers of the CloudEvents Kafka protocol
// binding's binary content mode for row x, whose id is eventID: the
// required attributes, time, and the payload's content type. Key and value
// are the record's own.
func (r *Relay) cloudEventsHeaders(x row, eventID string) []Header {
	return []Header{
		{Key: outbox.HeaderCloudEventsSpecVersion, Value: []byte(outbox.CloudEventsSpecVersion)},
		{Key: outbox.HeaderCloudEventsID, Value: []byte(eventID)},
		{Key: outbox.HeaderCloudEventsSource, Value: []byte(r.cfg.CloudEvents.Source)},
		{Key: outbox.HeaderCloudEventsType, Value: []byte(x.eventType)},
		{Key: outbox.HeaderCloudEventsTime, Value: []byte(x.createdAt.UTC().Format(time.RFC3339Nano))},
		{Key: outbox.HeaderContentType, Value: []byte(outbox.CloudEventsContentType)},
	}
}

// storedHeaders decodes a row's headers column: a JSON object of strings,
// or SQL NULL or JSON null for none. The unit of work writes nothing else;
// a row written by hand may hold anything.
func storedHeaders(raw []byte) (map[string]string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	bad := func(what string) error {
		return fmt.Errorf("stored headers are %s, not a JSON object of strings: set the row's headers to such an object (or NULL), then requeue it", what)
	}
	if raw[0] != '{' {
		return nil, bad("a JSON " + jsonKind(raw[0]))
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, bad("invalid JSON")
	}
	out := make(map[string]string, len(obj))
	for k, v := range obj {
		var s string
		if len(v) == 0 {
			return nil, bad("invalid JSON")
		}
		if v[0] != '"' || json.Unmarshal(v, &s) != nil {
			return nil, bad(fmt.Sprintf("an object whose header %s is a JSON %s", strconv.Quote(truncate(k, 64)), jsonKind(v[0])))
		}
		out[k] = s
	}
	return out, nil
}

func jsonKind(c byte) string {
	switch {
	case c == '[':
		return "array"
	case c == '{':
		return "object"
	case c == '"':
		return "string"
	case c == 't' || c == 'f':
		return "boolean"
	case c == 'n':
		return "null"
	default:
		return "number"
	}
}

func (r *Relay) endSpans(spans []trace.Span, msgs []Message, errs []error) {
	for i, s := range spans {
		s.SetAttributes(spanOutcome(r.pub, msgs[i], errs[i])...)
		if e := errs[i]; e != nil {
			s.RecordError(e)
			s.SetStatus(codes.Error, e.Error())
		}
		s.End()
	}
}
