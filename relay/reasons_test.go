package relay_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/admin"
	"github.com/fxoutbox/outbox/internal/parklog"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// logRecorder is a slog.Handler that keeps every record.
type logRecorder struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r.Clone())
	return nil
}
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecorder) WithGroup(string) slog.Handler      { return l }

func (l *logRecorder) records() []slog.Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]slog.Record(nil), l.recs...)
}

// attr returns the value of a record's attribute, or the zero Value.
func attr(r slog.Record, key string) slog.Value {
	var v slog.Value
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value
			return false
		}
		return true
	})
	return v
}

// insertMany writes n rows for topic in one statement, keys cycling over
// keys, bypassing the unit of work (as a bulk load or a hand-written INSERT
// could).
func (s *setup) insertMany(t *testing.T, topic string, n, keys int) {
	t.Helper()
	_, err := s.pool.Exec(s.ctx, "INSERT INTO "+sqlname.Ident(s.table)+
		" (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key)"+
		" SELECT gen_random_uuid(), 'a', 'k' || (i % $2), 'a.raw', '{}', $1, 'k' || (i % $2) FROM generate_series(1, $3) i",
		topic, keys, n)
	if err != nil {
		t.Fatal(err)
	}
}

// 2,000 events for a topic that does not exist (the producer's topic
// auto-creation off), written in two waves more than the relay's memory of
// a missing topic apart, so that some are parked on the broker's answer and
// others from the relay's memory of it at varying ages: every one is parked
// with the same last_error, naming the cause and the topic without timings
// or nested copies, ReadStatus shows one group of 2,000, and the log has a
// bounded number of lines whose counts add up to 2,000: the first events of
// the cause one by one, then summaries, the last one when the relay stops.
func TestMassParkingOneReasonBoundedLogs(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	brokers := s.kafka(t)
	missing := testenv.Name("test.missing.")
	cfg := relay.DefaultSaramaConfig()
	cfg.Metadata.AllowAutoTopicCreation = false
	pub, err := relay.NewSaramaPublisher(brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	logs := &logRecorder{}
	r := s.relay(t, pub, relay.Config{Logger: slog.New(logs), PollInterval: 50 * time.Millisecond})
	if err := r.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = r.Stop(s.ctx)
		}
	}()

	const wave, keys = 1000, 50
	parked := func() int {
		n, err := admin.CountParked(s.ctx, s.pool, s.table, admin.Filter{})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	s.insertMany(t, missing, wave/2, keys)
	r.Wake()
	waitUntil(t, 60*time.Second, "the first events parked", func() bool { return parked() == wave/2 })
	time.Sleep(2 * time.Second) // parked from the relay's memory, 2s old
	s.insertMany(t, missing, wave/2, keys)
	r.Wake()
	waitUntil(t, 60*time.Second, "the first wave parked", func() bool { return parked() == wave })
	time.Sleep(6 * time.Second) // past the memory: the broker is asked again
	s.insertMany(t, missing, wave, keys)
	r.Wake()
	waitUntil(t, 60*time.Second, "the second wave parked", func() bool { return parked() == 2*wave })
	if err := r.Stop(s.ctx); err != nil {
		t.Fatal(err)
	}
	stopped = true

	// One reason, the same text for all.
	rows, err := s.pool.Query(s.ctx, "SELECT last_error, count(*) FROM "+sqlname.Ident(s.table)+" WHERE parked_at IS NOT NULL GROUP BY 1")
	if err != nil {
		t.Fatal(err)
	}
	reasons := map[string]int{}
	for rows.Next() {
		var e string
		var n int
		if err := rows.Scan(&e, &n); err != nil {
			t.Fatal(err)
		}
		reasons[e] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("[kafka.unknown_topic_or_partition] topic %q does not exist: create it, then requeue its events", missing)
	if len(reasons) != 1 || reasons[want] != 2*wave {
		t.Errorf("last_error values (%d distinct), want one, %q, for %d events:", len(reasons), want, 2*wave)
		for e, n := range reasons {
			t.Errorf("  %5d  %q", n, e)
		}
	}
	st, err := admin.ReadStatus(s.ctx, s.pool, s.table, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.ParkedGroups) != 1 || st.ParkedGroups[0].Count != 2*wave || st.ParkedGroups[0].Topic != missing ||
		st.ParkedGroups[0].ErrorType != "kafka.unknown_topic_or_partition" || st.ParkedGroups[0].Reason != want {
		t.Errorf("status: %d parked, groups %+v; want one group of %d", st.Parked, st.ParkedGroups, 2*wave)
	}

	// The log: bounded, and every parked event accounted for.
	var one, summaries int
	var summed int64
	recs := logs.records()
	for _, rec := range recs {
		switch {
		case strings.HasPrefix(rec.Message, "outbox relay: event parked"):
			one++
			if got := attr(rec, "reason").String(); got != want {
				t.Errorf("line of a parked event: reason %q, want %q", got, want)
			}
		case strings.HasPrefix(rec.Message, "outbox relay: parked "):
			summaries++
			summed += attr(rec, "events").Int64()
			if !strings.Contains(rec.Message, " for topic "+missing+": "+want+"; see outboxctl parked list --topic "+missing) {
				t.Errorf("summary line %q", rec.Message)
			}
		}
	}
	t.Logf("%d log lines: %d parked events one by one, %d summaries of %d more", len(recs), one, summaries, summed)
	if int64(one)+summed != 2*wave {
		t.Errorf("the log accounts for %d parked events (%d one by one, %d in summaries), want %d", int64(one)+summed, one, summed, 2*wave)
	}
	// The first parklog.First one by one (the cause stays known: its
	// events come less than an interval apart), a summary per interval and
	// the last one at Stop; a few other lines (the start).
	if one != parklog.First || summaries < 1 || summaries > 5 || len(recs) > 40 {
		t.Errorf("%d lines of parked events, %d summaries, %d lines in all; want %d, 1 to 5, at most 40", one, summaries, len(recs), parklog.First)
		for _, rec := range recs[:min(len(recs), 50)] {
			t.Log(rec.Level, rec.Message)
		}
	}
}

// The scenario of a fault fixed and requeued at once: 5,000 good events
// over 100 keys among 20 poison events, 10 over their topic's
// max.message.bytes and 10 for a topic that does not exist (the producer's
// auto-creation off). Once all are parked and the relay has just been told
// again that the topic is missing, the topic is created, the other topic's
// limit raised, and every parked event requeued at once: all 20 are
// delivered within seconds and none is parked again, although the relay
// remembers the topic as missing for a few seconds.
func TestRequeueRightAfterTheFixDelivers(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	brokers := s.kafka(t)
	limit := "300000"
	topic := testenv.Name("test.topic.small.")
	testenv.CreateTopicWithConfig(t, brokers, topic, 6, map[string]*string{"max.message.bytes": &limit})
	missing := testenv.Name("test.missing.")
	cons := testenv.Consume(t, brokers, topic)

	cfg := relay.DefaultSaramaConfig()
	cfg.Metadata.AllowAutoTopicCreation = false
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
	var poison []uuid.UUID
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
		if c%5 == 2 {
			k := fmt.Sprintf("k%d", (c/5)*10)
			poison = append(poison, s.insertRaw(t, topic, k, big), s.insertRaw(t, missing, k, []byte(`{}`)))
		}
		r.Wake()
	}
	waitUntil(t, 60*time.Second, "the poison parked", func() bool { return s.unpublishedUnparked(t) == 0 })
	// The relay hears from the broker again that the topic is missing, just
	// before the fix: it remembers it for a few seconds.
	time.Sleep(5 * time.Second)
	trigger := s.insertRaw(t, missing, "k0", []byte(`{}`))
	r.Wake()
	waitUntil(t, 30*time.Second, "the trigger event parked", func() bool { _, parked, _, _ := s.row(t, trigger); return parked })
	poison = append(poison, trigger)

	// The fix, then the requeue, at once.
	testenv.CreateTopic(t, brokers, missing, 3)
	alterTopic(t, brokers, topic, "max.message.bytes", "1000000")
	fixed := time.Now()
	if n, err := admin.Requeue(s.ctx, s.pool, s.table, admin.Filter{EventIDs: poison}, nil); err != nil || n != len(poison) {
		t.Fatalf("Requeue = %d, %v; want %d", n, err, len(poison))
	}
	r.Wake()
	waitUntil(t, 30*time.Second, "the requeued events published or parked", func() bool { return s.unpublishedUnparked(t) == 0 })
	for _, id := range poison {
		published, parked, attempts, lastErr := s.row(t, id)
		if !published || parked {
			t.Errorf("requeued event %s: published %v, parked again %v after %d attempts: %s", id, published, parked, attempts, lastErr)
		}
	}
	t.Logf("the %d requeued events settled %v after the fix", len(poison), time.Since(fixed).Round(time.Millisecond))
	missingCons := testenv.Consume(t, brokers, missing)
	missingCons.WaitFor(11, 30*time.Second)
	cons.WaitFor(good+10, 30*time.Second)
}

