package relay

import (
	"errors"
	"fmt"

	"github.com/IBM/sarama"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/record"
)

// ErrHeld is reported for a message not sent, or not marked, because an
// earlier event of its key failed in the same batch (or, from
// SaramaPublisher, an earlier record of its partition was rejected). It is
// transient and not counted against the event.
var ErrHeld = errors.New("relay: held behind a failed event of the same key")

// topicLevel reports a permanent error that condemns every message to the
// topic, not one message: it is charged to each event without isolating it.
func topicLevel(err error) bool {
	return errors.Is(err, sarama.ErrUnknownTopicOrPartition) || errors.Is(err, sarama.ErrInvalidTopic) ||
		errors.Is(err, sarama.ErrTopicAuthorizationFailed) || errors.Is(err, errCannotSend)
}

// messageSize is a record's size as a broker counts it against
// message.max.bytes, by the rule the writers also apply (internal/record's
// Bytes): key, value and headers plus record and batch
// overhead.
func messageSize(m Message) int {
	n := 0
	for _, h := range m.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return record.Bytes(len(m.Key), len(m.Value), len(m.Headers), n)
}

// errCannotSend marks a message the relay refuses before sending: no retry
// can change it, so it is parked at once (unless the policy is Hold).
var errCannotSend = errors.New("cannot be sent")

// precheck returns the permanent error of a message that cannot be
// published, before it is sent.
func (r *Relay) precheck(m Message) error {
	if err := outbox.ValidateTopic(m.Topic); err != nil {
		return outbox.Permanent(fmt.Errorf("%w: %w", errCannotSend, err))
	}
	if size := messageSize(m); size > r.cfg.MaxMessageBytes {
		return outbox.Permanent(fmt.Errorf("%w: %w", errCannotSend, tooLargeError{size, r.cfg.MaxMessageBytes}))
	}
	return nil
}
