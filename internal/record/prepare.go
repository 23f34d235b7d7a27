package record

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/textcut"
)

// Prepare validates e, applies its defaults and encodes its payload. service
// and topics name the topic when e.Topic is empty. trace holds the trace
// context headers to store with the event (it may be nil). limits are taken
// with their defaults. The payload must be JSON that PostgreSQL's jsonb
// accepts, and the Kafka record the relay will build from the event must fit
// limits.MaxRecordBytes. The returned error is an *outbox.EventError that matches
// ErrInvalidEvent. It checks the fields one after another, in the order
// the record is built, so that a refusal names the first field at fault;
// splitting it would scatter that order over helpers that each see a part.
func Prepare(e outbox.Event, service string, topics outbox.TopicFunc, limits outbox.Limits, trace map[string]string) (Record, error) {
	limits = LimitsWithDefaults(limits)
	fail := func(field, reason string) (Record, error) {
		return Record{}, &outbox.EventError{Type: e.Type, Field: field, Reason: reason}
	}
	switch {
	case strings.TrimSpace(e.Type) == "":
		return fail("Type", `is empty: name the event, e.g. "order.confirmed.v1"`)
	case strings.TrimSpace(e.AggregateType) == "":
		return fail("AggregateType", `is empty: name the entity the event is about, e.g. "order"`)
	case e.AggregateID == "":
		return fail("AggregateID", "is empty: set the id of the entity the event is about")
	}
	for _, f := range [...]struct {
		name, v string
		max     int
		setting string
	}{
		{"Type", e.Type, limits.MaxTypeBytes, "MaxTypeBytes"},
		{"AggregateType", e.AggregateType, limits.MaxAggregateTypeBytes, "MaxAggregateTypeBytes"},
		{"AggregateID", e.AggregateID, limits.MaxAggregateIDBytes, "MaxAggregateIDBytes"},
		{"Key", e.Key, limits.MaxKeyBytes, "MaxKeyBytes"},
	} {
		if len(f.v) > f.max {
			return fail(f.name, fmt.Sprintf("is %d bytes, over the limit of %d (outbox.Limits.%s): use a shorter value", len(f.v), f.max, f.setting))
		}
		if !validText(f.v) {
			return fail(f.name, "is not valid UTF-8 text without NUL bytes")
		}
	}
	r := Record{ID: e.ID, AggregateType: e.AggregateType, AggregateID: e.AggregateID, Type: e.Type, Topic: e.Topic, Key: e.Key}
	if r.ID == uuid.Nil {
		id, err := uuid.NewV7()
		if err != nil {
			return Record{}, fmt.Errorf("outbox: new event id: %w", err)
		}
		r.ID = id
	}
	if r.Key == "" {
		r.Key = e.AggregateID
	}
	if r.Topic == "" {
		if topics == nil {
			topics = outbox.TopicPerEvent
		}
		t, err := topics(service, e)
		if err != nil {
			return fail("Topic", textcut.Escape(err.Error(), 200))
		}
		r.Topic = t
	}
	if err := outbox.ValidateTopic(r.Topic); err != nil {
		return fail("Topic", err.Error())
	}
	payload, err := encodePayload(e.Payload)
	if err != nil { // a MarshalJSON method's error may carry anything
		return fail("Payload", textcut.Escape(err.Error(), 300))
	}
	size, err := jsonbSize(payload)
	if err != nil {
		return fail("Payload", err.Error())
	}
	if size > limits.MaxPayloadBytes {
		return fail("Payload", fmt.Sprintf("is %d bytes as PostgreSQL stores and prints it (%d as given; jsonb writes numbers out in full), over the limit of %d (outbox.Limits.MaxPayloadBytes): store large data elsewhere and reference it", size, len(payload), limits.MaxPayloadBytes))
	}
	r.Payload, r.PayloadBytes = payload, size
	if len(e.Headers) > limits.MaxHeaders {
		return fail("Headers", fmt.Sprintf("has %d entries, over the limit of %d", len(e.Headers), limits.MaxHeaders))
	}
	if len(e.Headers)+len(trace) > 0 {
		r.Headers = make(map[string]string, len(e.Headers)+len(trace))
	}
	// The relay sends the event's headers, x-event-id, x-event-type and the
	// trace context it extracts from the stored one and injects anew: a
	// traceparent of its own span and the stored tracestate and baggage.
	headers, headerBytes := 3, eventIDHeaderBytes+len(outbox.HeaderEventType)+len(r.Type)+traceparentHeaderBytes
	// With CloudEvents, also its headers.
	for k, v := range CloudEventsHeaders(limits.CloudEvents, r.ID.String(), r.Type, widestCloudEventsTime) {
		headers, headerBytes = headers+1, headerBytes+len(k)+len(v)
	}
	for k, v := range e.Headers {
		switch {
		case k == "":
			return fail("Headers", "has an empty header name")
		case ReservedHeader(k):
			return fail("Headers", fmt.Sprintf("uses the reserved name %s, which the outbox sets itself", textcut.Quote(k, 64)))
		case limits.CloudEvents.Mode == outbox.CloudEventsBinary && CloudEventsHeader(k):
			return fail("Headers", fmt.Sprintf("uses the name %s, which the relay sets itself in CloudEvents binary mode", textcut.Quote(k, 64)))
		case len(k)+len(v) > limits.MaxHeaderBytes:
			return fail("Headers", fmt.Sprintf("header %s is %d bytes, over the limit of %d", textcut.Quote(k, 64), len(k)+len(v), limits.MaxHeaderBytes))
		case !validText(k) || !validText(v):
			return fail("Headers", fmt.Sprintf("header %s is not valid UTF-8 text without NUL bytes", textcut.Quote(k, 64)))
		}
		r.Headers[k] = v
		headers, headerBytes = headers+1, headerBytes+len(k)+len(v)
	}
	for k, v := range trace {
		if k != "traceparent" {
			headers, headerBytes = headers+1, headerBytes+len(k)+len(v)
		}
		r.Headers[k] = v
	}
	if n := Bytes(len(r.Key), size, headers, headerBytes); n > limits.MaxRecordBytes {
		field := "Payload"
		if headerBytes > size {
			field = "Headers"
		}
		return fail(field, fmt.Sprintf("would make a Kafka record of %d bytes (payload %d bytes as PostgreSQL stores it, key %d, %d headers of %d bytes, record overhead), "+
			"over the limit of %d (outbox.Limits.MaxRecordBytes, the largest record the brokers take): store large data elsewhere and reference it",
			n, size, len(r.Key), headers, headerBytes, limits.MaxRecordBytes))
	}
	return r, nil
}

// validText says whether PostgreSQL's text type takes s: valid UTF-8
// without NUL bytes.
func validText(s string) bool {
	return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0
}

func encodePayload(p any) ([]byte, error) {
	var raw []byte
	switch v := p.(type) {
	case json.RawMessage:
		raw = v
	case []byte:
		raw = v
	default:
		b, err := json.Marshal(p)
		if err != nil {
			return nil, fmt.Errorf("cannot be encoded as JSON: %w", err)
		}
		return b, nil
	}
	if len(raw) == 0 {
		return []byte("null"), nil
	}
	return raw, nil
}
