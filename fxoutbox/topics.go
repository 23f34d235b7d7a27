package fxoutbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/IBM/sarama"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/envconfig"
	"github.com/fxoutbox/outbox/internal/textcut"
)

// EventType declares an event a service writes, so that its topic is known
// before the first event: Config.TopicNames lists the topics, and
// Config.TopicCheck checks or creates them at start.
type EventType struct {
	// AggregateType and Type are those of the events, e.g. "payment" and
	// "payment.created.v1"; the topic is derived from them as Config.Topics
	// says.
	AggregateType string
	Type          string
	// Topic is the topic of events that name theirs. Default "": derived.
	Topic string
}

// TopicCheck says what the relay does at start about the topics of the
// declared event types (Config.EventTypes).
type TopicCheck int

const (
	// TopicsOff checks nothing (default). An event for a missing topic
	// fails at publish: with the brokers' auto-creation off it is retried
	// and then parked (Config.MaxAttempts).
	TopicsOff TopicCheck = iota
	// TopicsCheck fails the start when a topic is missing, naming it.
	TopicsCheck
	// TopicsCreate creates missing topics with TopicPartitions and
	// TopicReplicationFactor, and fails the start if it cannot.
	TopicsCreate
)

func (t TopicCheck) String() string {
	switch t {
	case TopicsOff:
		return "off"
	case TopicsCheck:
		return "check"
	case TopicsCreate:
		return "create"
	}
	return fmt.Sprintf("TopicCheck(%d)", int(t))
}

// ErrMissingTopic is matched (errors.Is) by the start error of a relay
// whose topic check found topics missing on the brokers.
var ErrMissingTopic = errors.New("topic missing on the brokers")

