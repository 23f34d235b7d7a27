package main

import (
	"context"
	"log"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox"
)

// seedRelay is a line-by-line Go transcription of the seed's NestJS
// OutboxRelayService (seed spec, "Outbox-relay"):
//
//	@Interval(500)
//	async publish() {
//	  await this.dataSource.transaction(async (manager) => {
//	    const events = await ...createQueryBuilder('e')
//	      .setLock('pessimistic_write').setOnLocked('skip_locked')
//	      .where('e.publishedAt IS NULL').orderBy('e.id', 'ASC').take(50).getMany();
//	    if (!events.length) return;
//	    const byTopic = Map.groupBy(events, (e) => e.topic);
//	    for (const [topic, batch] of byTopic) {
//	      await this.producer.send({ topic, acks: -1, messages: batch.map(...) });
//	    }
//	    await manager.update(OutboxEventEntity, events.map((e) => e.id), { publishedAt: new Date() });
//	  });
//	}
//
// with the seed's idempotent producer (here sarama's SyncProducer with the
// relay's idempotent acks=all configuration). Like setInterval, a tick
// starts a run even if the previous one has not finished.
type seedRelay struct {
	pool     *pgxpool.Pool
	producer sarama.SyncProducer
	selectQ  string
	updateQ  string
	// published counts events whose batch committed.
	published atomic.Int64
}

func newSeedRelay(pool *pgxpool.Pool, producer sarama.SyncProducer, table outbox.Table) *seedRelay {
	return &seedRelay{
		pool:     pool,
		producer: producer,
		selectQ: "SELECT id, event_id, aggregate_type, aggregate_id, event_type, payload::text, topic, partition_key, created_at, published_at FROM " +
			ident(table) + " e WHERE e.published_at IS NULL ORDER BY e.id ASC LIMIT 50 FOR UPDATE SKIP LOCKED",
		updateQ: "UPDATE " + ident(table) + " SET published_at = $1 WHERE id = ANY($2)",
	}
}

type seedEvent struct {
	id                              int64
	eventID                         string
	aggType, aggID, evType, payload string
	topic, key                      string
	createdAt, publishedAt          *time.Time
}

// publish is one @Interval(500) invocation.
func (s *seedRelay) publish(ctx context.Context) error {
	var sent int
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, s.selectQ)
		if err != nil {
			return err
		}
		events, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (seedEvent, error) {
			var x seedEvent
			var eid [16]byte
			err := r.Scan(&x.id, &eid, &x.aggType, &x.aggID, &x.evType, &x.payload, &x.topic, &x.key, &x.createdAt, &x.publishedAt)
			x.eventID = uuidString(eid)
			return x, err
		})
		if err != nil {
			return err
		}
		if len(events) == 0 {
			return nil
		}
		// Map.groupBy keeps the order in which topics first appear.
		var topics []string
		byTopic := map[string][]seedEvent{}
		for _, e := range events {
			if _, ok := byTopic[e.topic]; !ok {
				topics = append(topics, e.topic)
			}
			byTopic[e.topic] = append(byTopic[e.topic], e)
		}
		for _, topic := range topics {
			batch := byTopic[topic]
			msgs := make([]*sarama.ProducerMessage, len(batch))
			for i, e := range batch {
				msgs[i] = &sarama.ProducerMessage{
					Topic: topic,
					Key:   sarama.StringEncoder(e.key),
					Value: sarama.StringEncoder(e.payload), // JSON.stringify(e.payload)
					Headers: []sarama.RecordHeader{
						{Key: []byte(outbox.HeaderEventID), Value: []byte(e.eventID)},
						{Key: []byte(outbox.HeaderEventType), Value: []byte(e.evType)},
					},
				}
			}
			if err := s.producer.SendMessages(msgs); err != nil {
				return err
			}
		}
		ids := make([]int64, len(events))
		for i, e := range events {
			ids[i] = e.id
		}
		if _, err := tx.Exec(ctx, s.updateQ, time.Now(), ids); err != nil {
			return err
		}
		sent = len(events)
		return nil
	})
	if err == nil {
		s.published.Add(int64(sent)) // committed
	}
	return err
}

// run ticks every 500 ms until ctx ends, then waits for running invocations.
func (s *seedRelay) run(ctx context.Context) {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := s.publish(context.WithoutCancel(ctx)); err != nil {
					log.Printf("seed relay: %v", err) // the seed logs and waits for the next tick
				}
			}()
		}
	}
}

// drainSeed runs the seed's relay over a fixed window (its rate is one
// batch of 50 per 500 ms tick, so draining 100k events would take 1000 s)
// and reports the events committed in that window per second.
func (e *env) drainSeed(ctx context.Context, topic, warm string, n int) (drainRun, error) {
	producer, err := sarama.NewSyncProducer(e.brokers, producerConfig("seed-relay"))
	if err != nil {
		return drainRun{}, err
	}
	defer producer.Close()
	if _, _, err := producer.SendMessage(&sarama.ProducerMessage{Topic: warm, Value: sarama.StringEncoder("{}")}); err != nil {
		return drainRun{}, err
	}
	s := newSeedRelay(e.pool, producer, e.table)
	window := e.p.seedWindow()
	rctx, cancel := context.WithCancel(ctx)
	t0 := time.Now()
	done := make(chan struct{})
	go func() { s.run(rctx); close(done) }()
	// Ticks fall at 0.5 s, 1 s, ... window; the one at the end of the window
	// gets 250 ms to finish (a batch takes a few ms), so the figure is the
	// steady rate: events committed by the ticks in (0, window] / window.
	time.Sleep(window + 250*time.Millisecond)
	cancel()
	<-done
	got := s.published.Load()
	if got >= int64(n) {
		return result(got, time.Since(t0), false), nil
	}
	return result(got, window, true), nil
}

func uuidString(b [16]byte) string {
	const hexd = "0123456789abcdef"
	out := make([]byte, 36)
	j := 0
	for i, x := range b {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			out[j] = '-'
			j++
		}
		out[j], out[j+1] = hexd[x>>4], hexd[x&15]
		j += 2
	}
	return string(out)
}
