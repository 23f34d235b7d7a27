package relay_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/admin"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
)

// insertRaw writes a row the way a buggy writer or a hand-written INSERT
// could, bypassing the unit of work's checks.
func (s *setup) insertRaw(t *testing.T, topic, key string, payload []byte) uuid.UUID {
	t.Helper()
	id := uuid.Must(uuid.NewV7())
	_, err := s.pool.Exec(s.ctx, "INSERT INTO "+sqlname.Ident(s.table)+
		" (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key) VALUES ($1, 'a', $2, 'a.raw', $3, $4, $2)",
		id, key, payload, topic)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// A 2 MiB event and an event for an invalid topic among good ones, on the
// broker: the good ones flow, the bad ones are parked with their reasons at
// once, and their keys' later events are published without them.
func TestPoisonEventsAreParkedAndGoodOnesFlow(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	brokers := s.kafka(t)
	topic := testenv.Topic(t, brokers, 6)
	cons := testenv.Consume(t, brokers, topic)
	s.write(t, topic, 500, 20)
	big := s.insertRaw(t, topic, "k3", []byte(`{"blob":"`+strings.Repeat("x", 2<<20)+`"}`))
	invalid := s.insertRaw(t, "not a topic!", "k4", []byte(`{}`))
	s.write(t, topic, 500, 20) // later events of the same keys

	r := s.relay(t, s.publisher(t), relay.Config{BatchSize: 100})
	for i := 0; s.unpublishedUnparked(t) > 0; i++ {
		if i > 50 {
			t.Fatal("relay made no progress")
		}
		if _, err := r.RunOnce(s.ctx); err != nil {
			t.Fatalf("RunOnce: %v (a poison event must not fail the batch)", err)
		}
	}
	cons.WaitFor(1000, 30*time.Second)
	parked, err := admin.ListParked(s.ctx, s.pool, s.table, admin.Filter{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(parked) != 2 || parked[0].EventID != big || parked[1].EventID != invalid {
		t.Fatalf("parked = %+v, want the big and the invalid-topic events", parked)
	}
	if !strings.Contains(parked[0].LastError, "MaxMessageBytes") || !strings.Contains(parked[1].LastError, "not a valid Kafka topic") {
		t.Errorf("parked reasons: %q, %q", parked[0].LastError, parked[1].LastError)
	}
	// Requeued, they come back and, still bad, are parked again.
	if n, err := admin.Requeue(s.ctx, s.pool, s.table, admin.Filter{EventIDs: []uuid.UUID{big, invalid}}, nil); err != nil || n != 2 {
		t.Fatalf("Requeue = %d, %v", n, err)
	}
	if u := s.unpublishedUnparked(t); u != 2 {
		t.Fatalf("%d claimable after requeue, want 2", u)
	}
	if _, err := r.RunOnce(s.ctx); err != nil {
		t.Fatal(err)
	}
	if p, _ := admin.ListParked(s.ctx, s.pool, s.table, admin.Filter{Limit: 10}); len(p) != 2 || p[0].Attempts != 1 {
		t.Fatalf("after requeue and a run: parked %+v", p)
	}
}

func (s *setup) unpublishedUnparked(t *testing.T) int {
	t.Helper()
	var n int
	if err := s.pool.QueryRow(s.ctx, "SELECT count(*) FROM "+sqlname.Ident(s.table)+" WHERE published_at IS NULL AND parked_at IS NULL").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Permanent errors from the publisher count against the event: parked after
// MaxAttempts under Park, retried and blocking only its key under Hold.
// Transient errors are never counted.
func TestPermanentFailuresCountThenPark(t *testing.T) {
	t.Parallel()
	for _, policy := range []outbox.PoisonPolicy{outbox.Park, outbox.Hold} {
		s := newSetup(t)
		s.write(t, "p.topic", 6, 2) // keys k0,k1,k0,k1,k0,k1; the first k0 is poison
		var poison atomic.Value
		var transient atomic.Bool
		var got []string
		pub := relay.PublisherFunc(func(_ context.Context, msgs []relay.Message) error {
			if transient.Load() {
				return errors.New("kafka: client has run out of available brokers to talk to")
			}
			// Like a broker, reject the poison event's whole partition batch:
			// here, every later message of its key.
			failed := map[int]error{}
			rejected := ""
			for i, m := range msgs {
				if poison.Load() == nil {
					poison.Store(m.EventID)
				}
				if m.EventID == poison.Load() || string(m.Key) == rejected {
					rejected = string(m.Key)
					failed[i] = outbox.Permanent(errors.New("kafka server: Message was too large"))
					continue
				}
				var p struct{ Seq int }
				_ = json.Unmarshal(m.Value, &p)
				got = append(got, string(m.Key))
			}
			if len(failed) > 0 {
				return &relay.BatchError{Failed: failed}
			}
			return nil
		})
		// Retries of a failed event are paced from PollInterval up to
		// MaxBackoff: keep both short and let each retry come due.
		r := s.relay(t, pub, relay.Config{MaxAttempts: 3, Poison: policy, PollInterval: time.Millisecond, MaxBackoff: 5 * time.Millisecond})
		transient.Store(true)
		for range 3 {
			if _, err := r.RunOnce(s.ctx); err == nil {
				t.Fatal("transient failure not reported")
			}
		}
		var attempts int
		_ = s.pool.QueryRow(s.ctx, "SELECT max(attempts) FROM "+sqlname.Ident(s.table)).Scan(&attempts)
		if attempts != 0 {
			t.Fatalf("%v: transient failures counted: attempts %d", policy, attempts)
		}
		transient.Store(false)
		for range 4 {
			time.Sleep(20 * time.Millisecond)
			if _, err := r.RunOnce(s.ctx); err != nil {
				t.Fatalf("%v: RunOnce: %v (a charged event is not a failure of the batch)", policy, err)
			}
		}
		var att int
		var parked bool
		var lastErr string
		_ = s.pool.QueryRow(s.ctx, "SELECT attempts, parked_at IS NOT NULL, last_error FROM "+sqlname.Ident(s.table)+" WHERE event_id = $1", poison.Load()).Scan(&att, &parked, &lastErr)
		k0published := 0
		for _, k := range got {
			if k == "k0" {
				k0published++
			}
		}
		switch policy {
		case outbox.Park:
			if att != 3 || !parked || !strings.Contains(lastErr, "too large") {
				t.Errorf("park: attempts %d parked %v last_error %q; want 3, parked", att, parked, lastErr)
			}
			if k0published != 2 {
				t.Errorf("park: %d later k0 events published, want 2 (after parking)", k0published)
			}
		case outbox.Hold:
			if att != 4 || parked {
				t.Errorf("hold: attempts %d parked %v; want 4, not parked", att, parked)
			}
			if k0published != 0 {
				t.Errorf("hold: %d later k0 events published past the held one, want 0", k0published)
			}
		}
		if k1 := len(got) - k0published; k1 < 3 {
			t.Errorf("%v: other key published %d events, want its 3 (not blocked)", policy, k1)
		}
	}
}

// An event whose topic does not exist is parked on its first failure, and
// the topic's next events for a few seconds are parked without being sent
// (each send would wait for the missing topic's metadata); a requeued event
// goes once the topic exists, also requeued right after it was created.
func TestMissingTopicParksAtOnce(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	var created atomic.Bool
	var sentToMissing atomic.Int32
	pub := relay.PublisherFunc(func(_ context.Context, msgs []relay.Message) error {
		failed := map[int]error{}
		for i, m := range msgs {
			if m.Topic == "late.topic" && !created.Load() {
				sentToMissing.Add(1)
				failed[i] = outbox.Permanent(fmt.Errorf("%s: %w", m.Topic, sarama.ErrUnknownTopicOrPartition))
			}
		}
		if len(failed) > 0 {
			return &relay.BatchError{Failed: failed}
		}
		return nil
	})
	r := s.relay(t, pub, relay.Config{})
	first := s.insertRaw(t, "late.topic", "k1", []byte(`{}`))
	if _, err := r.RunOnce(s.ctx); err != nil {
		t.Fatal(err)
	}
	second := s.insertRaw(t, "late.topic", "k2", []byte(`{}`))
	if _, err := r.RunOnce(s.ctx); err != nil {
		t.Fatal(err)
	}
	for _, id := range []uuid.UUID{first, second} {
		if _, parked, attempts, lastErr := s.row(t, id); !parked || attempts != 1 || !strings.Contains(lastErr, "does not exist") {
			t.Errorf("event for the missing topic: parked %v after %d attempts, last_error %q; want parked at once", parked, attempts, lastErr)
		}
	}
	if n := sentToMissing.Load(); n != 1 {
		t.Errorf("%d sends to the missing topic, want 1 (the second event parked without a send)", n)
	}
	created.Store(true)
	// Requeued at once, inside the relay's memory of the missing topic: a
	// requeued event is sent all the same.
	if _, err := admin.Requeue(s.ctx, s.pool, s.table, admin.Filter{EventIDs: []uuid.UUID{first, second}}, nil); err != nil {
		t.Fatal(err)
	}
	if n, err := r.RunOnce(s.ctx); err != nil || n != 2 {
		t.Fatalf("RunOnce after the topic was created = %d, %v; want 2 published", n, err)
	}
}
