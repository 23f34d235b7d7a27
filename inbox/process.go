package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/backoff"
	"github.com/fxoutbox/outbox/internal/parklog"
	"github.com/fxoutbox/outbox/internal/textcut"
	"github.com/fxoutbox/outbox/unitofwork"
)

// The outcomes of a record, on the processed metric (outbox.inbox.outcome).
const (
	OutcomeApplied   = "applied"   // the handler's transaction committed
	OutcomeDuplicate = "duplicate" // the inbox row existed: applied before, skipped
	OutcomeParked    = "parked"    // set aside in the parked table
	OutcomeIgnored   = "ignored"   // no route for its event type: skipped
)

var errDuplicate = errors.New("inbox: already applied")

// headerCarrier reads a record's headers for the propagator.
type headerCarrier []*sarama.RecordHeader

func (h headerCarrier) Get(key string) string {
	for i := len(h) - 1; i >= 0; i-- {
		if h[i] != nil && string(h[i].Key) == key {
			return string(h[i].Value)
		}
	}
	return ""
}
func (h headerCarrier) Set(string, string) {}
func (h headerCarrier) Keys() []string {
	out := make([]string, 0, len(h))
	for _, x := range h {
		if x != nil {
			out = append(out, string(x.Key))
		}
	}
	return out
}

func message(m *sarama.ConsumerMessage) *Message {
	hs := make(map[string]string, len(m.Headers))
	for _, h := range m.Headers {
		if h != nil {
			hs[string(h.Key)] = string(h.Value)
		}
	}
	typ, ok := hs[outbox.HeaderEventType]
	if !ok {
		typ = hs[outbox.HeaderCloudEventsType] // another CloudEvents producer's
	}
	return &Message{
		Type: typ, Topic: m.Topic, Partition: m.Partition, Offset: m.Offset,
		Key: m.Key, Value: m.Value, Headers: hs, Timestamp: m.Timestamp,
	}
}

// process applies one record, retrying as its failures call for. It
// returns true when the record is done (applied, duplicate, ignored or
// parked) and its offset may be marked; false when it was abandoned
// (ctx cancelled or stop closed) and must be left to the next owner.
func (c *Consumer) process(ctx context.Context, msg *sarama.ConsumerMessage, stop <-chan struct{}) bool {
	r := c.begin(ctx, msg)
	h, cause, ignored := c.resolve(msg, r.m)
	if ignored {
		return c.finish(r, OutcomeIgnored, nil)
	}
	outcome, err := c.try(r.ctx, msg, r.m, h, cause, stop)
	return c.finish(r, outcome, err)
}

// record is a consumed record being processed: its message, and the ctx
// that carries its process span.
type record struct {
	msg   *sarama.ConsumerMessage
	m     *Message
	ctx   context.Context
	span  trace.Span
	start time.Time
}

// begin starts the record's process span (a child of the producer's
// context in its headers) and counts it as consumed.
func (c *Consumer) begin(ctx context.Context, msg *sarama.ConsumerMessage) *record {
	r := &record{msg: msg, m: message(msg), start: time.Now()}
	ctx = c.cfg.Propagator.Extract(ctx, headerCarrier(msg.Headers))
	attrs := []attribute.KeyValue{
		semconv.MessagingSystemKafka,
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingOperationName("process"),
		semconv.MessagingDestinationName(msg.Topic),
		semconv.MessagingDestinationPartitionID(strconv.Itoa(int(msg.Partition))),
		semconv.MessagingKafkaOffset(int(msg.Offset)),
		semconv.MessagingConsumerGroupName(c.cfg.Group),
	}
	if msg.Key != nil {
		attrs = append(attrs, semconv.MessagingKafkaMessageKey(text(textcut.Clip(string(msg.Key), 256))))
	}
	r.ctx, r.span = c.tracer.Start(ctx, "process "+msg.Topic, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...))
	c.ms.consumed(r.ctx, msg.Topic)
	return r
}