// TopicNames returns the topics of the declared event types
// (Config.EventTypes), derived as the writer derives them, sorted and
// without duplicates: the list to create or to grant the relay's producer
// access to. A type whose topic cannot be derived is an error naming it.
func (c Config) TopicNames() ([]string, error) {
	c, err := c.withDefaults()
	if err != nil {
		return nil, err
	}
	var out []string
	for i, et := range c.EventTypes {
		topic := et.Topic
		if topic == "" {
			if topic, err = c.Topics(c.Service, outbox.Event{AggregateType: et.AggregateType, Type: et.Type}); err != nil {
				return nil, &outbox.ConfigError{Field: fmt.Sprintf("EventTypes[%d] [OUTBOX_EVENT_TYPES]", i),
					Reason: fmt.Sprintf("(%s, %s): the topic %v", textcut.Quote(et.AggregateType, 64), textcut.Quote(et.Type, 64), err)}
			}
		}
		if err := outbox.ValidateTopic(topic); err != nil {
			return nil, &outbox.ConfigError{Field: fmt.Sprintf("EventTypes[%d] [OUTBOX_EVENT_TYPES]", i), Reason: err.Error()}
		}
		out = append(out, topic)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// declaredTopics is TopicNames for a topic check, which needs at least one.
func (c Config) declaredTopics() ([]string, error) {
	names, err := c.TopicNames()
	if err != nil {
		return nil, err
	}
	if len(names) == 0 {
		return nil, &outbox.ConfigError{Field: "TopicCheck [OUTBOX_TOPICS]", Reason: "is " + c.TopicCheck.String() +
			" but no event types are declared: list them in Config.EventTypes or OUTBOX_EVENT_TYPES " +
			"(e.g. OUTBOX_EVENT_TYPES=payment:payment.created.v1,payment:payment.refunded.v1), or set OUTBOX_TOPICS=off"}
	}
	return names, nil
}

// ExplicitTopics is the TopicFunc of a service whose events all name their
// Topic [OUTBOX_TOPIC_NAMING=explicit]: it derives none, so Config.Service
// may stay empty, and an event without a Topic fails at Add.
func ExplicitTopics(service string, e outbox.Event) (string, error) {
	return envconfig.ExplicitTopics(service, e)
}

// derivesFromService reports whether f is one of the library's namings,
// which need a service name.
func derivesFromService(f outbox.TopicFunc) bool {
	p := reflect.ValueOf(f).Pointer()
	return p == reflect.ValueOf(outbox.TopicPerEvent).Pointer() || p == reflect.ValueOf(outbox.TopicPerAggregate).Pointer()
}

// ensureTopics checks that topics exist on the brokers, creating the
// missing ones under TopicsCreate, within ctx (the start timeout).
func ensureTopics(ctx context.Context, cfg Config, producer *sarama.Config, topics []string, log *slog.Logger) error {
	sc := *producer
	// sarama's admin client takes no context: bound each of its requests.
	per := 10 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		per = max(min(per, time.Until(dl)/2), 100*time.Millisecond)
	}
	sc.Net.DialTimeout, sc.Net.ReadTimeout, sc.Net.WriteTimeout, sc.Admin.Timeout = per, per, per, per
	sc.Admin.Retry.Max, sc.Metadata.Retry.Max = 2, 2
	admin, err := sarama.NewClusterAdmin(cfg.Brokers, &sc)
	if err != nil {
		return fmt.Errorf("topic check (OUTBOX_TOPICS=%s): connect to Kafka at KAFKA_BROKERS=%s: %w", cfg.TopicCheck, strings.Join(cfg.Brokers, ","), err)
	}
	defer admin.Close()
	for {
		missing, err := missingTopics(admin, topics, false)
		if err != nil {
			return fmt.Errorf("topic check (OUTBOX_TOPICS=%s): %w", cfg.TopicCheck, err)
		}
		if len(missing) == 0 {
			return nil
		}
		if cfg.TopicCheck != TopicsCreate {
			return fmt.Errorf("%w: %s: create them with the partitions and replication your consumers need, "+
				"or set OUTBOX_TOPICS=create (Config.TopicCheck = fxoutbox.TopicsCreate)", ErrMissingTopic, strings.Join(missing, ", "))
		}
		for _, t := range missing {
			err := admin.CreateTopic(t, &sarama.TopicDetail{NumPartitions: cfg.TopicPartitions, ReplicationFactor: cfg.TopicReplicationFactor}, false)
			if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
				return fmt.Errorf("create topic %s (OUTBOX_TOPICS=create, partitions %d, replication factor %d; -1 is the broker's default): %w",
					t, cfg.TopicPartitions, cfg.TopicReplicationFactor, err)
			}
			if err == nil {
				log.Info("outbox: created topic", "topic", t, "partitions", cfg.TopicPartitions, "replication_factor", cfg.TopicReplicationFactor)
			}
		}
		// Created: wait until the metadata shows them with their leaders.
		for {
			if missing, err = missingTopics(admin, missing, true); err == nil && len(missing) == 0 {
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("created topics %s are not ready: %w", strings.Join(missing, ", "), ctx.Err())
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

// missingTopics returns the topics that do not exist; with ready, also
// those that have no partition yet or a partition without a leader (just
// created).
func missingTopics(admin sarama.ClusterAdmin, topics []string, ready bool) ([]string, error) {
	md, err := admin.DescribeTopics(topics)
	if err != nil {
		return nil, err
	}
	var missing []string
	found := map[string]bool{}
	for _, t := range md {
		switch {
		case errors.Is(t.Err, sarama.ErrUnknownTopicOrPartition):
		case t.Err != sarama.ErrNoError:
			return nil, fmt.Errorf("describe topic %s: %w", t.Name, t.Err)
		case !ready || (len(t.Partitions) > 0 && !slices.ContainsFunc(t.Partitions, func(p *sarama.PartitionMetadata) bool { return p.Leader < 0 })):
			found[t.Name] = true
		}
	}
	for _, t := range topics {
		if !found[t] {
			missing = append(missing, t)
		}
	}
	return missing, nil
}
