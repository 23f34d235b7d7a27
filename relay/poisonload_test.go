package relay_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// 5,000 good events over 100 keys, written while a relay with the default
// settings runs, among 20 poison events on ten of those keys: 10 larger than
// their topic's max.message.bytes (but within the relay's and the
// producer's limits, so only the broker refuses them) and 10 for a topic
// that does not exist. Poison costs clean keys seconds: every good event is
// published within 30 s of the end of the writes (before the relay held
// back all keys for minutes), good events behind a poison event of their
// key included, and the poison is parked with its reasons.
//
// With the producer's topic auto-creation off, the missing topic stays
// missing; with it on, a broker that auto-creates topics (kfake here) creates
// it and those 10 events are published, while one that does not (Apache
// Kafka as scripts/kafka.sh runs it) refuses them like the other case.
// kfake and Apache Kafka both enforce a topic's max.message.bytes.
func TestPoisonCostsCleanKeysSeconds(t *testing.T) {
	t.Parallel()
	for _, autoCreate := range []bool{false, true} {
		t.Run(fmt.Sprintf("auto-create=%v", autoCreate), func(t *testing.T) {
			s := newSetup(t)
			brokers := s.kafka(t)
			limit := "300000"
			topic := testenv.Name("test.topic.small.")
			testenv.CreateTopicWithConfig(t, brokers, topic, 6, map[string]*string{"max.message.bytes": &limit})
			missing := testenv.Name("test.missing.")
			cons := testenv.Consume(t, brokers, topic)

			cfg := relay.DefaultSaramaConfig()
			cfg.Metadata.AllowAutoTopicCreation = autoCreate
			pub, err := relay.NewSaramaPublisher(brokers, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer pub.Close()
			r := s.relay(t, pub, relay.Config{})
			if err := r.Start(s.ctx); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = r.Stop(s.ctx) }()

			const good, keys, chunk = 5000, 100, 100
			big := []byte(`{"blob":"` + strings.Repeat("x", 400000) + `"}`)
			var tooLarge, toMissing []uuid.UUID
			start := time.Now()
			for c := range good / chunk {
				err := s.uow.Do(s.ctx, func(ctx context.Context, tx unitofwork.Tx) error {
					for i := range chunk {
						n := c*chunk + i
						if err := tx.Add(ctx, outbox.Event{
							AggregateType: "acct", AggregateID: fmt.Sprintf("k%d", n%keys), Type: "acct.changed.v1",
							Topic: topic, Payload: map[string]int{"seq": n},
						}); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
				if c%5 == 2 { // 20 poison events over the writes, on keys k0, k10, ... k90, before more of their keys' events
					k := fmt.Sprintf("k%d", (c/5)*10)
					tooLarge = append(tooLarge, s.insertRaw(t, topic, k, big))
					toMissing = append(toMissing, s.insertRaw(t, missing, k, []byte(`{}`)))
				}
				r.Wake()
			}
			wrote := time.Now()
			t.Logf("wrote %d good and %d poison events in %v", good, len(tooLarge)+len(toMissing), wrote.Sub(start).Round(time.Millisecond))

			// Every good event, within a bound far above the few seconds it takes.
			testenv.Eventually(t, 30*time.Second, func() (bool, string) {
				ids := map[string]bool{}
				for _, m := range cons.Messages() {
					if testenv.Header(m, outbox.HeaderEventType) == "acct.changed.v1" {
						ids[testenv.Header(m, outbox.HeaderEventID)] = true
					}
				}
				return len(ids) == good, fmt.Sprintf("%d of %d good events published", len(ids), good)
			})
			t.Logf("every good event published %v after the writes", time.Since(wrote).Round(time.Millisecond))

			// The poison: parked with its reasons (or, for the missing topic
			// on a broker that auto-creates it, published).
			waitUntil(t, 60*time.Second, "the poison events to be parked", func() bool { return s.unpublishedUnparked(t) == 0 })
			t.Logf("all poison settled %v after the writes", time.Since(wrote).Round(time.Millisecond))
			for _, id := range tooLarge {
				if _, parked, attempts, lastErr := s.row(t, id); !parked || !strings.Contains(lastErr, "too large") {
					t.Errorf("event over the topic's max.message.bytes: parked %v after %d attempts, last_error %q", parked, attempts, lastErr)
				}
			}
			created := 0
			for _, id := range toMissing {
				published, parked, attempts, lastErr := s.row(t, id)
				switch {
				case published && autoCreate:
					created++
				case parked && strings.Contains(lastErr, "does not exist"):
				default:
					t.Errorf("event for a missing topic: published %v parked %v after %d attempts, last_error %q", published, parked, attempts, lastErr)
				}
			}
			t.Logf("events for the missing topic: %d published (auto-created), %d parked", created, len(toMissing)-created)
			waitUntil(t, 5*time.Second, "a healthy relay", func() bool { return r.Health(s.ctx, 0) == nil })
		})
	}
}
