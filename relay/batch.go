package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/fxoutbox/outbox"
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
}

// RunOnce claims one batch, publishes it, marks what was acknowledged and
// records permanent failures, in one transaction bounded by BatchTimeout. It
// returns the number of events marked published, and an error when a
// failure left events to retry: a transient one (broker unavailable,
// timeout, database error), or a permanent one (see PermanentError) that was
// recorded on its event (attempts, last_error) but has attempts left; the
// caller should then back off. An event parked in this batch is not an
// error. RunOnce may run concurrently with other relays on the same table.
func (r *Relay) RunOnce(ctx context.Context) (int, error) {
	n, _, err := r.runOnce(ctx, r.cfg.BatchSize)
	return n, err
}

// runOnce is RunOnce with a claim of up to size rows. next is the size of
// the claim to run at once, when more events are waiting: twice size after a
// full batch (up to MaxBatchSize), size after a batch that other relays'
// lanes cut short; 0 when the relay has caught up.
func (r *Relay) runOnce(ctx context.Context, size int) (n, next int, err error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.BatchTimeout)
	defer cancel()
	t := time.Now()
	tx, err := r.db.Begin(ctx)
	if err != nil {
		_, err = r.metrics.lap(ctx, StepClaim, t, err)
		return 0, 0, fmt.Errorf("relay: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	rows, more, err := r.claim(ctx, tx, size)
	t, err = r.metrics.lap(ctx, StepClaim, t, err)
	if err != nil || len(rows) == 0 {
		return 0, 0, err
	}
	msgs, spans := r.messages(ctx, rows)
	errs := r.publish(ctx, rows, msgs)
	acked := r.metrics.publishLap(ctx, t, rows, errs)
	r.endSpans(spans, msgs, errs)

	var (
		ids       []int64
		failed    []int // permanent failures
		transient error
		nTrans    int
	)
	for i, err := range errs {
		switch {
		case err == nil:
			ids = append(ids, rows[i].id)
		case IsPermanent(err):
			failed = append(failed, i)
		case errors.Is(err, ErrHeld):
			// Waits behind its key's failed event: not a failure of its own.
		default:
			nTrans++
			if transient == nil {
				transient = err
			}
		}
	}
	var parked map[int64]bool
	if len(ids) > 0 || len(failed) > 0 {
		parked, err = r.record(ctx, tx, ids, rows, errs, failed)
		if t, err = r.metrics.lap(ctx, StepMark, acked, err); err != nil {
			return 0, 0, err
		}
		if _, err := r.metrics.lap(ctx, StepCommit, t, tx.Commit(ctx)); err != nil {
			// Acknowledged events will be sent again (same x-event-id).
			return 0, 0, fmt.Errorf("relay: commit: %w", err)
		}
		r.logFailures(rows, errs, failed, parked)
	}
	r.metrics.record(ctx, rows, errs, acked)
	if transient != nil {
		return len(ids), 0, fmt.Errorf("relay: %d of %d events not published: %w", nTrans, len(rows), transient)
	}
	// Events charged but not parked are retried with backoff, so a failure
	// that was not so permanent after all (a topic being created, a broker
	// restarting) has time to pass before they run out of attempts.
	for _, i := range failed {
		if !parked[rows[i].id] {
			return len(ids), 0, fmt.Errorf("relay: %d of %d events failed permanently, retrying until parked: %w", len(failed)-len(parked), len(rows), errs[i])
		}
	}
	switch {
	case len(ids) == size:
		next = min(2*size, r.cfg.MaxBatchSize)
	case more && len(ids) > 0:
		next = size
	}
	return len(ids), next, nil
}

// isolateMax caps the events one batch sends alone to attribute a permanent
// failure (see publish); the rest wait for the next batch.
const isolateMax = 10

// publish sends the messages that can be sent and returns each row's
// outcome: nil when acknowledged.
//
// A broker rejects a partition's whole record batch for one bad record, so
// a permanent error in a bulk send does not say which event is bad. Events
// that failed so (and events that failed before: attempts > 0) are sent
// alone, up to isolateMax per batch, and only an event that fails alone is
// charged. Errors that condemn a whole topic (missing, invalid,
// unauthorized) are charged to each event without that.
//
// After the first failure of a key its later events in the batch are
// ErrHeld: not sent when the failure was known before sending, not marked
// when it was not, so a key is not published around a gap that is filled
// later.
func (r *Relay) publish(ctx context.Context, rows []row, msgs []Message) []error {
	errs := make([]error, len(rows))
	blocked := map[string]bool{}
	var bulk, alone []int
	for i, m := range msgs {
		k := rows[i].key
		switch err := r.precheck(m); {
		case blocked[k]:
			errs[i] = ErrHeld
		case err != nil:
			errs[i] = err
			blocked[k] = true
		case rows[i].attempts > 0 && len(alone) < isolateMax:
			alone = append(alone, i)
			blocked[k] = true
		case rows[i].attempts > 0:
			errs[i] = ErrHeld
			blocked[k] = true
		default:
			bulk = append(bulk, i)
		}
	}
	r.send(ctx, msgs, bulk, errs)
	for _, i := range bulk {
		if !IsPermanent(errs[i]) || topicLevel(errs[i]) {
			continue
		}
		if blocked[rows[i].key] { // behind its key's first failure: not charged
			errs[i] = ErrHeld
			continue
		}
		blocked[rows[i].key] = true
		if len(alone) < isolateMax {
			alone = append(alone, i)
		} else {
			errs[i] = ErrHeld
		}
	}
	for _, i := range alone {
		if ctx.Err() != nil {
			errs[i] = ctx.Err()
			continue
		}
		r.send(ctx, msgs, []int{i}, errs)
	}
	blocked = map[string]bool{}
	for i := range rows {
		if blocked[rows[i].key] && errs[i] == nil {
			errs[i] = ErrHeld
		}
		if errs[i] != nil {
			blocked[rows[i].key] = true
		}
	}
	return errs
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
func (r *Relay) record(ctx context.Context, tx pgx.Tx, ids []int64, rows []row, errs []error, failed []int) (map[int64]bool, error) {
	b := &pgx.Batch{}
	if len(ids) > 0 {
		b.Queue(r.q.mark, ids)
	}
	parked := map[int64]bool{}
	if len(failed) > 0 {
		fids := make([]int64, len(failed))
		msgs := make([]string, len(failed))
		limits := make([]int32, len(failed))
		for j, i := range failed {
			fids[j], msgs[j] = rows[i].id, truncate("["+ErrorType(errs[i])+"] "+errs[i].Error(), 1000)
			switch {
			case r.cfg.Poison == Hold:
				limits[j] = 0 // never park
			case errors.Is(errs[i], errCannotSend):
				limits[j] = 1 // can never be sent: park at once
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
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("relay: mark %d events published, %d failed: %w", len(ids), len(failed), err)
	}
	return parked, nil
}

func (r *Relay) logFailures(rows []row, errs []error, failed []int, parked map[int64]bool) {
	for _, i := range failed {
		x := rows[i]
		if parked[x.id] {
			r.cfg.Logger.Error("outbox relay: event parked: it cannot be published and no longer blocks its key; fix the cause, then relay.Requeue it or delete it",
				"event_id", x.eventID, "event_type", x.eventType, "topic", x.topic, "error", errs[i], "error.type", ErrorType(errs[i]))
		} else {
			r.cfg.Logger.Warn("outbox relay: event failed permanently; retrying until MaxAttempts, then parking it",
				"event_id", x.eventID, "event_type", x.eventType, "topic", x.topic, "error", errs[i], "error.type", ErrorType(errs[i]))
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
// parent is the trace context stored with its event.
func (r *Relay) messages(ctx context.Context, rows []row) ([]Message, []trace.Span) {
	msgs := make([]Message, len(rows))
	spans := make([]trace.Span, len(rows))
	for i, x := range rows {
		var stored map[string]string
		if len(x.headers) > 0 {
			// Written by the unit of work as a JSON object of strings; a row
			// edited by hand into something else loses its headers, not its event.
			_ = json.Unmarshal(x.headers, &stored)
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
		hs := make([]Header, 0, len(stored)+4)
		for k, v := range stored {
			if !outbox.IsReservedHeader(k) {
				hs = append(hs, Header{Key: k, Value: []byte(v)})
			}
		}
		hs = append(hs,
			Header{Key: outbox.HeaderEventID, Value: []byte(eventID)},
			Header{Key: outbox.HeaderEventType, Value: []byte(x.eventType)})
		tc := propagation.MapCarrier{}
		r.cfg.Propagator.Inject(trace.ContextWithSpan(parent, span), tc)
		for k, v := range tc {
			hs = append(hs, Header{Key: k, Value: []byte(v)})
		}
		msgs[i] = Message{EventID: x.eventID, Topic: x.topic, Key: []byte(x.key), Value: x.payload, Headers: hs}
	}
	return msgs, spans
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
