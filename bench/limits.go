package main

import (
	"context"
	"fmt"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/relay"
)

// benchMessages builds n messages shaped like the relay's: key, 256-byte
// payload, headers x-event-id and x-event-type.
func (e *env) benchMessages(topic string, n int) []relay.Message {
	msgs := make([]relay.Message, n)
	for i := range msgs {
		k := randKey(e.p.Keys)
		id, _ := uuid.NewV7()
		msgs[i] = relay.Message{
			EventID: id,
			Topic:   topic,
			Key:     []byte(orderID(k)),
			Value:   payload(k, i),
			Headers: []relay.Header{
				{Key: outbox.HeaderEventID, Value: []byte(id.String())},
				{Key: outbox.HeaderEventType, Value: []byte(eventType)},
			},
		}
	}
	return msgs
}

// drainProducer is the producer ceiling: one sarama AsyncProducer with the
// relay's configuration, fed the whole backlog as fast as it takes it.
func (e *env) drainProducer(ctx context.Context, topic string, n int) (drainRun, error) {
	msgs := e.benchMessages(topic, n)
	pms := make([]*sarama.ProducerMessage, n)
	for i, m := range msgs {
		hs := make([]sarama.RecordHeader, len(m.Headers))
		for j, h := range m.Headers {
			hs[j] = sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value}
		}
		pms[i] = &sarama.ProducerMessage{Topic: topic, Key: sarama.ByteEncoder(m.Key), Value: sarama.ByteEncoder(m.Value), Headers: hs}
	}
	prod, err := sarama.NewAsyncProducer(e.brokers, producerConfig("fxbench-producer"))
	if err != nil {
		return drainRun{}, err
	}
	defer prod.Close()
	// Warm up: the first message connects and loads the topic's metadata.
	prod.Input() <- &sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder("warm"), Value: sarama.StringEncoder("{}")}
	select {
	case <-prod.Successes():
	case pe := <-prod.Errors():
		return drainRun{}, pe.Err
	}
	prog := newProgress(n)
	errc := make(chan error, 1)
	go func() {
		for range n {
			select {
			case <-prod.Successes():
				prog.add(1)
			case pe := <-prod.Errors():
				select {
				case errc <- pe.Err:
				default:
				}
				return
			}
		}
	}()
	t0 := time.Now()
	go func() {
		for _, m := range pms {
			prod.Input() <- m
		}
	}()
	elapsed, capped := prog.wait(ctx, t0, e.p.drainCap())
	select {
	case err := <-errc:
		return drainRun{}, fmt.Errorf("produce: %w", err)
	default:
	}
	// The warm-up record is not counted; the topic check allows for it.
	return result(prog.n.Load(), elapsed, capped), nil
}

// drainPublisher is the relay's publish step alone: relay.SaramaPublisher,
// batches of batch messages, each waited for, no database.
func (e *env) drainPublisher(ctx context.Context, topic, warm string, n, batch int) (drainRun, error) {
	msgs := e.benchMessages(topic, n)
	sp, err := relay.NewSaramaPublisher(e.brokers, producerConfig("fxbench-publisher"))
	if err != nil {
		return drainRun{}, err
	}
	defer sp.Close()
	if err := sp.Publish(ctx, []relay.Message{{Topic: warm, Key: []byte("k"), Value: []byte(`{}`)}}); err != nil {
		return drainRun{}, err
	}
	t0 := time.Now()
	var done int64
	for i := 0; i < n; i += batch {
		if time.Since(t0) > e.p.drainCap() {
			return result(done, time.Since(t0), true), nil
		}
		b := msgs[i:min(i+batch, n)]
		if err := sp.Publish(ctx, b); err != nil {
			return drainRun{}, err
		}
		done += int64(len(b))
	}
	return result(done, time.Since(t0), false), nil
}
