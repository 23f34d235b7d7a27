package relay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/dberr"
	"github.com/fxoutbox/outbox/internal/record"
	"github.com/fxoutbox/outbox/internal/textcut"
	"github.com/fxoutbox/outbox/relay/internal/claim"
	"github.com/fxoutbox/outbox/relay/internal/cursor"
	"github.com/fxoutbox/outbox/relay/internal/eo"
	"github.com/fxoutbox/outbox/relay/internal/failure"
)

// RunOnce claims one batch, publishes it, marks what was acknowledged and
// records failures, in one transaction bounded by BatchTimeout. It returns
// the number of events marked published, and an error when the batch as a
// whole failed: a database error, or a publish that failed transiently
// (broker unavailable, timeout) with nothing acknowledged; the caller should
// then back off. A failure of single events is not an error: a permanent
// one (see outbox.PermanentError) is charged to its event (attempts, last_error),
// which is parked at once or after MaxAttempts; an event the relay cannot
// read, decode or send is parked at once (both unless Poison is Hold); and a
// failed event and its key wait for their paced retry while the other keys
// flow. RunOnce may run concurrently with other relays on the same table.
func (r *Relay) RunOnce(ctx context.Context) (int, error) {
	n, _, err := r.runOnce(ctx, r.cfg.BatchSize, 0, nil)
	return n, err
}

// batchInfo is what a batch tells the loop besides its counts.
type batchInfo struct {
	// heldElsewhere: the claim took nothing because the lanes of the
	// unpublished events it saw were all held by other relays (or workers).
	heldElsewhere bool
	// keep: the worker's cursor lanes kept across batches (nil: none).
	keep *cursor.Keeper
	// eoKeep: the worker's exactly-once lanes kept across batches (nil:
	// none).
	eoKeep *eo.Keeper
}

// runOnce is RunOnce with a claim of up to size rows. next is the size of
// the claim to run at once, when more events are waiting: twice size after a
// full batch (up to MaxBatchSize), size after a batch that other relays'
// lanes, held keys or failed events cut short; 0 when the relay has caught
// up.
func (r *Relay) runOnce(ctx context.Context, size int, upto int64, info *batchInfo) (n, next int, err error) {
	n, next, err = r.batch(ctx, size, upto, info)
	if err != nil && !errors.As(err, new(*failure.DBStep)) && dberr.Is(err) {
		err = &failure.DBStep{Err: err}
	}
	return n, next, err
}

// batch is one batch of the polling claim (see pipeline), taking no row
// past id upto when upto is positive (a streaming relay's sweep).
func (r *Relay) batch(ctx context.Context, size int, upto int64, info *batchInfo) (n, next int, err error) {
	if t := time.Now(); !r.settled.Load() {
		if err := r.settleProgress(ctx); err != nil {
			_, err = r.metrics.lap(ctx, StepClaim, t, err)
			return 0, 0, err
		}
	}
	held := r.heldKeys()
	var eo *eoBatch
	var keep *cursor.Keeper
	var db DB = r.db
	if info != nil && info.keep.Usable() {
		keep, db = info.keep, info.keep
	}
	find := func(ctx context.Context, tx pgx.Tx, isolate bool) (claimed, error) {
		return r.prog.claim(ctx, tx, size, held, upto, keep, isolate)
	}
	if r.eo != nil {
		eo = &eoBatch{}
		if info != nil && info.eoKeep.Usable() {
			eo.keep, db = info.eoKeep, info.eoKeep
		}
		find = func(ctx context.Context, tx pgx.Tx, _ bool) (claimed, error) {
			c, err := r.prog.claimEO(ctx, tx, size, held, eo)
			c.eo = eo
			return c, err
		}
	}
	c, d, err := r.pipelineOn(ctx, db, find)
	if eo != nil {
		r.eoFinish(ctx, eo, err)
	}
	if info != nil {
		info.heldElsewhere = err == nil && c.heldElsewhere
	}
	if err != nil {
		return 0, 0, err
	}
	if len(d.errs) == 0 { // nothing to publish
		if len(c.bad) > 0 && c.more || c.retry {
			next = size
		}
		return 0, next, nil
	}
	progress := len(d.ids) > 0 || len(d.failed) > 0 || len(d.transient) > 0 || len(c.bad) > 0
	switch {
	case len(d.ids) == size:
		grow := 2
		if r.eo != nil {
			// A Kafka transaction per batch: reach MaxBatchSize in fewer.
			grow = 4
		}
		next = min(grow*size, r.cfg.MaxBatchSize)
	case c.more && progress, len(d.failed) > 0 || d.heldBehind:
		// Paced events and their keys are left out of the next claim, so it
		// reaches further; events held behind one parked now, or not sent
		// in this batch, can go at once.
		next = size
	}
	return len(d.ids), next, nil
}

// heldKeys returns the keys of the relay's failed events still waiting out
// their backoff (see pace.Pacer); a failed event is forgotten two
// MaxBackoffs after it was due.
func (r *Relay) heldKeys() []string { return r.pacer.Held(time.Now(), 2*r.cfg.MaxBackoff) }

