package relay_test

import (
	"encoding/json"

	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// streaming sets the test's table up for the streaming relay, its slot
// created (see testenv.Streaming).
func (s *setup) streaming(t testing.TB) {
	t.Helper()
	testenv.Streaming(t, s.pool, s.table, true)
}

// streamRelay starts a relay with cfg on the setup's table, waits until
// it streams, and stops it when the test ends.
func (s *setup) streamRelay(t *testing.T, pub relay.Publisher, cfg relay.Config) *relay.Relay {
	t.Helper()
	r := s.relay(t, pub, cfg)
	if err := r.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop(s.ctx) })
	waitUntil(t, 60*time.Second, "streaming", func() bool { return r.StreamStatus().State == relay.Streaming })
	return r
}

// streamConfig is a Stream relay's configuration with test-sized intervals.
func streamConfig() relay.Config {
	return relay.Config{
		Mode:         relay.Stream,
		PollInterval: 50 * time.Millisecond,
		Stream:       relay.StreamConfig{StandbyRetry: 50 * time.Millisecond, StatusInterval: 100 * time.Millisecond, SweepInterval: 200 * time.Millisecond},
	}
}

// TestStreamPublishesWaitingThenStreamed starts a streaming relay on a table
// that already holds events (written before the slot existed, so only the
// sweep at the start can publish them): they go first, then the events
// written while it streams, each key in order (under PerKey; Unordered
// claims by row locks), and every row gets its published_at.
func TestStreamPublishesWaitingThenStreamed(t *testing.T) {
	t.Parallel()
	for _, ordering := range []relay.Ordering{relay.PerKey, relay.Unordered} {
		t.Run(ordering.String(), func(t *testing.T) {
			t.Parallel()
			s := newSetup(t)
			topic := testenv.Topic(t, s.kafka(t), 4)
			cons := testenv.Consume(t, s.kafka(t), topic)
			s.write(t, topic, 30, 3) // before the slot exists: not in the stream
			s.streaming(t)

			// No sweep after the first: only the stream can publish what follows.
			cfg := streamConfig()
			cfg.Stream.SweepInterval = time.Hour
			cfg.PollInterval = time.Hour
			cfg.Ordering = ordering
			r := s.streamRelay(t, s.publisher(t), cfg)
			for i := 30; i < 60; i++ {
				err := s.uow.Do(s.ctx, func(ctx context.Context, tx unitofwork.Tx) error {
					return tx.Add(ctx, outbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("k%d", i%3), Type: "order.updated.v1", Topic: topic, Payload: map[string]int{"seq": i}})
				})
				if err != nil {
					t.Fatal(err)
				}
			}
			msgs := cons.WaitFor(60, 30*time.Second)
			if ordering == relay.PerKey {
				checkKeyOrder(t, msgs, 60)
			}
			waitUntil(t, 10*time.Second, "all rows marked", func() bool { return s.unpublished(t) == 0 })
			if st := r.StreamStatus(); st.Confirmed == 0 {
				t.Errorf("stream status %+v: no position confirmed", st)
			}
		})
	}
}

// TestStreamNeedsPoolOrConnConfig: the replication connection needs a
// configuration.
func TestStreamConfigErrors(t *testing.T) {
	_, err := relay.New(dbFunc(nil), relay.PublisherFunc(nil), &relay.Config{Mode: relay.Stream})
	var ce *outbox.ConfigError
	if !errors.As(err, &ce) || ce.Field != "Stream.ConnConfig" {
		t.Errorf("New with a DB that is not a pool: %v, want a ConfigError for Stream.ConnConfig", err)
	}
	_, err = relay.New(dbFunc(nil), relay.PublisherFunc(nil), &relay.Config{Mode: relay.Stream, Stream: relay.StreamConfig{MaxLag: -time.Second}})
	if !errors.As(err, &ce) || !strings.Contains(ce.Field, "MaxLag") {
		t.Errorf("New with a negative MaxLag: %v, want a ConfigError for Stream.MaxLag", err)
	}
}

// dbFunc is a relay.DB that is not a pool.
type dbFunc func(ctx context.Context) (pgx.Tx, error)

func (f dbFunc) Begin(ctx context.Context) (pgx.Tx, error) { return f(ctx) }

// checkKeyOrder checks that msgs hold want distinct events (payload
// {"seq": n}) and that each key's first deliveries come in seq order.
func checkKeyOrder(t *testing.T, msgs []*sarama.ConsumerMessage, want int) (dups int) {
	t.Helper()
	seen := map[string]bool{}
	last := map[string]int{}
	bad := 0
	for _, m := range msgs {
		id := testenv.Header(m, outbox.HeaderEventID)
		if seen[id] {
			dups++
			continue
		}
		seen[id] = true
		var p struct{ Seq int }
		if err := json.Unmarshal(m.Value, &p); err != nil {
			t.Fatal(err)
		}
		k := string(m.Key)
		if l, ok := last[k]; ok && p.Seq < l {
			if bad < 5 {
				t.Errorf("key %s: seq %d delivered after seq %d", k, p.Seq, l)
			}
			bad++
		}
		last[k] = max(last[k], p.Seq)
	}
	if len(seen) != want {
		t.Errorf("consumed %d distinct events, want %d", len(seen), want)
	}
	return dups
}