// finish ends the record's span with its outcome, or as abandoned when err
// is set, and reports whether it is done.
func (c *Consumer) finish(r *record, outcome string, err error) bool {
	defer r.span.End()
	if err != nil { // abandoned
		r.span.SetStatus(codes.Error, "abandoned: "+err.Error())
		r.span.SetAttributes(semconv.ErrorTypeKey.String(ErrorTypeCanceled))
		return false
	}
	r.span.SetAttributes(attribute.String("outbox.inbox.outcome", outcome))
	if r.m.ID != "" {
		r.span.SetAttributes(semconv.MessagingMessageID(r.m.ID))
	}
	if outcome == OutcomeParked {
		r.span.SetStatus(codes.Error, "parked")
	}
	c.ms.done(r.ctx, r.msg, outcome, time.Since(r.start))
	return true
}

// resolve finds a record's handler and sets its identity. ignored is true
// for a record no route takes (unless ParkUnrouted); cause is set when the
// record cannot be applied and is to be parked (no identity, or no route
// with ParkUnrouted).
func (c *Consumer) resolve(msg *sarama.ConsumerMessage, m *Message) (h Handler, cause error, ignored bool) {
	h = c.route(m.Topic, m.Type)
	if h == nil && !c.cfg.ParkUnrouted {
		return nil, nil, true
	}
	switch id, err := c.cfg.Identity(msg); {
	case err != nil:
		cause = err
	case h == nil:
		m.ID = id
		cause = fmt.Errorf("%w: topic %q, event type %s", ErrNoRoute, m.Topic, textcut.Quote(m.Type, 100))
	default:
		m.ID = id
	}
	return h, cause, false
}

// try runs the record, resolved (h, or the cause that parks it), until it
// is done; an error only when abandoned.
func (c *Consumer) try(ctx context.Context, msg *sarama.ConsumerMessage, m *Message, h Handler, cause error, stop <-chan struct{}) (string, error) {
	// Built only when a failure is logged: With formats its attributes.
	log := func() *slog.Logger {
		return c.cfg.Logger.With("consumer", c.cfg.Name, "topic", msg.Topic, "partition", msg.Partition, "offset", msg.Offset)
	}
	b := backoff.Backoff{Initial: c.cfg.MinBackoff, Max: c.cfg.MaxBackoff}
	attempts := 0
	for cause == nil {
		m.Attempt = attempts + 1
		tctx, cancel := context.WithTimeout(ctx, c.cfg.TryTimeout)
		err := c.apply(tctx, h, m)
		cancel()
		if err == nil {
			return OutcomeApplied, nil
		}
		if errors.Is(err, errDuplicate) {
			return OutcomeDuplicate, nil
		}
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		switch classify(err) {
		case kindTransient:
			c.ms.failed(ctx, msg.Topic, err, "transient")
			log().Warn("outbox inbox: transient failure; the record's transaction rolled back and is retried with backoff (not counted as an attempt)",
				"event_id", m.ID, "error.type", errorType(err), "error", err)
		case kindPermanent:
			attempts++
			c.ms.failed(ctx, msg.Topic, err, "permanent")
			cause = err
			continue
		case kindAttempt:
			attempts++
			c.ms.failed(ctx, msg.Topic, err, "handler")
			if attempts >= c.cfg.MaxAttempts && c.cfg.Poison == outbox.Park {
				cause = err
				continue
			}
			log().Warn("outbox inbox: handler failed; the record's transaction rolled back and is retried",
				"event_id", m.ID, "attempt", attempts, "max_attempts", c.cfg.MaxAttempts, "error.type", errorType(err), "error", err)
		}
		if !b.Wait(ctx, stop, nil) {
			return "", context.Canceled
		}
	}
	// Park it; database failures while parking are retried.
	for {
		dup, err := c.park(ctx, msg, m, attempts, cause)
		if err == nil {
			if dup {
				return OutcomeDuplicate, nil
			}
			if c.parkLog.Parked(parklog.Cause{Topic: msg.Topic, Reason: reason(cause)}) {
				log().Error("outbox inbox: record parked; its partition moves on (list it with outboxctl inbox parked list, "+
					"retry it with Consumer.Retry in this service once the cause is fixed, or delete it)",
					"event_id", m.ID, "attempts", attempts, "error.type", errorType(cause), "reason", reason(cause), "error", cause)
			}
			return OutcomeParked, nil
		}
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		c.ms.failed(ctx, msg.Topic, err, "transient")
		log().Warn("outbox inbox: parking the record failed; retrying with backoff", "event_id", m.ID, "error.type", errorType(err), "error", err)
		if !b.Wait(ctx, stop, nil) {
			return "", context.Canceled
		}
	}
}

