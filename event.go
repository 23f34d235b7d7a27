package outbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/fxoutbox/outbox/internal/textcut"
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
	// as JSON null. The outbox stores payloads as PostgreSQL jsonb, which
	// refuses text holding NUL (\u0000), unpaired surrogate escapes and
	// invalid UTF-8, and numbers beyond numeric's range (131072 digits
	// before the decimal point, 16383 after); such payloads are refused when
	// recorded. Consumers receive jsonb's rendering of the document: keys
	// sorted, the last of duplicate keys kept, ": " and ", " separators,
	// numbers written out in full (1e3 becomes 1000). The size limits apply
	// to that rendering, which can be larger than the JSON given.
	Payload any
	// Topic is the Kafka topic. Default: derived by the writer's TopicFunc
	// (TopicPerEvent: "<service>.<aggregate-type>.<event-name>").
	Topic string
	// Key is the Kafka record key (the partition key). Default: AggregateID.
	Key string
	// Headers are extra Kafka record headers. Reserved names are refused,
	// and with CloudEvents binary mode (Limits.CloudEvents) also the six
	// the relay then sets (ce_id, ce_source, ...); other ce_ headers, e.g.
	// ce_subject, become CloudEvents attributes or extensions.
	Headers map[string]string
}

// Limits bounds what one event may carry. They are checked when the event is
// recorded, so an event that could never be stored or published fails in the
// handler with an *EventError, not later in the relay. Zero fields take the
// defaults in their comments.
type Limits struct {
	// MaxRecordBytes is the largest Kafka record an event may become, as
	// RecordBytes counts it: the payload as PostgreSQL stores and prints it,
	// the key, the event's headers, the headers the relay adds (x-event-id,
	// x-event-type, traceparent, and the stored tracestate and baggage; with
	// CloudEvents binary mode also its six ce_ headers) and Kafka's record
	// and batch overhead. It is the one size setting of the
	// outbox: give the relay the same number as its MaxMessageBytes (the
	// fxoutbox module does), and keep it at most the topics'
	// max.message.bytes (the broker's message.max.bytes by default). With
	// producer compression the broker counts the compressed batch, which
	// for incompressible payloads can be slightly larger: leave a margin.
	// Default DefaultMaxRecordBytes (1,048,588, the broker's default).
	MaxRecordBytes int
	// MaxPayloadBytes caps the payload alone, as PostgreSQL's jsonb stores
	// and prints it (numbers in full, ": " and ", " separators), which can
	// be larger than the JSON given. It must not exceed MaxRecordBytes.
	// Default MaxRecordBytes: only the record limit applies.
	MaxPayloadBytes int
	// MaxHeaders caps the number of extra headers. Default 32.
	MaxHeaders int
	// MaxHeaderBytes caps the size of one header's name plus value. Default 4 KiB.
	MaxHeaderBytes int
	// MaxTypeBytes caps Type, which the relay sends as the x-event-type
	// header and logs when it parks an event. Default 255.
	MaxTypeBytes int
	// MaxAggregateTypeBytes caps AggregateType. Default 255.
	MaxAggregateTypeBytes int
	// MaxAggregateIDBytes caps AggregateID, the default partition key.
	// Default 1024: room for composite ids, and small enough that an index
	// on (aggregate_type, aggregate_id) stays under PostgreSQL's btree entry
	// limit (2704 bytes).
	MaxAggregateIDBytes int
	// MaxKeyBytes caps Key, the Kafka record key. Default 1024.
	MaxKeyBytes int
	// CloudEvents is the relay's CloudEvents setting
	// (relay.Config.CloudEvents). With CloudEventsBinary, MaxRecordBytes
	// counts the six headers the relay adds (ce_specversion, ce_id,
	// ce_source, ce_type, ce_time at its widest, content-type), and an
	// event's own header of one of those names is refused. The fxoutbox
	// module sets it from its Config.CloudEvents. Default: off.
	CloudEvents CloudEvents
}

// WithDefaults returns l with zero fields set to their defaults.
func (l Limits) WithDefaults() Limits {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&l.MaxRecordBytes, DefaultMaxRecordBytes)
	def(&l.MaxPayloadBytes, l.MaxRecordBytes)
	def(&l.MaxHeaders, 32)
	def(&l.MaxHeaderBytes, 4<<10)
	def(&l.MaxTypeBytes, 255)
	def(&l.MaxAggregateTypeBytes, 255)
	def(&l.MaxAggregateIDBytes, 1024)
	def(&l.MaxKeyBytes, 1024)
	return l
}