// TestStreamStartChecksTheSetup: a Stream relay on a table without its
// publication does not start, and its error says what to create.
func TestStreamStartChecksTheSetup(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	r := s.relay(t, relay.PublisherFunc(func(context.Context, []relay.Message) error { return nil }), streamConfig())
	err := r.Start(s.ctx)
	if err == nil {
		_ = r.Stop(s.ctx)
		t.Fatal("a Stream relay started without the table's publication")
	}
	var se *outbox.StreamSetupError
	if !errors.As(err, &se) || se.Check != outbox.StreamCheckPublication || !strings.Contains(err.Error(), "migrations.Stream.Up") {
		t.Errorf("Start: %v, want a StreamSetupError for the publication naming migrations.Stream.Up", err)
	}
}

// TestStreamSplitsALargeTransaction: a transaction that wrote more events
// than a batch may take, published slower than BatchTimeout allows for all
// of them at once, goes out in batches of at most MaxBatchSize, in order.
// No sweep runs after the first: only the stream publishes.
func TestStreamSplitsALargeTransaction(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	s.streaming(t)
	topic := testenv.Topic(t, s.kafka(t), 2)
	cons := testenv.Consume(t, s.kafka(t), topic)
	pub := s.publisher(t)
	slow := relay.PublisherFunc(func(ctx context.Context, msgs []relay.Message) error {
		select { // 50ms a message: 30 events take 1.5s, a batch of 4 200ms
		case <-time.After(time.Duration(len(msgs)) * 50 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
		return pub.Publish(ctx, msgs)
	})
	cfg := streamConfig()
	cfg.Stream.SweepInterval, cfg.PollInterval = time.Hour, time.Hour
	// BatchTimeout leaves a batch of 4 800ms for the broker (Apache Kafka
	// on a loaded machine), and is too short for all 30 at once.
	cfg.BatchSize, cfg.MaxBatchSize, cfg.BatchTimeout = 4, 4, time.Second
	s.streamRelay(t, slow, cfg)
	err := s.uow.Do(s.ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		for i := range 30 {
			if err := tx.Add(ctx, outbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("k%d", i%2), Type: "order.updated.v1", Topic: topic, Payload: map[string]int{"seq": i}}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	checkKeyOrder(t, cons.WaitFor(30, 30*time.Second), 30)
	waitUntil(t, 10*time.Second, "all rows marked", func() bool { return s.unpublished(t) == 0 })
}

// TestStreamDecodesWhateverTheDateStyle: pgoutput sends timestamps in the
// session's DateStyle; a replication connection configured for another
// style still decodes every row (none is parked as unreadable).
func TestStreamDecodesWhateverTheDateStyle(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	s.streaming(t)
	topic := testenv.Topic(t, s.kafka(t), 2)
	cons := testenv.Consume(t, s.kafka(t), topic)
	cc, err := pgconn.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		t.Fatal(err)
	}
	cc.RuntimeParams["DateStyle"] = "SQL, DMY"
	cfg := streamConfig()
	cfg.Stream.ConnConfig = cc
	cfg.Stream.SweepInterval, cfg.PollInterval = time.Hour, time.Hour
	s.streamRelay(t, s.publisher(t), cfg)
	s.write(t, topic, 10, 2)
	cons.WaitFor(10, 30*time.Second)
	var parked int
	if err := s.pool.QueryRow(s.ctx, "SELECT count(*) FROM "+sqlname.Ident(s.table)+" WHERE parked_at IS NOT NULL").Scan(&parked); err != nil {
		t.Fatal(err)
	}
	if parked != 0 {
		t.Errorf("%d rows parked: the stream could not read them", parked)
	}
}

// TestStreamSkipsRowsDeletedBeforeTheReplay: a slot that fell behind replays
// transactions whose rows another relay published and retention deleted
// since. Those rows are skipped at once, not each waited for as if their
// transaction were not visible yet, so the stream catches up and a new
// event goes out.
func TestStreamSkipsRowsDeletedBeforeTheReplay(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	s.streaming(t) // the slot exists: what follows is in its stream
	topic := testenv.Topic(t, s.kafka(t), 2)
	s.write(t, topic, 40, 4)
	// Published by polling meanwhile, then deleted by retention.
	if _, err := s.pool.Exec(s.ctx, `DELETE FROM `+sqlname.Ident(s.table)); err != nil {
		t.Fatal(err)
	}
	// The replayed transactions are older than the wait for visibility.
	time.Sleep(5500 * time.Millisecond)
	cons := testenv.Consume(t, s.kafka(t), topic)
	cfg := streamConfig()
	// Only the stream publishes, 4 rows a batch: 10 batches of deleted rows.
	cfg.Stream.SweepInterval, cfg.PollInterval = time.Hour, time.Hour
	cfg.BatchSize, cfg.MaxBatchSize = 4, 4
	s.streamRelay(t, s.publisher(t), cfg)
	s.write(t, topic, 1, 1)
	// Waiting 5s for each batch of the replay would take 50s.
	msgs := cons.WaitFor(1, 20*time.Second)
	if len(msgs) != 1 {
		t.Errorf("%d messages, want the new event only", len(msgs))
	}
}
