package outbox

import (
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/google/uuid"
)

// Kafka record headers set by the relay on every published event. An event's
// own Headers may not use these names (nor the W3C trace context names
// "traceparent", "tracestate" and "baggage", which the relay also sets).
const (
	HeaderEventID   = "x-event-id"
	HeaderEventType = "x-event-type"
)

// Event is a domain event recorded in the outbox inside a business
// transaction. AggregateType, AggregateID and Type are required; everything
// else has a default.
type Event struct {
	// ID identifies the event; consumers drop duplicates by it (Kafka header
	// x-event-id). Default: a new UUIDv7, which sorts by creation time.
	ID uuid.UUID
	// AggregateType names the kind of entity the event is about, e.g. "order"
	// or "Order". Required.
	AggregateType string
	// AggregateID is the id of that entity. Required. It is also the default
	// partition key, so one aggregate's events keep their order in Kafka.
	AggregateID string
	// Type is the event type, e.g. "order.confirmed.v1". Required. It is sent
	// as the Kafka header x-event-type and, by default, names the topic.
	Type string
	// Payload is marshalled with encoding/json. A json.RawMessage or []byte is
	// taken as already-encoded JSON and must be valid. A nil Payload is stored
	// as JSON null. The outbox stores payloads as jsonb, so consumers receive
	// an equivalent JSON document (key order and white space may differ).
	Payload any
	// Topic is the Kafka topic. Default: derived by the writer's TopicFunc
	// (TopicPerEvent: "<service>.<aggregate-type>.<event-name>").
	Topic string
	// Key is the Kafka record key (the partition key). Default: AggregateID.
	Key string
	// Headers are extra Kafka record headers. Reserved names are refused.
	Headers map[string]string
}

// Limits bounds what one event may carry. They are checked when the event is
// recorded, so an event that could never be published fails in the handler,
// not in the relay.
type Limits struct {
	// MaxPayloadBytes caps the encoded JSON payload. Default 1 MiB - 16 KiB,
	// which fits Kafka's default message.max.bytes (1 MiB) with headers.
	MaxPayloadBytes int
	// MaxHeaders caps the number of extra headers. Default 32.
	MaxHeaders int
	// MaxHeaderBytes caps the size of one header's name plus value. Default 4 KiB.
	MaxHeaderBytes int
}

// WithDefaults returns l with zero fields set to their defaults.
func (l Limits) WithDefaults() Limits {
	if l.MaxPayloadBytes == 0 {
		l.MaxPayloadBytes = 1<<20 - 16<<10
	}
	if l.MaxHeaders == 0 {
		l.MaxHeaders = 32
	}
	if l.MaxHeaderBytes == 0 {
		l.MaxHeaderBytes = 4 << 10
	}
	return l
}

// Validate reports a limit that is negative.
func (l Limits) Validate() error {
	if l.MaxPayloadBytes < 0 || l.MaxHeaders < 0 || l.MaxHeaderBytes < 0 {
		return &ConfigError{Field: "Limits", Reason: "limits must not be negative (zero means the default)"}
	}
	return nil
}

// Record is an event in the form it is stored: every default applied, the
// payload encoded. Writers build it with [Prepare]; the relay never sees an
// Event, only the stored row.
type Record struct {
	ID            uuid.UUID
	AggregateType string
	AggregateID   string
	Type          string
	Payload       []byte // JSON
	Topic         string
	Key           string
	Headers       map[string]string // event headers plus trace context; nil when empty
}

var reserved = map[string]bool{
	HeaderEventID:   true,
	HeaderEventType: true,
	"traceparent":   true,
	"tracestate":    true,
	"baggage":       true,
}

// IsReservedHeader reports whether name is set by the outbox itself and so
// cannot be used as an event header (compared case-insensitively).
func IsReservedHeader(name string) bool { return reserved[strings.ToLower(name)] }

// Prepare validates e, applies its defaults and encodes its payload. service
// and topics name the topic when e.Topic is empty. trace holds the trace
// context headers to store with the event (it may be nil). The returned error
// is an *EventError that matches ErrInvalidEvent.
func Prepare(e Event, service string, topics TopicFunc, limits Limits, trace map[string]string) (Record, error) {
	fail := func(field, reason string) (Record, error) {
		return Record{}, &EventError{Type: e.Type, Field: field, Reason: reason}
	}
	switch {
	case strings.TrimSpace(e.Type) == "":
		return fail("Type", `is empty: name the event, e.g. "order.confirmed.v1"`)
	case strings.TrimSpace(e.AggregateType) == "":
		return fail("AggregateType", `is empty: name the entity the event is about, e.g. "order"`)
	case e.AggregateID == "":
		return fail("AggregateID", "is empty: set the id of the entity the event is about")
	}
	for _, f := range []struct{ name, v string }{{"Type", e.Type}, {"AggregateType", e.AggregateType}, {"AggregateID", e.AggregateID}, {"Key", e.Key}} {
		if !validText(f.v) {
			return fail(f.name, "is not valid UTF-8 text")
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
			topics = TopicPerEvent
		}
		t, err := topics(service, e)
		if err != nil {
			return fail("Topic", err.Error())
		}
		r.Topic = t
	}
	if err := ValidateTopic(r.Topic); err != nil {
		return fail("Topic", err.Error())
	}
	payload, err := encodePayload(e.Payload)
	if err != nil {
		return fail("Payload", err.Error())
	}
	if len(payload) > limits.MaxPayloadBytes {
		return fail("Payload", fmt.Sprintf("is %d bytes encoded, over the limit of %d: store large data elsewhere and reference it", len(payload), limits.MaxPayloadBytes))
	}
	r.Payload = payload
	if len(e.Headers) > limits.MaxHeaders {
		return fail("Headers", fmt.Sprintf("has %d entries, over the limit of %d", len(e.Headers), limits.MaxHeaders))
	}
	if len(e.Headers)+len(trace) > 0 {
		r.Headers = make(map[string]string, len(e.Headers)+len(trace))
	}
	for k, v := range e.Headers {
		switch {
		case k == "":
			return fail("Headers", "has an empty header name")
		case IsReservedHeader(k):
			return fail("Headers", fmt.Sprintf("uses the reserved name %q, which the outbox sets itself", k))
		case len(k)+len(v) > limits.MaxHeaderBytes:
			return fail("Headers", fmt.Sprintf("header %q is %d bytes, over the limit of %d", k, len(k)+len(v), limits.MaxHeaderBytes))
		case !validText(k) || !validText(v):
			return fail("Headers", fmt.Sprintf("header %q is not valid UTF-8 text", k))
		}
		r.Headers[k] = v
	}
	maps.Copy(r.Headers, trace)
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
	if !json.Valid(raw) {
		return nil, fmt.Errorf("is raw bytes that are not valid JSON: pass a value to marshal, or valid JSON")
	}
	return raw, nil
}

var topicRE = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,249}$`)

// ValidateTopic reports whether name is a legal Kafka topic name: 1 to 249
// characters of ASCII letters, digits, '.', '_' and '-', and not "." or "..".
func ValidateTopic(name string) error {
	if !topicRE.MatchString(name) || name == "." || name == ".." {
		return fmt.Errorf("%q is not a valid Kafka topic name (1-249 characters of a-z, A-Z, 0-9, '.', '_', '-')", name)
	}
	return nil
}

// EncodeHeaders encodes headers as the JSON object stored in the headers
// column.
func EncodeHeaders(h map[string]string) []byte {
	b, _ := json.Marshal(h) // a map[string]string always marshals
	return b
}
