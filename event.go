package outbox

import (
	"errors"
	"fmt"
	"regexp"

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

// DefaultMaxRecordBytes is the default of Limits.MaxRecordBytes and of the
// relay's MaxMessageBytes: 1,048,588 bytes, the default message.max.bytes of
// a Kafka broker (1 MiB plus the 12-byte log entry header), which is also
// the default max.message.bytes of every topic. A record of this size as
// the relay counts it also passes sarama's default Producer.MaxMessageBytes
// (1,048,576), which counts the record without the 61-byte batch header.
const DefaultMaxRecordBytes = 1<<20 + 12

// Limits bounds what one event may carry. They are checked when the event is
// recorded, so an event that could never be stored or published fails in the
// handler with an *EventError, not later in the relay. Zero fields take the
// defaults in their comments.
type Limits struct {
	// MaxRecordBytes is the largest Kafka record an event may become, as
	// the writer and the relay count it: the payload as PostgreSQL stores and prints it,
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
	MaxRecordBytes int `env:"OUTBOX_MAX_RECORD_BYTES"`
	// MaxPayloadBytes caps the payload alone, as PostgreSQL's jsonb stores
	// and prints it (numbers in full, ": " and ", " separators), which can
	// be larger than the JSON given. It must not exceed MaxRecordBytes.
	// Default MaxRecordBytes: only the record limit applies.
	MaxPayloadBytes int `env:"OUTBOX_MAX_PAYLOAD_BYTES"`
	// MaxHeaders caps the number of extra headers. Default 32.
	MaxHeaders int `env:"OUTBOX_MAX_HEADERS"`
	// MaxHeaderBytes caps the size of one header's name plus value. Default 4 KiB.
	MaxHeaderBytes int `env:"OUTBOX_MAX_HEADER_BYTES"`
	// MaxTypeBytes caps Type, which the relay sends as the x-event-type
	// header and logs when it parks an event. Default 255.
	MaxTypeBytes int `env:"OUTBOX_MAX_TYPE_BYTES"`
	// MaxAggregateTypeBytes caps AggregateType. Default 255.
	MaxAggregateTypeBytes int `env:"OUTBOX_MAX_AGGREGATE_TYPE_BYTES"`
	// MaxAggregateIDBytes caps AggregateID, the default partition key.
	// Default 1024: room for composite ids, and small enough that an index
	// on (aggregate_type, aggregate_id) stays under PostgreSQL's btree entry
	// limit (2704 bytes).
	MaxAggregateIDBytes int `env:"OUTBOX_MAX_AGGREGATE_ID_BYTES"`
	// MaxKeyBytes caps Key, the Kafka record key. Default 1024.
	MaxKeyBytes int `env:"OUTBOX_MAX_KEY_BYTES"`
	// CloudEvents is the relay's CloudEvents setting
	// (relay.Config.CloudEvents). With CloudEventsBinary, MaxRecordBytes
	// counts the six headers the relay adds (ce_specversion, ce_id,
	// ce_source, ce_type, ce_time at its widest, content-type), and an
	// event's own header of one of those names is refused. The fxoutbox
	// module sets it from Config.Relay.CloudEvents. Default: off.
	CloudEvents CloudEvents
}

// Validate reports a limit that is negative, or a MaxPayloadBytes above
// MaxRecordBytes. The writer calls it with the defaults applied.
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

var topicRE = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,249}$`)

// ValidateTopic reports whether name is a legal Kafka topic name: 1 to 249
// characters of ASCII letters, digits, '.', '_' and '-', and not "." or "..".
func ValidateTopic(name string) error {
	if !topicRE.MatchString(name) || name == "." || name == ".." {
		return fmt.Errorf("%s is not a valid Kafka topic name (1-249 characters of a-z, A-Z, 0-9, '.', '_', '-')", textcut.Quote(name, 64))
	}
	return nil
}
