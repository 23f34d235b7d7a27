package relay_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/admin"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
)

// unprintable is a jsonb value PostgreSQL stores in 2 KB but cannot print:
// its text would pass 1 GB, so every statement that reads it fails with
// "out of memory" (SQLSTATE 54000). Reading it costs the server seconds.
const unprintable = `('['||repeat('1e131071,',8199)||'1e131071]')::jsonb`

// unreadableWait bounds the waits of the tests with unreadable rows: each
// read of one costs the server seconds of CPU and 1 GB, so on a loaded
// machine a claim can take most of a BatchTimeout. A hang guard, not a
// measure of speed.
const unreadableWait = 4 * time.Minute

// insertUnreadable writes, by hand, a row whose payload cannot be read.
func (s *setup) insertUnreadable(t *testing.T, topic, key string) uuid.UUID {
	t.Helper()
	id := uuid.Must(uuid.NewV7())
	_, err := s.pool.Exec(s.ctx, "INSERT INTO "+sqlname.Ident(s.table)+
		" (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key) VALUES ($1, 'a', $2, 'a.raw', "+unprintable+", $3, $2)",
		id, key, topic)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func (s *setup) row(t *testing.T, id uuid.UUID) (published, parked bool, attempts int, lastErr string) {
	t.Helper()
	err := s.pool.QueryRow(s.ctx, "SELECT published_at IS NOT NULL, parked_at IS NOT NULL, attempts, coalesce(last_error, '') FROM "+
		sqlname.Ident(s.table)+" WHERE event_id = $1", id).Scan(&published, &parked, &attempts, &lastErr)
	if err != nil {
		t.Fatal(err)
	}
	return
}

// A row written by hand whose payload PostgreSQL cannot print fails every
// statement that reads it. Among events of other keys, under both orderings:
// the others are published, the row is parked with what PostgreSQL said,
// and its own key's later event is published after it was parked.
func TestUnreadableRowIsParkedAndOthersFlow(t *testing.T) {
	t.Parallel()
	// One at a time: each failed read makes the server build 1 GB.
	for _, ordering := range []relay.Ordering{relay.PerKey, relay.Unordered} {
		t.Run(ordering.String(), func(t *testing.T) {
			s := newSetup(t)
			brokers := s.kafka(t)
			topic := testenv.Topic(t, brokers, 4)
			cons := testenv.Consume(t, brokers, topic)
			s.write(t, topic, 20, 5)
			bad := s.insertUnreadable(t, topic, "kbad")
			after := s.insertRaw(t, topic, "kbad", []byte(`{"after":true}`))
			s.write(t, topic, 20, 5)

			r := s.relay(t, s.publisher(t), relay.Config{Ordering: ordering, PollInterval: 50 * time.Millisecond})
			start := time.Now()
			if err := r.Start(s.ctx); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = r.Stop(s.ctx) }()
			msgs := cons.WaitFor(41, unreadableWait)
			t.Logf("%d good events published %v after the start", len(msgs), time.Since(start).Round(time.Millisecond))
			// 41 records can include a repeat (at-least-once) before the
			// row is parked and its key's later event sent: wait for both.
			waitUntil(t, unreadableWait, "the unreadable row parked and its key's later event published", func() bool {
				_, parked, _, _ := s.row(t, bad)
				p, _, _, _ := s.row(t, after)
				return parked && p
			})
			msgs = cons.Messages()
			published, parked, attempts, lastErr := s.row(t, bad)
			if published || !parked || attempts != 1 || !strings.Contains(lastErr, "SQLSTATE 54000") {
				t.Errorf("unreadable row: published %v parked %v attempts %d last_error %q; want parked once, naming SQLSTATE 54000",
					published, parked, attempts, lastErr)
			}
			for _, m := range msgs {
				if testenv.Header(m, outbox.HeaderEventID) == bad.String() {
					t.Error("the unreadable row reached Kafka")
				}
			}
			if p, _, _, _ := s.row(t, after); !p {
				t.Error("the unreadable row's key: its later event was not published")
			}
			waitUntil(t, 10*time.Second, "a healthy relay", func() bool { return r.Health(s.ctx, 0) == nil })
		})
	}
}

