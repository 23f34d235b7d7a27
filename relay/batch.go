package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/google/uuid"
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
}

// RunOnce claims one batch, publishes it and marks what was acknowledged,
// in one transaction bounded by BatchTimeout. It returns the number of
// events marked published. A publish error is returned after the
// acknowledged events were marked (wrapped *BatchError) or with nothing
// marked. RunOnce may run concurrently with other relays on the same table.
func (r *Relay) RunOnce(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.BatchTimeout)
	defer cancel()
	tx, err := r.db.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("relay: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	rows, err := r.claim(ctx, tx)
	if err != nil || len(rows) == 0 {
		return 0, err
	}
	msgs, spans := r.messages(ctx, rows)
	pubErr := r.pub.Publish(ctx, msgs)
	ids, pubErr := acknowledged(rows, pubErr)
	endSpans(spans, pubErr)
	if len(ids) == 0 {
		return 0, fmt.Errorf("relay: publish %d events: %w", len(rows), pubErr)
	}
	if _, err := tx.Exec(ctx, r.q.mark, ids); err != nil {
		return 0, fmt.Errorf("relay: mark %d events published: %w", len(ids), err)
	}
	if err := tx.Commit(ctx); err != nil {
		// The events reached Kafka; they will be sent again (same x-event-id).
		return 0, fmt.Errorf("relay: commit: %w", err)
	}
	if pubErr != nil {
		return len(ids), fmt.Errorf("relay: publish: %d of %d events: %w", len(rows)-len(ids), len(rows), pubErr)
	}
	return len(ids), nil
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
		_, span := r.tracer.Start(parent, "publish "+x.topic,
			trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(
				semconv.MessagingSystemKafka,
				semconv.MessagingOperationName("publish"),
				semconv.MessagingOperationTypeSend,
				semconv.MessagingDestinationName(x.topic),
				semconv.MessagingMessageID(x.eventID.String()),
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
			Header{Key: outbox.HeaderEventID, Value: []byte(x.eventID.String())},
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

// acknowledged returns the ids to mark published and the error to report.
// After a failed message, later messages of the same key are not marked
// even if acknowledged: they are sent again after it, so the key's events
// are redelivered in order.
func acknowledged(rows []row, err error) ([]int64, error) {
	if err == nil {
		ids := make([]int64, len(rows))
		for i, x := range rows {
			ids[i] = x.id
		}
		return ids, nil
	}
	var be *BatchError
	if !errors.As(err, &be) {
		return nil, err
	}
	held := map[string]bool{}
	ids := make([]int64, 0, len(rows))
	for i, x := range rows {
		if _, failed := be.Failed[i]; failed || held[x.key] {
			held[x.key] = true
			continue
		}
		ids = append(ids, x.id)
	}
	return ids, err
}

func endSpans(spans []trace.Span, err error) {
	var be *BatchError
	errors.As(err, &be)
	for i, s := range spans {
		var e error
		if be != nil {
			e = be.Failed[i]
		} else {
			e = err
		}
		if e != nil {
			s.RecordError(e)
			s.SetStatus(codes.Error, e.Error())
		}
		s.End()
	}
}