// apply runs one try: the inbox row, then the handler, in one transaction.
// The inbox row's INSERT goes to the database in the same round trip as
// BEGIN (unitofwork.DoBatch), so a record costs the round trips of the
// handler's own transaction and no more. A panic in the handler rolls the
// transaction back and counts as a handler error, so a record that panics
// is parked instead of crashing the process again at every redelivery.
func (c *Consumer) apply(ctx context.Context, h Handler, m *Message) (err error) {
	var inserted int64 = -1
	b := &pgx.Batch{}
	b.Queue(c.sql.insert, c.cfg.Name, m.ID, m.Topic, m.Partition, m.Offset).Exec(func(tag pgconn.CommandTag) error {
		inserted = tag.RowsAffected()
		return nil
	})
	err = c.uow.DoBatch(ctx, b, func(ctx context.Context, tx unitofwork.Tx) error {
		if inserted == 0 {
			return errDuplicate
		}
		return c.call(ctx, h, tx, m)
	})
	if err != nil && inserted < 0 {
		return fmt.Errorf("inbox: record event %s in %s: %w", textcut.Quote(m.ID, 100), c.cfg.Table, err)
	}
	return err
}

// call runs the handler; its error, or a panic, is a handlerError.
func (c *Consumer) call(ctx context.Context, h Handler, tx unitofwork.Tx, m *Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &handlerError{err: fmt.Errorf("inbox: the handler panicked: %s", textcut.Clip(fmt.Sprint(r), 1000))}
		}
	}()
	if err := h(ctx, tx, m); err != nil {
		return &handlerError{err: err}
	}
	return nil
}

// park stores the record in the parked table and, when it has an id, its
// inbox row, in one transaction; dup is true when the inbox row existed
// (another owner applied the event meanwhile). With Config.DeadLetterTopic,
// the same transaction records the dead-letter event, once per parked row.
func (c *Consumer) park(ctx context.Context, msg *sarama.ConsumerMessage, m *Message, attempts int, cause error) (dup bool, err error) {
	err = c.uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		if m.ID != "" {
			tag, err := tx.Exec(ctx, c.sql.insert, c.cfg.Name, m.ID, m.Topic, m.Partition, m.Offset)
			if err != nil {
				return err
			}
			if tag.RowsAffected() == 0 {
				dup = true
				return nil
			}
		}
		var id *string
		if m.ID != "" {
			id = &m.ID
		}
		var ts *time.Time
		if !msg.Timestamp.IsZero() {
			ts = &msg.Timestamp
		}
		hs := make(map[string]string, len(m.Headers))
		for k, v := range m.Headers {
			hs[text(k)] = text(v)
		}
		var parkedID int64
		var parkedAt time.Time
		var inserted bool
		err := tx.QueryRow(ctx, c.sql.park, c.cfg.Name, id, nullable(text(m.Type)), m.Topic, m.Partition, m.Offset,
			msg.Key, msg.Value, hs, ts, attempts, errorType(cause), reason(cause)).Scan(&parkedID, &parkedAt, &inserted)
		if err != nil || c.cfg.DeadLetterTopic == "" || !inserted {
			// Parked again (a record without identity redelivered): its
			// dead letter went out the first time.
			return err
		}
		return c.deadLetter(ctx, tx, msg, m, hs, parkedID, parkedAt, attempts, cause)
	})
	return dup, err
}

// DeadLetterEventType is the x-event-type of the events a consumer with
// Config.DeadLetterTopic records for the records it parks.
const DeadLetterEventType = "inbox.record.parked.v1"

