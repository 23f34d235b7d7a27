package kafkaproducer

import (
	"context"
)

// Header is one Kafka record header.
type Header struct {
	Key   string
	Value []byte
}

// Record is one message to produce.
type Record struct {
	Topic   string
	Key     []byte
	Value   []byte
	Headers []Header
}

// Result is the outcome of one Record of a Produce call.
type Result struct {
	// Err is nil when the broker acknowledged the record. Otherwise it is
	// the failure, wrapping its cause (sarama.KError, *net.OpError, TLS and
	// SASL errors, ctx's error) for errors.Is and errors.As.
	Err error
	// Permanent says Err happens again however often the record is resent:
	// the broker rejected the record itself (too large, invalid, policy),
	// or its topic cannot be produced to (missing, invalid, not
	// authorized). Any other failure is transient.
	Permanent bool
	// Held says the record was not sent because an earlier record of its
	// partition in the call was rejected (Err names the partition); it is
	// transient.
	Held bool

	// Stored says the broker told where it stored the acknowledged record:
	// Partition and Offset, and the address ("host:port") of the Broker
	// that acknowledged it.
	Stored    bool
	Partition int32
	Offset    int64
	Broker    string
}

// Produce sends recs and returns the outcome of each, in the order of recs,
// when every record was acknowledged or failed.
//
// Each record goes to the partition the configuration's Producer.Partitioner
// chooses, as with sarama's own producer. Each partition's records are cut,
// in order, into record batches of at most Producer.MaxMessageBytes, and
// sent as an idempotent producer: one ProduceRequest per leader broker
// carries the next batch of every partition it leads. For each partition at
// most one batch is in flight, also across concurrent calls, and the next
// is sent only after the previous one was acknowledged. A broker appends or
// rejects a batch whole, so a later record of a partition never reaches
// Kafka ahead of an earlier one that failed.
//
// Failures, per partition (other partitions go on):
//   - Retriable broker errors (no leader, leader moved, timeout, not enough
//     replicas, connection lost): the same batch is sent again with the
//     same sequence numbers, after a metadata refresh and
//     Producer.Retry.Backoff, up to Producer.Retry.Max times within ctx. If
//     it still fails, it and every later record of the partition fail with
//     that (transient) error, and a new producer id is fetched before the
//     next batch, because whether the broker appended it is unknown.
//   - A record batch rejected for its content (too large, invalid record,
//     policy): it is split and the halves sent in turn, so the records
//     before the bad one are delivered and only the bad one fails,
//     Permanent; the later records of its partition are not sent (Held).
//   - A topic that is missing, invalid or not authorized: every record of
//     the topic fails, Permanent, at once, without retries.
//
// Produce can block in a broker or metadata call (sarama takes no context)
// past the end of ctx, for as long as sarama's timeouts allow
// (Net.ReadTimeout, Metadata.Timeout); Lazy returns at once instead.
func (pr *Producer) Produce(ctx context.Context, recs []Record) []Result {
	out := make([]Result, len(recs))
	if len(recs) == 0 {
		return out
	}
	for i, err := range pr.publish(ctx, recs, out) {
		out[i] = outcome(err)
	}
	return out
}

// Close closes the client the producer was given. Call it once no Produce
// call runs.
func (pr *Producer) Close() error { return pr.client.Close() }

// permanentError and heldError mark the failures of a call inside the
// package; Produce turns them into Result's flags.
type (
	permanentError struct{ err error }
	heldError      struct{ err error }
)

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }
func (e *heldError) Error() string      { return e.err.Error() }
func (e *heldError) Unwrap() error      { return e.err }

func permanent(err error) error { return &permanentError{err} }
func held(err error) error      { return &heldError{err} }

// outcome is the Result of a failure: its markers (always outermost)
// become flags.
func outcome(err error) Result {
	switch e := err.(type) {
	case *permanentError:
		return Result{Err: e.err, Permanent: true}
	case *heldError:
		return Result{Err: e.err, Held: true}
	}
	return Result{Err: err}
}
