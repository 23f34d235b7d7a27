package fxoutbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/IBM/sarama"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/outboxconfig"
)

// ErrMissingTopic is matched (errors.Is) by the start error of a relay
// whose topic check found topics missing on the brokers.
var ErrMissingTopic = errors.New("topic missing on the brokers")

// declaredTopics is TopicNames for a topic check, which needs at least one.
func declaredTopics(c Config) ([]string, error) {
	names, err := c.TopicNames()
	if err == nil && len(names) == 0 {
		err = &outbox.ConfigError{Field: "TopicCheck [OUTBOX_TOPICS]", Reason: "is " + c.TopicCheck.String() +
			" but no event types are declared: list them in Config.EventTypes or OUTBOX_EVENT_TYPES " +
			"(e.g. OUTBOX_EVENT_TYPES=payment:payment.created.v1,payment:payment.refunded.v1), or set OUTBOX_TOPICS=off"}
	}
	return names, err
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
		if cfg.TopicCheck != outboxconfig.TopicsCreate {
			return fmt.Errorf("%w: %s: create them with the partitions and replication your consumers need, "+
				"or set OUTBOX_TOPICS=create (Config.TopicCheck = outboxconfig.TopicsCreate)", ErrMissingTopic, strings.Join(missing, ", "))
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