// Validate reports a limit that is negative, or a MaxPayloadBytes above
// MaxRecordBytes. Call it on l.WithDefaults().
func (l Limits) Validate() error {
	if l.MaxRecordBytes < 0 || l.MaxPayloadBytes < 0 || l.MaxHeaders < 0 || l.MaxHeaderBytes < 0 ||
		l.MaxTypeBytes < 0 || l.MaxAggregateTypeBytes < 0 || l.MaxAggregateIDBytes < 0 || l.MaxKeyBytes < 0 {
		return &ConfigError{Field: "Limits", Reason: "limits must not be negative (zero means the default)"}
	}
	if l.MaxRecordBytes > 0 && l.MaxPayloadBytes > l.MaxRecordBytes {
		return &ConfigError{Field: "Limits.MaxPayloadBytes", Reason: fmt.Sprintf(
			"is %d, above MaxRecordBytes %d: no such payload fits a Kafka record; to send larger events raise MaxRecordBytes "+
				"(OUTBOX_MAX_RECORD_BYTES) together with the topics' max.message.bytes, and leave MaxPayloadBytes unset",
			l.MaxPayloadBytes, l.MaxRecordBytes)}
	}
	if err := l.CloudEvents.Validate(); err != nil {
		var ce *ConfigError
		if errors.As(err, &ce) {
			return &ConfigError{Field: "Limits." + ce.Field, Reason: ce.Reason, Err: ce.Err}
		}
		return err
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
	Payload       []byte // JSON, as given or marshalled
	Topic         string
	Key           string
	Headers       map[string]string // event headers plus trace context; nil when empty
	// PayloadBytes is the length of Payload as PostgreSQL's jsonb stores
	// and prints it: what the relay reads back and sends as the value.
	PayloadBytes int
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
// context headers to store with the event (it may be nil). limits are taken
// with their defaults. The payload must be JSON that PostgreSQL's jsonb
// accepts, and the Kafka record the relay will build from the event must fit
// limits.MaxRecordBytes. The returned error is an *EventError that matches
// ErrInvalidEvent.
func Prepare(e Event, service string, topics TopicFunc, limits Limits, trace map[string]string) (Record, error) {
	limits = limits.WithDefaults()
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
			return fail(f.name, fmt.Sprintf("is %d bytes, over the limit of %d (Limits.%s): use a shorter value", len(f.v), f.max, f.setting))
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
			topics = TopicPerEvent
		}
		t, err := topics(service, e)
		if err != nil {
			return fail("Topic", textcut.Escape(err.Error(), 200))
		}
		r.Topic = t
	}
	if err := ValidateTopic(r.Topic); err != nil {
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
		return fail("Payload", fmt.Sprintf("is %d bytes as PostgreSQL stores and prints it (%d as given; jsonb writes numbers out in full), over the limit of %d (Limits.MaxPayloadBytes): store large data elsewhere and reference it", size, len(payload), limits.MaxPayloadBytes))
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
	headers, headerBytes := 3, eventIDHeaderBytes+len(HeaderEventType)+len(r.Type)+traceparentHeaderBytes
	// With CloudEvents, also its headers.
	ceHeaders, ceBytes := limits.CloudEvents.recordHeaders(r.Type)
	headers, headerBytes = headers+ceHeaders, headerBytes+ceBytes
	for k, v := range e.Headers {
		switch {
		case k == "":
			return fail("Headers", "has an empty header name")
		case IsReservedHeader(k):
			return fail("Headers", fmt.Sprintf("uses the reserved name %s, which the outbox sets itself", textcut.Quote(k, 64)))
		case limits.CloudEvents.Mode == CloudEventsBinary && IsCloudEventsHeader(k):
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
	if n := RecordBytes(len(r.Key), size, headers, headerBytes); n > limits.MaxRecordBytes {
		field := "Payload"
		if headerBytes > size {
			field = "Headers"
		}
		return fail(field, fmt.Sprintf("would make a Kafka record of %d bytes (payload %d bytes as PostgreSQL stores it, key %d, %d headers of %d bytes, record overhead), "+
			"over the limit of %d (Limits.MaxRecordBytes, the largest record the brokers take): store large data elsewhere and reference it",
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

var topicRE = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,249}$`)

// ValidateTopic reports whether name is a legal Kafka topic name: 1 to 249
// characters of ASCII letters, digits, '.', '_' and '-', and not "." or "..".
func ValidateTopic(name string) error {
	if !topicRE.MatchString(name) || name == "." || name == ".." {
		return fmt.Errorf("%s is not a valid Kafka topic name (1-249 characters of a-z, A-Z, 0-9, '.', '_', '-')", textcut.Quote(name, 64))
	}
	return nil
}

// EncodeHeaders encodes headers as the JSON object stored in the headers
// column.
func EncodeHeaders(h map[string]string) []byte {
	b, _ := json.Marshal(h) // a map[string]string always marshals
	return b
}