// Under Hold an unreadable row is charged with the reason but not parked:
// its key waits, the other keys flow, and the row is re-read only when its
// paced retry is due.
func TestUnreadableRowIsHeld(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	brokers := s.kafka(t)
	topic := testenv.Topic(t, brokers, 4)
	cons := testenv.Consume(t, brokers, topic)
	s.write(t, topic, 10, 5)
	bad := s.insertUnreadable(t, topic, "kbad")
	after := s.insertRaw(t, topic, "kbad", []byte(`{"after":true}`))
	s.write(t, topic, 10, 5)
	r := s.relay(t, s.publisher(t), relay.Config{Poison: outbox.Hold, PollInterval: time.Second})
	if err := r.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Stop(s.ctx) }()
	cons.WaitFor(20, 60*time.Second)
	waitUntil(t, 30*time.Second, "the unreadable row to be charged", func() bool {
		_, _, attempts, _ := s.row(t, bad)
		return attempts > 0
	})
	published, parked, _, lastErr := s.row(t, bad)
	if published || parked || !strings.Contains(lastErr, "SQLSTATE 54000") {
		t.Errorf("held unreadable row: published %v parked %v last_error %q", published, parked, lastErr)
	}
	if p, _, _, _ := s.row(t, after); p {
		t.Error("the held row's key: its later event was published past it")
	}
	if err := r.Health(s.ctx, 0); err != nil {
		t.Errorf("Health with a held row = %v, want healthy", err)
	}
}

