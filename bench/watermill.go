package main

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
)

// watermill's outbox, set up as its documentation and its
// transactional-events-forwarder example do: the handler publishes through a
// watermill-sql Publisher on its transaction, wrapped by forwarder.NewPublisher
// (which envelopes the message and sends it to one SQL topic); a
// forwarder.NewForwarder subscribes that SQL topic (watermill-sql Subscriber,
// PostgreSQL schema and offsets adapters) and publishes each message to
// Kafka (watermill-kafka Publisher). PostgreSQL is reached through pgx's
// database/sql driver.
const wmForwarderTopic = "events_to_forward"

func wmSchema(batch int) wmsql.DefaultPostgreSQLSchema {
	return wmsql.DefaultPostgreSQLSchema{
		GenerateMessagesTableName: func(topic string) string { return `"` + schema + `"."watermill_` + topic + `"` },
		SubscribeBatchSize:        batch, // 0: the adapter's default, 100
	}
}

func wmOffsets() wmsql.DefaultPostgreSQLOffsetsAdapter {
	return wmsql.DefaultPostgreSQLOffsetsAdapter{
		GenerateMessagesOffsetsTableName: func(topic string) string { return `"` + schema + `"."watermill_offsets_` + topic + `"` },
	}
}

// wmSaramaConfig is watermill-kafka's default sync-publisher configuration
// raised to the guarantees every contender here has: idempotent, acks=all
// (watermill-kafka's default is acks=1, not idempotent).
func wmSaramaConfig() *sarama.Config {
	c := wmkafka.DefaultSaramaSyncPublisherConfig()
	c.Version = sarama.V2_8_0_0
	c.Producer.Idempotent = true
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Net.MaxOpenRequests = 1
	return c
}

// wmMarshaler keys records by the event's partition key, like the relay.
func wmMarshaler() wmkafka.Marshaler {
	return wmkafka.NewWithPartitioningMarshaler(func(_ string, msg *message.Message) (string, error) {
		return msg.Metadata.Get("partition_key"), nil
	})
}

func wmMessage(key, seq int) *message.Message {
	id, _ := uuid.NewV7()
	m := message.NewMessage(id.String(), payload(key, seq))
	m.Metadata.Set("partition_key", orderID(key))
	m.Metadata.Set("event_type", eventType)
	return m
}

// wmPublishTx records messages in tx the way the docs show.
func wmPublishTx(tx *sql.Tx, topic string, msgs ...*message.Message) error {
	pub, err := wmsql.NewPublisher(wmsql.TxFromStdSQL(tx), wmsql.PublisherConfig{SchemaAdapter: wmSchema(0)}, nil)
	if err != nil {
		return err
	}
	return forwarder.NewPublisher(pub, forwarder.PublisherConfig{ForwarderTopic: wmForwarderTopic}).Publish(topic, msgs...)
}

// resetWatermill creates watermill's tables if needed and empties them.
func (e *env) resetWatermill(ctx context.Context) error {
	sub, err := wmsql.NewSubscriber(wmsql.BeginnerFromStdSQL(e.sqldb), wmsql.SubscriberConfig{
		SchemaAdapter: wmSchema(0), OffsetsAdapter: wmOffsets(),
	}, nil)
	if err != nil {
		return err
	}
	defer sub.Close()
	if err := sub.SubscribeInitialize(wmForwarderTopic); err != nil {
		return err
	}
	_, err = e.pool.Exec(ctx, "TRUNCATE "+wmSchema(0).MessagesTable(wmForwarderTopic)+", "+
		wmOffsets().MessagesOffsetsTable(wmForwarderTopic)+" RESTART IDENTITY")
	return err
}

// preloadWatermill writes the backlog through watermill's own publisher, in
// transactions of 1000 messages.
func (e *env) preloadWatermill(ctx context.Context, topic string, n int) error {
	if err := e.resetWatermill(ctx); err != nil {
		return err
	}
	const chunk = 1000
	for i := 0; i < n; i += chunk {
		msgs := make([]*message.Message, 0, chunk)
		for j := i; j < min(i+chunk, n); j++ {
			msgs = append(msgs, wmMessage(randKey(e.p.Keys), j))
		}
		tx, err := e.sqldb.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if err := wmPublishTx(tx, topic, msgs...); err != nil {
			_ = tx.Rollback()
			return err
		}
		if err := tx.Commit(); err != nil {
			return err
		}
	}
	_, err := e.pool.Exec(ctx, "VACUUM ANALYZE "+wmSchema(0).MessagesTable(wmForwarderTopic))
	return err
}

// countingPublisher counts the messages its Kafka publisher acknowledged.
type countingPublisher struct {
	message.Publisher
	prog *progress
}

func (c countingPublisher) Publish(topic string, msgs ...*message.Message) error {
	err := c.Publisher.Publish(topic, msgs...)
	if err == nil {
		c.prog.add(len(msgs))
	}
	return err
}

// forwarder runs watermill's Forwarder with SubscribeBatchSize batch (0:
// default) and returns a stop function.
func (e *env) startForwarder(ctx context.Context, warm string, batch int, prog *progress) (t0 time.Time, stop func() error, err error) {
	kpub, err := wmkafka.NewPublisher(wmkafka.PublisherConfig{
		Brokers:               e.brokers,
		Marshaler:             wmMarshaler(),
		OverwriteSaramaConfig: wmSaramaConfig(),
	}, nil)
	if err != nil {
		return t0, nil, err
	}
	if err := kpub.Publish(warm, wmMessage(0, 0)); err != nil {
		kpub.Close()
		return t0, nil, fmt.Errorf("warm up watermill publisher: %w", err)
	}
	sub, err := wmsql.NewSubscriber(wmsql.BeginnerFromStdSQL(e.sqldb), wmsql.SubscriberConfig{
		SchemaAdapter:    wmSchema(batch),
		OffsetsAdapter:   wmOffsets(),
		InitializeSchema: true,
	}, nil)
	if err != nil {
		kpub.Close()
		return t0, nil, err
	}
	var pub message.Publisher = countingPublisher{Publisher: kpub, prog: prog}
	fwd, err := forwarder.NewForwarder(sub, pub, watermill.NopLogger{}, forwarder.Config{ForwarderTopic: wmForwarderTopic})
	if err != nil {
		kpub.Close()
		sub.Close()
		return t0, nil, err
	}
	runErr := make(chan error, 1)
	t0 = time.Now()
	go func() { runErr <- fwd.Run(context.WithoutCancel(ctx)) }()
	select {
	case <-fwd.Running():
	case err := <-runErr:
		return t0, nil, fmt.Errorf("forwarder: %w", err)
	case <-time.After(30 * time.Second):
		return t0, nil, fmt.Errorf("forwarder did not start")
	}
	return t0, func() error {
		err := fwd.Close()
		<-runErr
		_ = sub.Close()
		_ = kpub.Close()
		return err
	}, nil
}

func (e *env) drainWatermill(ctx context.Context, topic, warm string, n, batch int) (drainRun, error) {
	prog := newProgress(n)
	t0, stop, err := e.startForwarder(ctx, warm, batch, prog)
	if err != nil {
		return drainRun{}, err
	}
	elapsed, capped := prog.wait(ctx, t0, e.p.drainCap())
	if err := stop(); err != nil {
		return drainRun{}, err
	}
	return result(min(prog.n.Load(), int64(n)), elapsed, capped), nil
}
