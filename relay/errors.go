package relay

import (
	"fmt"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/record"
	"github.com/fxoutbox/outbox/relay/internal/failure"
)

// ErrHeld is reported for a message not sent, or not marked, because an
// earlier event of its key failed in the same batch (or, from
// SaramaPublisher, an earlier record of its partition was rejected). It is
// transient and not counted against the event.
var ErrHeld = failure.ErrHeld

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

// precheck returns the permanent error of a message that cannot be
// published, before it is sent.
func (r *Relay) precheck(m Message) error {
	if err := outbox.ValidateTopic(m.Topic); err != nil {
		return outbox.Permanent(fmt.Errorf("%w: %w", failure.ErrCannotSend, err))
	}
	if size := messageSize(m); size > r.cfg.MaxMessageBytes {
		return outbox.Permanent(fmt.Errorf("%w: %w", failure.ErrCannotSend, failure.TooLarge{Size: size, Max: r.cfg.MaxMessageBytes}))
	}
	return nil
}
