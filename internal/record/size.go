// Package record turns an outbox.Event into the row a writer stores (the
// validator behind unitofwork's Tx.Add and outboxtest's recorder) and holds
// the one size rule of a Kafka record, which the writers and the relay
// share. Only the module's own packages use it.
package record

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/propagation"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/defaults"
)

// Kafka record batch format (magic 2), as the broker and sarama count it.
const (
	// recordBatchOverhead is a batch's header: base offset 8, length 4,
	// partition leader epoch 4, magic 1, CRC 4, attributes 2, last offset
	// delta 4, first and max timestamp 8+8, producer id 8, producer epoch
	// 2, base sequence 4, record count 4. The broker counts it against
	// message.max.bytes.
	recordBatchOverhead = 61
	// recordOverhead is a record's own fields with every varint at its
	// widest: length, attributes, timestamp delta (varint64), offset
	// delta, key length, value length, header count. sarama's
	// ProducerMessage.ByteSize counts the same 36 bytes.
	recordOverhead = 5 + 1 + 10 + 5 + 5 + 5 + 5
	// headerOverhead is one header's key and value lengths at their widest.
	headerOverhead = 5 + 5
	// The headers the relay adds to every event: x-event-id (a UUID in
	// its 36-byte text form), x-event-type (the event's Type) and the
	// traceparent of its publish span (55 bytes, W3C trace context).
	eventIDHeaderBytes     = len(outbox.HeaderEventID) + 36
	traceparentHeaderBytes = len("traceparent") + 55
)

// Bytes returns the size of a Kafka record batch that holds one record
// with a key of keyBytes, a value of valueBytes and headers headers whose
// names and values add up to headerBytes: the size a broker compares with
// its message.max.bytes and a topic's max.message.bytes. Varint lengths are
// counted at their widest, so the record itself is never larger than
// sarama's ProducerMessage.ByteSize and the batch never larger than the
// result.
//
// It is the one size rule of the outbox: the unit of work refuses an event
// whose record would exceed outbox.Limits.MaxRecordBytes, and the relay refuses
// (parks) a message over its MaxMessageBytes, both with this function.
func Bytes(keyBytes, valueBytes, headers, headerBytes int) int {
	return recordBatchOverhead + recordOverhead + keyBytes + valueBytes + headers*headerOverhead + headerBytes
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

// EncodeHeaders encodes headers as the JSON object stored in the headers
// column.
func EncodeHeaders(h map[string]string) []byte {
	b, _ := json.Marshal(h) // a map[string]string always marshals
	return b
}

// Writer prepares events as one writer's configuration says: what a
// UnitOfWork's Tx.Add checks and stores, and what outboxtest's recorder
// records, so both accept and refuse the same events.
type Writer struct {
	Service    string
	Topics     outbox.TopicFunc              // nil: outbox.TopicPerEvent
	Limits     outbox.Limits                 // taken with their defaults
	Propagator propagation.TextMapPropagator // nil: defaults.Propagator()
}

// Prepare validates events and applies their defaults (topic, key, event
// id, the trace context headers w.Propagator injects from ctx). An invalid
// event's *outbox.EventError carries its index in events.
func (w Writer) Prepare(ctx context.Context, events []outbox.Event) ([]Record, error) {
	if len(events) == 0 {
		return nil, nil
	}
	prop := w.Propagator
	if prop == nil {
		prop = defaults.Propagator()
	}
	carrier := propagation.MapCarrier{}
	prop.Inject(ctx, carrier)
	var trace map[string]string
	if len(carrier) > 0 {
		trace = carrier
	}
	recs := make([]Record, len(events))
	for i, e := range events {
		r, err := Prepare(e, w.Service, w.Topics, w.Limits, trace)
		if err != nil {
			var ee *outbox.EventError
			if errors.As(err, &ee) {
				ee.Index = i
			}
			return nil, err
		}
		recs[i] = r
	}
	return recs, nil
}

// LimitsWithDefaults returns l with zero fields set to their defaults
// (outbox.Limits documents them).
func LimitsWithDefaults(l outbox.Limits) outbox.Limits {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&l.MaxRecordBytes, outbox.DefaultMaxRecordBytes)
	def(&l.MaxPayloadBytes, l.MaxRecordBytes)
	def(&l.MaxHeaders, 32)
	def(&l.MaxHeaderBytes, 4<<10)
	def(&l.MaxTypeBytes, 255)
	def(&l.MaxAggregateTypeBytes, 255)
	def(&l.MaxAggregateIDBytes, 1024)
	def(&l.MaxKeyBytes, 1024)
	return l
}
