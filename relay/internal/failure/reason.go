package failure

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/textcut"
)

// The reason of a failed event: what the relay stores in its last_error,
// what admin.ReadStatus groups by, what outboxctl shows and what its
// --error filter searches. It is "[<error.type>] <message>", and the same
// text for every event that failed for the same cause: the message names the
// cause and, when the cause is the topic's or the broker's, the topic, but
// never when it happened, how long ago, counts, sizes of one event,
// partitions, offsets, broker addresses or ids, and never nests an earlier
// reason. Those details go to the relay's log lines (attribute "error").
// Examples:
//
//	[kafka.unknown_topic_or_partition] topic "payments.audit" does not exist: create it, then requeue its events
//	[kafka.message_too_large] the broker refused a record for topic "orders": kafka server: Message was too large, ...
//	[message_too_large] cannot be sent: the record is over the relay's MaxMessageBytes (1000000 bytes): ...
//	[invalid_topic] cannot be sent: "not a topic!" is not a valid Kafka topic name (...)
//	[database] cannot be sent: the stored row cannot be read: PostgreSQL: ... (SQLSTATE 54000): fix the row ...
//
// A Publisher's own permanent errors are stored by their text (without the
// "permanent: " of PermanentError): keep such texts free of varying details,
// or give the error a method Reason() string returning a stable text, which
// is then stored instead.
const ReasonMax = 1000

// LogFieldMax is how much of a stored field (topic, event type) a reason or
// a log line shows: a row written by hand may hold anything.
const LogFieldMax = 300

// Reason returns the stable reason the relay stores for an event of topic
// that failed with err; "" for nil. See the format above.
func Reason(err error, topic string) string {
	if err == nil {
		return ""
	}
	return textcut.Cut("["+Type(err)+"] "+reasonMessage(err, topic), ReasonMax)
}

func reasonMessage(err error, topic string) string {
	var rs interface{ Reason() string }
	if errors.As(err, &rs) {
		if s := rs.Reason(); s != "" {
			return s
		}
	}
	var (
		tl   TooLarge
		kerr sarama.KError
		cerr sarama.ConfigurationError
	)
	switch {
	case errors.As(err, &tl):
		return fmt.Sprintf("cannot be sent: the record is over the relay's MaxMessageBytes (%d bytes): shrink the event, or raise MaxMessageBytes (and the topic's max.message.bytes), then requeue it", tl.Max)
	case errors.Is(err, ErrCannotSend):
		// "cannot be sent: <why>", a text of the relay that depends only on
		// the event (its topic's name, its stored headers).
		return cause(err).Error()
	case errors.Is(err, sarama.ErrUnknownTopicOrPartition):
		return fmt.Sprintf("topic %s does not exist: create it, then requeue its events", strconv.Quote(textcut.Cut(topic, LogFieldMax)))
	case errors.As(err, &kerr):
		return fmt.Sprintf("the broker refused a record for topic %s: %s", strconv.Quote(textcut.Cut(topic, LogFieldMax)), kerr.Error())
	case errors.As(err, &cerr):
		return fmt.Sprintf("the producer refused a record for topic %s by its configuration (sarama.ConfigurationError; the relay's log has its words)", strconv.Quote(textcut.Cut(topic, LogFieldMax)))
	}
	return cause(err).Error()
}

// cause strips the relay's own wrapping from err: PermanentError and the
// missing topic's refusal.
func cause(err error) error {
	for {
		var pe *outbox.PermanentError
		var ns *NotSent
		switch {
		case errors.As(err, &ns):
			err = ns.Err
		case errors.As(err, &pe):
			err = pe.Err
		default:
			return err
		}
	}
}

// NotSent is the relay's refusal of an event whose topic the broker
// reported missing Ago ago (the relay's memory of missing topics); it wraps
// the broker's report, Err.
type NotSent struct {
	Ago time.Duration
	Err error
}

func (e *NotSent) Error() string {
	return fmt.Sprintf("not sent: the broker reported the topic missing %v ago: %v", e.Ago.Round(time.Millisecond), e.Err)
}
func (e *NotSent) Unwrap() error { return e.Err }

// UnreadableReason is the stable reason of a row that cannot be read: what
// PostgreSQL said (its message and SQLSTATE, without the detail, which the
// log line carries), and what to do.
func UnreadableReason(err error) string {
	var pe *pgconn.PgError
	what := err.Error()
	if errors.As(err, &pe) {
		what = fmt.Sprintf("PostgreSQL: %s (SQLSTATE %s)", pe.Message, pe.Code)
	}
	return "cannot be sent: the stored row cannot be read: " + what +
		"; fix the row (e.g. rewrite its payload or headers) or delete it, then requeue it"
}

// UnreadableDetail is what the log line of an unreadable row adds to its
// reason: PostgreSQL's detail, when there is one.
func UnreadableDetail(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Detail
	}
	return ""
}
