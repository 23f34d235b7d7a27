package relay

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/relay/internal/failure"
	"github.com/fxoutbox/outbox/relay/internal/pace"
)

// The reason of one cause is one text, whatever varies between its events
// (when, how long ago, which partition and broker, the event's size) and
// however often the relay's memory of a missing topic refused them.
func TestReasonIsStablePerCause(t *testing.T) {
	const topic = "payments.audit"
	missing := func(partition int) error {
		return outbox.Permanent(fmt.Errorf("relay: topic %q cannot be produced to (create it, fix its name, or grant access): %s/%d: %w", topic, topic, partition, sarama.ErrUnknownTopicOrPartition))
	}
	var m pace.MissingTopics
	now := time.Now()
	m.Set(topic, missing(0), now)
	refused1 := m.Get(topic, now.Add(608*time.Millisecond))
	m.Set(topic, refused1, now.Add(time.Second)) // a refusal is not a report: not nested, not renewed
	refused2 := m.Get(topic, now.Add(3632*time.Millisecond))
	if refused2 == nil || strings.Count(refused2.Error(), "not sent") != 1 {
		t.Fatalf("the memory nests or forgets: %v", refused2)
	}
	rejected := func(partition int, broker string) error {
		return outbox.Permanent(fmt.Errorf("relay: broker %s rejected the record batch for %s/%d: %w", broker, topic, partition, sarama.ErrMessageSizeTooLarge))
	}
	tooLarge := func(size int) error {
		return outbox.Permanent(fmt.Errorf("%w: %w", failure.ErrCannotSend, failure.TooLarge{Size: size, Max: 1000000}))
	}
	unreadable := func(detail string) error {
		return &pgconn.PgError{Code: "54000", Message: "out of memory", Detail: detail}
	}
	for _, c := range []struct {
		name string
		errs []error
		want string
	}{
		{"missing topic", []error{missing(0), missing(3), refused1, refused2},
			`[kafka.unknown_topic_or_partition] topic "payments.audit" does not exist: create it, then requeue its events`},
		{"too large for the topic", []error{rejected(0, "10.0.0.1:9092"), rejected(5, "10.0.0.2:9092")},
			`[kafka.message_too_large] the broker refused a record for topic "payments.audit": ` + sarama.ErrMessageSizeTooLarge.Error()},
		{"over MaxMessageBytes", []error{tooLarge(1000001), tooLarge(2 << 20)},
			"[message_too_large] cannot be sent: the record is over the relay's MaxMessageBytes (1000000 bytes): shrink the event, or raise MaxMessageBytes (and the topic's max.message.bytes), then requeue it"},
		{"publisher's own", []error{outbox.Permanent(errors.New("rejected by policy")), outbox.Permanent(outbox.Permanent(errors.New("rejected by policy")))},
			"[_OTHER] rejected by policy"},
	} {
		for _, err := range c.errs {
			if got := failure.Reason(err, topic); got != c.want {
				t.Errorf("%s: failure.Reason(%v)\n got %q\nwant %q", c.name, err, got, c.want)
			}
		}
	}
	a, b := failure.UnreadableReason(unreadable("Cannot enlarge string buffer containing 1073741808 bytes by 4 more bytes.")), failure.UnreadableReason(unreadable("other 12 bytes"))
	if a != b || !strings.Contains(a, "SQLSTATE 54000") {
		t.Errorf("unreadable rows: %q and %q, want one text naming SQLSTATE 54000", a, b)
	}
}
