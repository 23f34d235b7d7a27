package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
)

// Message is one event as it goes to Kafka.
type Message struct {
	// EventID is the event's id, also sent as the x-event-id header.
	EventID uuid.UUID
	// Topic is the destination topic.
	Topic string
	// Key is the record key (the partition key).
	Key []byte
	// Value is the JSON payload.
	Value []byte
	// Headers are every record header to send, in order: the event's own,
	// x-event-id, x-event-type, and the trace context of the publish span.
	Headers []Header

	// Stored, Partition, Offset and Broker are optional, for the Publisher
	// to fill in on an acknowledged message, in the slice it was given and
	// before Publish returns: Stored = true says where the
	// broker stored it (Partition, Offset) and, when known, which broker
	// acknowledged it (Broker, "host:port"). The relay adds them to the
	// message's publish span (messaging.destination.partition.id,
	// messaging.kafka.offset, server.address, server.port). A Publisher that
	// does not know them leaves Stored false.
	Stored    bool
	Partition int32
	Offset    int64
	Broker    string
}

// clientIdentifier is a publisher that knows its client id (Kafka
// client.id): SaramaPublisher, and a type embedding it. The relay adds it
// to publish spans as messaging.client.id.
type clientIdentifier interface {
	clientID() string
}

// Header is one Kafka record header.
type Header struct {
	Key   string
	Value []byte
}

// Publisher sends messages to a broker and waits for their acknowledgement.
// A relay with several Workers calls Publish concurrently, with batches
// whose keys do not overlap under PerKey ordering.
//
// Publish must keep the order of messages that share a topic and key, and
// must return only when every message was acknowledged (nil), or failed, or
// ctx ended. If it returns a *BatchError, the messages the error does not
// list were acknowledged; any other error means none of them can be assumed
// delivered (they are sent again later: at-least-once).
type Publisher interface {
	Publish(ctx context.Context, msgs []Message) error
}

// BatchError reports the messages of a batch that failed; the others were
// acknowledged.
type BatchError struct {
	// Failed maps the index of each failed message in the batch to its error.
	Failed map[int]error
}

func (e *BatchError) Error() string {
	var first error
	var idx int = -1
	for i, err := range e.Failed {
		if idx < 0 || i < idx {
			idx, first = i, err
		}
	}
	return fmt.Sprintf("relay: %d message(s) of the batch failed; first (message %d): %v", len(e.Failed), idx, first)
}

// Unwrap returns the distinct underlying errors, so errors.Is and errors.As
// see through a BatchError.
func (e *BatchError) Unwrap() []error {
	var out []error
	seen := map[string]bool{}
	for _, err := range e.Failed {
		if k := err.Error(); !seen[k] {
			seen[k] = true
			out = append(out, err)
		}
	}
	return out
}

// PublisherFunc adapts a function to the Publisher interface.
type PublisherFunc func(ctx context.Context, msgs []Message) error

// Publish calls f.
func (f PublisherFunc) Publish(ctx context.Context, msgs []Message) error { return f(ctx, msgs) }

// errorKind sums up an error for telling failures apart in the logs: the
// innermost error it wraps (a batch's error carries its counts, which
// change from batch to batch; its cause does not), first line only.
func errorKind(err error) string {
	for u := errors.Unwrap(err); u != nil; u = errors.Unwrap(err) {
		err = u
	}
	s, _, _ := strings.Cut(err.Error(), "\n")
	return s
}