// publishedTopics yields topic(i) of each event published (errs[i] nil).
func publishedTopics(errs []error, topic func(i int) string) iter.Seq[string] {
	return func(yield func(string) bool) {
		for i, err := range errs {
			if err == nil && !yield(topic(i)) {
				return
			}
		}
	}
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
func (r *Relay) publish(ctx context.Context, pub Publisher, rows []claim.Row, msgs []Message, encErrs []error) (errs []error, alone []int) {
	errs = make([]error, len(rows))
	blocked := map[string]bool{}
	inBulk := map[string]bool{} // keys with an earlier row in bulk
	var bulk []int
	now := time.Now()
	for i, m := range msgs {
		k := rows[i].Key
		err := encErrs[i]
		if err == nil {
			err = r.precheck(m)
		}
		if err == nil && !rows[i].Requeued {
			// A requeued event is sent: the operator says its cause is
			// fixed (a topic created since), whatever the relay remembers.
			err = r.missing.Get(m.Topic, now)
		}
		switch {
		case blocked[k]:
			errs[i] = ErrHeld
		case err != nil:
			errs[i] = err
			blocked[k] = true
		case rows[i].Attempts > 0 && len(alone) < isolateMax && !inBulk[k]:
			// Sent before the bulk: only when no earlier row of its key
			// is in it.
			alone = append(alone, i)
			blocked[k] = true
		case rows[i].Attempts > 0:
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
		r.send(ctx, pub, msgs, []int{i}, errs)
	}
	// The rows in bulk come before any failure of their key found above
	// (the rows after one are ErrHeld already, and a key sent alone has no
	// row in bulk): they are sent.
	sends := 0
	r.resolve(ctx, pub, rows, msgs, bulk, errs, map[string]bool{}, &sends, &alone)
	blocked = map[string]bool{}
	for i := range rows {
		if blocked[rows[i].Key] && errs[i] == nil {
			errs[i] = ErrHeld
		}
		if errs[i] != nil {
			blocked[rows[i].Key] = true
		}
	}
	return errs, alone
}

// resolve sends the rows g (in order; none of their keys has failed so far)
// and, when some fail permanently but not on their own account, splits
// those in two halves and resolves each, so that every row ends published,
// failed on its own (added to alone), failed with its topic or transiently,
// or ErrHeld behind its key's failure or for want of sends.
func (r *Relay) resolve(ctx context.Context, pub Publisher, rows []claim.Row, msgs []Message, g []int, errs []error, blocked map[string]bool, sends *int, alone *[]int) {
	h := g[:0:0]
	for _, i := range g {
		if blocked[rows[i].Key] {
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
	r.send(ctx, pub, msgs, h, errs)
	var failed []int
	split := map[string]int{} // keys with a row in failed: 1, and then ErrHeld (the rest of the key waits): 2
	for _, i := range h {
		k := rows[i].Key
		switch err := errs[i]; {
		case err == nil:
		case blocked[k] || split[k] == 2:
			if outbox.IsPermanent(err) { // behind its key's failure: not charged
				errs[i] = ErrHeld
			}
		case outbox.IsPermanent(err) && !failure.TopicLevel(err):
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
		blocked[rows[failed[0]].Key] = true
	default:
		half := len(failed) / 2
		r.resolve(ctx, pub, rows, msgs, failed[:half], errs, blocked, sends, alone)
		r.resolve(ctx, pub, rows, msgs, failed[half:], errs, blocked, sends, alone)
	}
}

// send publishes msgs[idx...] and stores each outcome in errs.
func (r *Relay) send(ctx context.Context, pub Publisher, msgs []Message, idx []int, errs []error) {
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
	err := pub.Publish(ctx, sub)
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

// messages turns rows into Kafka messages, each with a publish span whose
// parent is the trace context stored with its event. A row whose stored
// headers are not a JSON object of strings gets a permanent error in
// encErrs instead of a message: it is parked (or held), never sent with its
// headers changed.
func (r *Relay) messages(ctx context.Context, rows []claim.Row) (msgs []Message, spans []trace.Span, encErrs []error) {
	msgs = make([]Message, len(rows))
	spans = make([]trace.Span, len(rows))
	encErrs = make([]error, len(rows))
	for i, x := range rows {
		stored, err := storedHeaders(x.Headers)
		if err != nil {
			encErrs[i] = outbox.Permanent(fmt.Errorf("%w: %w", failure.ErrCannotSend, failure.BadHeaders{Err: err}))
		}
		parent := r.cfg.Propagator.Extract(ctx, propagation.MapCarrier(stored))
		eventID := x.EventID.String()
		_, span := r.tracer.Start(parent, "publish "+x.Topic,
			trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(
				semconv.MessagingSystemKafka,
				semconv.MessagingOperationName("publish"),
				semconv.MessagingOperationTypeSend,
				semconv.MessagingDestinationName(x.Topic),
				semconv.MessagingMessageID(eventID),
				semconv.MessagingKafkaMessageKey(x.Key),
			))
		spans[i] = span
		ce := r.cfg.CloudEvents.Mode == outbox.CloudEventsBinary
		hs := make([]Header, 0, len(stored)+10)
		for k, v := range stored {
			if !record.ReservedHeader(k) && (!ce || !record.CloudEventsHeader(k)) {
				hs = append(hs, Header{Key: k, Value: []byte(v)})
			}
		}
		hs = append(hs,
			Header{Key: outbox.HeaderEventID, Value: []byte(eventID)},
			Header{Key: outbox.HeaderEventType, Value: []byte(x.EventType)})
		for k, v := range record.CloudEventsHeaders(r.cfg.CloudEvents, eventID, x.EventType, record.CloudEventsTime(x.CreatedAt)) {
			hs = append(hs, Header{Key: k, Value: []byte(v)})
		}
		tc := propagation.MapCarrier{}
		r.cfg.Propagator.Inject(trace.ContextWithSpan(parent, span), tc)
		for k, v := range tc {
			hs = append(hs, Header{Key: k, Value: []byte(v)})
		}
		msgs[i] = Message{EventID: x.EventID, Topic: x.Topic, Key: []byte(x.Key), Value: x.Payload, Headers: hs}
	}
	return msgs, spans, encErrs
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
			return nil, bad(fmt.Sprintf("an object whose header %s is a JSON %s", strconv.Quote(textcut.Cut(k, 64)), jsonKind(v[0])))
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
