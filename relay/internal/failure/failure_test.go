package failure_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/relay/internal/failure"
)

// The relay and its producer agree on which failures condemn a whole
// topic; the relay's own refusals do too, the producer never sees them.
func TestTopicLevel(t *testing.T) {
	for _, c := range []struct {
		err          error
		kafka, relay bool
	}{
		{fmt.Errorf("metadata: %w", sarama.ErrUnknownTopicOrPartition), true, true},
		{outbox.Permanent(sarama.ErrInvalidTopic), true, true},
		{sarama.ErrTopicAuthorizationFailed, true, true},
		{fmt.Errorf("%w: %w", failure.ErrCannotSend, failure.TooLarge{Size: 2, Max: 1}), false, true},
		{sarama.ErrMessageSizeTooLarge, false, false},
		{failure.ErrHeld, false, false},
	} {
		if got := failure.KafkaTopicLevel(c.err); got != c.kafka {
			t.Errorf("KafkaTopicLevel(%v) = %v, want %v", c.err, got, c.kafka)
		}
		if got := failure.TopicLevel(c.err); got != c.relay {
			t.Errorf("TopicLevel(%v) = %v, want %v", c.err, got, c.relay)
		}
	}
}

// An error of a database step is named by its database cause; the same
// error outside one keeps the general classification.
func TestDatabaseStep(t *testing.T) {
	locked := &pgconn.PgError{Code: "55P03", Message: "lock not available"}
	for _, c := range []struct {
		err  error
		want string
	}{
		{&failure.DBStep{Err: locked}, "database.conflict"},
		{&failure.DBStep{Err: context.DeadlineExceeded}, "database.timeout"},
		{&failure.DBStep{Err: context.Canceled}, failure.Canceled},
		{&failure.DBStep{Err: errors.New("scan: wrong type")}, failure.Database},
		{context.DeadlineExceeded, failure.Timeout},
		{fmt.Errorf("%w: %w", failure.ErrCannotSend, failure.BadHeaders{Err: errors.New("not an object")}), failure.InvalidHeaders},
	} {
		if got := failure.Type(c.err); got != c.want {
			t.Errorf("Type(%v) = %q, want %q", c.err, got, c.want)
		}
	}
	if !failure.FromDatabase(&failure.DBStep{Err: errors.New("x")}) || failure.FromDatabase(errors.New("x")) {
		t.Error("FromDatabase tells a database step's error from another")
	}
}