// alterTopic sets one configuration entry of a topic.
func alterTopic(t *testing.T, brokers []string, topic, name, value string) {
	t.Helper()
	ca, err := sarama.NewClusterAdmin(brokers, sarama.NewConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close()
	if err := ca.AlterConfig(sarama.TopicResource, topic, map[string]*string{name: &value}, false); err != nil {
		t.Fatalf("alter %s of topic %s: %v", name, topic, err)
	}
}

// Events that fail permanently but are parked only after MaxAttempts (no
// authorization for their topic, here injected by the publisher): their
// failures before parking are logged like parked events, the first of the
// cause one by one, then counted in summaries, every one accounted for.
func TestMassPermanentFailuresBoundedLogs(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	const topic, n, attempts = "denied.topic", 500, 3
	pub := relay.PublisherFunc(func(_ context.Context, msgs []relay.Message) error {
		failed := map[int]error{}
		for i, m := range msgs {
			failed[i] = outbox.Permanent(fmt.Errorf("topic %s, partition %d: %w", m.Topic, i%6, sarama.ErrTopicAuthorizationFailed))
		}
		return &relay.BatchError{Failed: failed}
	})
	logs := &logRecorder{}
	r := s.relay(t, pub, relay.Config{Logger: slog.New(logs), MaxAttempts: attempts, PollInterval: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	s.insertMany(t, topic, n, 50)
	if err := r.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 60*time.Second, "every event parked", func() bool {
		c, err := admin.CountParked(s.ctx, s.pool, s.table, admin.Filter{})
		return err == nil && c == n
	})
	if err := r.Stop(s.ctx); err != nil {
		t.Fatal(err)
	}
	want := `[kafka.topic_authorization_failed] the broker refused a record for topic "denied.topic": ` + sarama.ErrTopicAuthorizationFailed.Error()
	var lines, failed, parked int64
	recs := logs.records()
	for _, rec := range recs {
		switch {
		case strings.HasPrefix(rec.Message, "outbox relay: event failed permanently"):
			lines++
			failed++
		case strings.Contains(rec.Message, "more permanent failure"):
			lines++
			failed += attr(rec, "failures").Int64()
			if !strings.Contains(rec.Message, want) {
				t.Errorf("summary %q lacks the reason", rec.Message)
			}
		case strings.HasPrefix(rec.Message, "outbox relay: event parked"):
			lines++
			parked++
		case strings.HasPrefix(rec.Message, "outbox relay: parked "):
			lines++
			parked += attr(rec, "events").Int64()
		}
	}
	t.Logf("%d log lines in all, %d of failures and parked events: %d failures, %d parked", len(recs), lines, failed, parked)
	if failed != n*(attempts-1) || parked != n {
		t.Errorf("the log accounts for %d failures and %d parked events, want %d and %d", failed, parked, n*(attempts-1), n)
	}
	if lines > 4*parklog.First || len(recs) > 60 {
		t.Errorf("%d lines of failures and parked events, %d in all; want at most %d, 60", lines, len(recs), 4*parklog.First)
	}
}
