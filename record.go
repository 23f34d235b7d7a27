package outbox

// DefaultMaxRecordBytes is the default of Limits.MaxRecordBytes and of the
// relay's MaxMessageBytes: 1,048,588 bytes, the default message.max.bytes of
// a Kafka broker (1 MiB plus the 12-byte log entry header), which is also
// the default max.message.bytes of every topic. A record of this size as
// RecordBytes counts it also passes sarama's default Producer.MaxMessageBytes
// (1,048,576), which counts the record without the 61-byte batch header.
const DefaultMaxRecordBytes = 1<<20 + 12

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
	eventIDHeaderBytes     = len(HeaderEventID) + 36
	traceparentHeaderBytes = len("traceparent") + 55
)

// RecordBytes returns the size of a Kafka record batch that holds one record
// with a key of keyBytes, a value of valueBytes and headers headers whose
// names and values add up to headerBytes: the size a broker compares with
// its message.max.bytes and a topic's max.message.bytes. Varint lengths are
// counted at their widest, so the record itself is never larger than
// sarama's ProducerMessage.ByteSize and the batch never larger than the
// result.
//
// It is the one size rule of the outbox: the unit of work refuses an event
// whose record would exceed Limits.MaxRecordBytes, and the relay refuses
// (parks) a message over its MaxMessageBytes, both with this function.
func RecordBytes(keyBytes, valueBytes, headers, headerBytes int) int {
	return recordBatchOverhead + recordOverhead + keyBytes + valueBytes + headers*headerOverhead + headerBytes
}
