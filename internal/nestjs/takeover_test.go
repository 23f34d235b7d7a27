package nestjs_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/fxoutbox"
	"github.com/fxoutbox/outbox/internal/nestjs"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/migrations"
)

// TestTakeOverFromTheNestJSRelay performs the steps of docs/nestjs.md on a
// NestJS table with a backlog, and checks what a consumer receives.
//
// The NestJS application writes 400 events over 12 keys on two topics (6
// partitions each) with TypeORM's INSERT; its relay publishes three batches
// (its own SQL: 50 rows FOR UPDATE SKIP LOCKED in id order, one kafkajs send
// per topic, UPDATE published_at, commit) and crashes in the fourth after
// sending it, before marking it. The relay is stopped there. Its writers
// keep inserting rows of the old shape (200 more) while the migrations run
// (migrations.Outbox.Up) and the fxoutbox relay starts, as the fx module runs it.
//
// The consumer gets every event; for each key the first deliveries in id
// order; the key, x-event-id and x-event-type headers (and nothing else)
// and the JSON value as the NestJS relay sent them; each key on the
// partition kafkajs's murmur2 partitioner chose; and duplicates only of the
// crashed batch, each once: the documented bound, one NestJS batch.
func TestTakeOverFromTheNestJSRelay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	brokers := testenv.Brokers(t)
	tbl := outbox.Table{Schema: testenv.Name("nestjs_")}
	nest := nestjs.Create(t, pool, tbl.Schema)
	const partitions = 6
	topics := []string{testenv.Topic(t, brokers, partitions), testenv.Topic(t, brokers, partitions)}
	cons := testenv.Consume(t, brokers, topics...)
	const keys = 12
	event := func(i int) nestjs.Event {
		k := i % keys
		return nestjs.NewEvent(i, fmt.Sprintf("order-%d", k), topics[k%2])
	}

	// The backlog, and the NestJS relay's last batches.
	for i := range 400 {
		if _, err := nestjs.Write(ctx, nest, event(i)); err != nil {
			t.Fatal(err)
		}
	}
	producer := nestjs.Producer(t, brokers)
	for range 3 {
		if sent, err := nestjs.RelayBatch(ctx, nest, producer, true); err != nil || len(sent) != nestjs.BatchSize {
			t.Fatalf("NestJS relay batch: %d sent, %v", len(sent), err)
		}
	}
	crashed, err := nestjs.RelayBatch(ctx, nest, producer, false)
	if err != nil || len(crashed) != nestjs.BatchSize {
		t.Fatalf("NestJS relay's crashed batch: %d sent, %v", len(crashed), err)
	}
	// 1. The NestJS relay is stopped (it ran its batches above, and runs no more).

	// 2. Its writers go on, through the migration and the switch.
	var wg sync.WaitGroup
	writeErr := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 400; i < 600; i++ {
			if _, err := nestjs.Write(ctx, nest, event(i)); err != nil {
				writeErr <- fmt.Errorf("NestJS writer, event %d: %w", i, err)
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()

	// 3. The migrations.
	if err := migrations.Outbox.Up(ctx, pool, tbl); err != nil {
		t.Fatal(err)
	}

	// 4. The fxoutbox relay, as the fx module runs it, with its default
	// partitioner: Java's murmur2, which kafkajs 2.x (the NestJS relay's
	// client) uses too, so each key stays on its partition.
	app := fxtest.New(t, fx.NopLogger,
		fx.Supply(pool, fxoutbox.Config{Table: tbl, Brokers: brokers, Writer: unitofwork.Config{Service: "order-service"}, Relay: relay.Config{PollInterval: 100 * time.Millisecond}}),
		fxoutbox.Module)
	app.RequireStart()
	wg.Wait()
	select {
	case err := <-writeErr:
		t.Fatal(err)
	default:
	}
	testenv.Eventually(t, time.Minute, func() (bool, string) {
		var left int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+sqlname.Ident(tbl)+" WHERE published_at IS NULL").Scan(&left); err != nil {
			t.Fatal(err)
		}
		return left == 0, fmt.Sprintf("%d rows unpublished", left)
	})
	app.RequireStop()

	// What the table holds: every event the NestJS application wrote.
	type want struct {
		id                    int64
		eventType, topic, key string
		value                 []byte // JSON.stringify(payload)
	}
	rows, err := pool.Query(ctx, "SELECT id, event_id::text, event_type, topic, partition_key, payload, headers IS NULL FROM "+sqlname.Ident(tbl)+" ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	events := map[string]want{}
	var (
		w        want
		eventID  string
		payload  []byte
		noHeader bool
	)
	_, err = pgx.ForEachRow(rows, []any{&w.id, &eventID, &w.eventType, &w.topic, &w.key, &payload, &noHeader}, func() error {
		if !noHeader {
			return fmt.Errorf("row %d has headers: only the NestJS writer wrote here", w.id)
		}
		var v bytes.Buffer
		if err := json.Compact(&v, payload); err != nil {
			return err
		}
		w.value = v.Bytes()
		events[eventID] = w
		return nil
	})
	if err != nil || len(events) != 600 {
		t.Fatalf("%d events in the table (%v), want 600", len(events), err)
	}

	total := testenv.RecordCount(t, brokers, topics[0]) + testenv.RecordCount(t, brokers, topics[1])
	msgs := cons.WaitFor(total, 30*time.Second)
	deliveries := map[string]int{}
	last := map[string]int64{} // per key, the id of its last first delivery
	for _, m := range msgs {
		id := testenv.Header(m, outbox.HeaderEventID)
		e, ok := events[id]
		if !ok {
			t.Fatalf("consumed an event the table does not hold: %s/%d@%d x-event-id %q", m.Topic, m.Partition, m.Offset, id)
		}
		var hs []string
		for _, h := range m.Headers {
			hs = append(hs, string(h.Key))
		}
		if m.Topic != e.topic || string(m.Key) != e.key || testenv.Header(m, outbox.HeaderEventType) != e.eventType ||
			!slices.Equal(hs, []string{outbox.HeaderEventID, outbox.HeaderEventType}) {
			t.Errorf("event %d arrived on %s with key %q, headers %v, x-event-type %q; the NestJS relay sends it on %s with key %q, headers x-event-id, x-event-type = %q",
				e.id, m.Topic, m.Key, hs, testenv.Header(m, outbox.HeaderEventType), e.topic, e.key, e.eventType)
		}
		var v bytes.Buffer
		if err := json.Compact(&v, m.Value); err != nil || !bytes.Equal(v.Bytes(), e.value) {
			t.Errorf("event %d's value %s (%v), the NestJS relay sends %s", e.id, m.Value, err, e.value)
		}
		p, err := sarama.NewMurmur2Partitioner(m.Topic).Partition(&sarama.ProducerMessage{Key: sarama.StringEncoder(e.key)}, partitions)
		if err != nil || m.Partition != p {
			t.Errorf("event %d (key %s) is on partition %d, kafkajs (murmur2) puts the key on %d (%v)", e.id, e.key, m.Partition, p, err)
		}
		deliveries[id]++
		if deliveries[id] > 1 {
			continue
		}
		if e.id < last[e.key] {
			t.Errorf("key %s: event %d first delivered after event %d", e.key, e.id, last[e.key])
		}
		last[e.key] = e.id
	}
	resent := map[string]bool{}
	for _, s := range crashed {
		resent[s.EventID] = true
	}
	dups := 0
	for id, e := range events {
		n := deliveries[id]
		switch {
		case n == 0:
			t.Errorf("event %d was never delivered", e.id)
		case resent[id] && n != 2:
			t.Errorf("event %d of the crashed NestJS batch was delivered %d times, want twice (sent, not marked, sent again)", e.id, n)
		case !resent[id] && n != 1:
			t.Errorf("event %d was delivered %d times", e.id, n)
		}
		if n > 1 {
			dups++
		}
	}
	if dups > nestjs.BatchSize {
		t.Errorf("%d events delivered twice, more than one NestJS batch (%d)", dups, nestjs.BatchSize)
	}
	t.Logf("%d events, %d records (%d duplicates, all of the crashed NestJS batch), %d keys in order", len(events), len(msgs), dups, len(last))
}