// DeadLetter is the payload of a dead-letter event (JSON): the parked
// record as the parked table holds it (Key and Value are its exact bytes,
// base64 in JSON; ID is its parked id, for Consumer.Retry and Delete), and
// ValueOmitted when the record did not fit in an outbox event.
type DeadLetter struct {
	Parked
	// ValueOmitted says why Value (and perhaps Key and Headers) is empty:
	// the record broke the outbox's limits (the parked table keeps it
	// whole).
	ValueOmitted string `json:"value_omitted,omitempty"`
}

// deadLetter records the parked record's dead-letter event on tx: topic
// Config.DeadLetterTopic, keyed by the record's key (its position when it
// has none), on the record's trace (ctx carries its process span).
func (c *Consumer) deadLetter(ctx context.Context, tx unitofwork.Tx, msg *sarama.ConsumerMessage, m *Message, hs map[string]string, parkedID int64, parkedAt time.Time, attempts int, cause error) error {
	position := m.Topic + "/" + strconv.Itoa(int(m.Partition)) + "/" + strconv.FormatInt(m.Offset, 10)
	key := text(string(msg.Key))
	if key == "" {
		key = position
	}
	dl := DeadLetter{Parked: Parked{
		ID: parkedID, Consumer: c.cfg.Name, Topic: m.Topic, Partition: m.Partition, Offset: m.Offset,
		EventID: text(m.ID), Type: text(m.Type), Key: msg.Key, Value: msg.Value, Headers: hs, Timestamp: msg.Timestamp,
		Attempts: attempts, ErrorType: errorType(cause), LastError: reason(cause), ParkedAt: parkedAt,
	}}
	ev := outbox.Event{
		AggregateType: "inbox", AggregateID: text(textcut.Clip(key, 200)), Type: DeadLetterEventType, Topic: c.cfg.DeadLetterTopic, Key: key,
		Headers: map[string]string{"x-original-topic": m.Topic, "x-original-partition": strconv.Itoa(int(m.Partition)),
			"x-original-offset": strconv.FormatInt(m.Offset, 10), "x-consumer": c.cfg.Name},
	}
	if m.ID != "" {
		ev.Headers["x-original-event-id"] = text(textcut.Clip(m.ID, 200))
	}
	// A record that broke a handler may break the outbox's limits too (a
	// key, value or headers too large): the letter then loses its value,
	// then everything but the record's position and the reason. Parking
	// must not fail for the letter's sake, or the record's partition would
	// stop.
	steps := []func(reason string){
		func(reason string) { dl.Value, dl.ValueOmitted = nil, reason },
		func(reason string) {
			dl.Key, dl.Value, dl.Headers, dl.EventID = nil, nil, nil, text(textcut.Clip(m.ID, 200))
			dl.LastError, dl.ValueOmitted = text(textcut.Clip(dl.LastError, 1000)), "key, value and headers left out: "+reason
			ev.Key, ev.AggregateID = position, position
			delete(ev.Headers, "x-original-event-id")
		},
	}
	for i := 0; ; i++ {
		ev.Payload = dl
		err := tx.Add(ctx, ev)
		if err == nil {
			return nil
		}
		if !errors.Is(err, outbox.ErrInvalidEvent) {
			return fmt.Errorf("inbox: dead-letter event for %s to %s: %w", position, c.cfg.DeadLetterTopic, err)
		}
		if i == len(steps) {
			c.cfg.Logger.Error("outbox inbox: the parked record's dead-letter event is invalid even without its key, value and headers; parked without it",
				"consumer", c.cfg.Name, "topic", m.Topic, "partition", m.Partition, "offset", m.Offset, "dead_letter_topic", c.cfg.DeadLetterTopic, "error", err)
			return nil
		}
		steps[i](textcut.Clip(err.Error(), 1000))
	}
}

// text makes s storable as PostgreSQL text and jsonb: valid UTF-8 without
// NUL bytes (binary header values of other producers are stored lossily).
func text(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