// Stored headers that are not a JSON object of strings are never sent
// changed: the row is parked with the reason. JSON null and SQL NULL mean
// no headers.
func TestMalformedStoredHeadersPark(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	var got []relay.Message
	r := s.relay(t, relay.PublisherFunc(func(_ context.Context, msgs []relay.Message) error {
		got = append(got, msgs...)
		return nil
	}), relay.Config{})
	malformed := map[uuid.UUID]string{}
	for _, h := range []string{`[1,2,3]`, `{"tenant":5}`, `"x"`, `{"tenant":"acme","n":null}`} {
		malformed[s.insertWithHeaders(t, h)] = h
	}
	null := s.insertWithHeaders(t, `null`)
	sqlNull := s.insertRaw(t, "h.topic", "knull", []byte(`{}`))
	for i := 0; s.unpublishedUnparked(t) > 0; i++ {
		if i > 10 {
			t.Fatal("relay made no progress")
		}
		if _, err := r.RunOnce(s.ctx); err != nil {
			t.Fatalf("RunOnce: %v", err)
		}
	}
	parked, err := admin.ListParked(s.ctx, s.pool, s.table, admin.Filter{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(parked) != len(malformed) {
		t.Errorf("%d parked, want the %d with malformed headers: %+v", len(parked), len(malformed), parked)
	}
	for _, p := range parked {
		h, ok := malformed[p.EventID]
		if !ok || !strings.Contains(p.LastError, "not a JSON object of strings") {
			t.Errorf("parked %s (headers %s) with %q", p.EventID, h, p.LastError)
		}
	}
	sent := map[uuid.UUID]bool{}
	for _, m := range got {
		sent[m.EventID] = true
		if _, bad := malformed[m.EventID]; bad {
			t.Errorf("event with headers %s was sent: %s", malformed[m.EventID], headerList(m))
		}
		for _, h := range m.Headers {
			if h.Key != outbox.HeaderEventID && h.Key != outbox.HeaderEventType && h.Key != "traceparent" && h.Key != "tracestate" {
				t.Errorf("event %s sent with header %s", m.EventID, h.Key)
			}
		}
	}
	if !sent[null] || !sent[sqlNull] {
		t.Errorf("events with null / NULL headers sent: %v, %v; want both", sent[null], sent[sqlNull])
	}
}

// After a poison event is parked, with no traffic, the relay is healthy:
// parking is the relay doing its job, not a failure.
func TestHealthyAfterPoisonParked(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	s.write(t, "hp.topic", 1, 1)
	pub := relay.PublisherFunc(func(_ context.Context, msgs []relay.Message) error {
		failed := map[int]error{}
		for i := range msgs {
			failed[i] = outbox.Permanent(errors.New("kafka server: Message was too large"))
		}
		return &relay.BatchError{Failed: failed}
	})
	r := s.relay(t, pub, relay.Config{PollInterval: 20 * time.Millisecond, MaxAttempts: 3, MaxBackoff: 10 * time.Second})
	if err := r.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Stop(s.ctx) }()
	waitUntil(t, 30*time.Second, "the poison event to be parked", func() bool { return s.unpublishedUnparked(t) == 0 })
	waitUntil(t, 5*time.Second, "a healthy relay", func() bool { return r.Health(s.ctx, 0) == nil })
}

// A relay whose batches failed for want of the broker is healthy again as
// soon as a check sees the database and the broker answer, also when the
// events it failed on are gone (no traffic) and its worker sleeps in a long
// backoff.
func TestHealthRecoversWithoutTraffic(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	var down atomic.Bool
	down.Store(true)
	pub := relay.PublisherFunc(func(context.Context, []relay.Message) error {
		if down.Load() {
			return errors.New("kafka: client has run out of available brokers to talk to")
		}
		return nil
	})
	r := s.relay(t, pub, relay.Config{PollInterval: 20 * time.Second, MaxBackoff: 30 * time.Second})
	s.write(t, "hr.topic", 1, 1)
	if err := r.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Stop(s.ctx) }()
	waitUntil(t, 10*time.Second, "a failed batch", func() bool { return r.Health(s.ctx, 0) != nil })
	var he *relay.HealthError
	if err := r.Health(s.ctx, 0); !errors.As(err, &he) || he.Check != "broker" {
		t.Errorf("Health with the broker down = %v, want a broker failure", err)
	}
	// The event is gone (another relay, an operator) and the broker is back.
	if _, err := s.pool.Exec(s.ctx, "DELETE FROM "+sqlname.Ident(s.table)); err != nil {
		t.Fatal(err)
	}
	down.Store(false)
	waitUntil(t, 5*time.Second, "a healthy relay", func() bool { return r.Health(s.ctx, 0) == nil })
}

// A batch that fails in the database is reported as a database failure,
// not the broker's, also while the database answers Health's own query.
func TestHealthNamesTheDatabase(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	s.write(t, "hd.topic", 2, 2)
	// Marks fail: a database error that a read does not see.
	fn := s.table.Schema + ".refuse_mark"
	if _, err := s.pool.Exec(s.ctx, fmt.Sprintf(`CREATE FUNCTION %s() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'marks refused by the test'; END $$;
		CREATE TRIGGER refuse_mark BEFORE UPDATE ON %s FOR EACH ROW EXECUTE FUNCTION %s()`, fn, sqlname.Ident(s.table), fn)); err != nil {
		t.Fatal(err)
	}
	r := s.relay(t, relay.PublisherFunc(func(context.Context, []relay.Message) error { return nil }),
		relay.Config{PollInterval: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond})
	if err := r.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Stop(s.ctx) }()
	waitUntil(t, 10*time.Second, "a failed batch", func() bool { return r.Health(s.ctx, 0) != nil })
	var he *relay.HealthError
	if err := r.Health(s.ctx, 0); !errors.As(err, &he) || he.Check != "database" {
		t.Errorf("Health while marks fail = %v, want a database failure", err)
	}
	if _, err := s.pool.Exec(s.ctx, "DROP TRIGGER refuse_mark ON "+sqlname.Ident(s.table)); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "the events to be published", func() bool { return s.unpublished(t) == 0 })
	waitUntil(t, 5*time.Second, "a healthy relay", func() bool { return r.Health(s.ctx, 0) == nil })
}
