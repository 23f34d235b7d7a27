package relay_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// keyWriters commit events continuously over many keys until halted. Each
// writer owns its share of the keys, so a key's events commit in sequence
// order (payload {"seq": n}, n = 0, 1, 2, ... per key).
type keyWriters struct {
	stop    chan struct{}
	wg      sync.WaitGroup
	once    sync.Once
	written atomic.Int64
	errMu   sync.Mutex
	err     error
}

func (s *setup) startKeyWriters(t *testing.T, topic string, writers, keysEach int) *keyWriters {
	t.Helper()
	ws := &keyWriters{stop: make(chan struct{})}
	for w := range writers {
		ws.wg.Add(1)
		go func() {
			defer ws.wg.Done()
			rnd := rand.New(rand.NewPCG(uint64(w), 11))
			next := make([]int, keysEach)
			for {
				select {
				case <-ws.stop:
					return
				default:
				}
				k := rnd.IntN(keysEach)
				n := 1 + rnd.IntN(3)
				key := fmt.Sprintf("key-%d", w*keysEach+k)
				err := s.uow.Do(s.ctx, func(ctx context.Context, tx unitofwork.Tx) error {
					for i := range n {
						if err := tx.Add(ctx, outbox.Event{AggregateType: "acct", AggregateID: key, Type: "acct.changed.v1", Topic: topic,
							Payload: map[string]int{"seq": next[k] + i}}); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					ws.errMu.Lock()
					ws.err = errors.Join(ws.err, err)
					ws.errMu.Unlock()
					return
				}
				next[k] += n
				ws.written.Add(int64(n))
				time.Sleep(time.Millisecond) // a steady stream, not a flood
			}
		}()
	}
	t.Cleanup(func() { _, _ = ws.halt() })
	return ws
}

// halt stops the writers and returns how many events they committed.
func (ws *keyWriters) halt() (int, error) {
	ws.once.Do(func() { close(ws.stop) })
	ws.wg.Wait()
	ws.errMu.Lock()
	defer ws.errMu.Unlock()
	return int(ws.written.Load()), ws.err
}

// countingPublisher counts the events a relay's publisher acknowledged.
func countingPublisher(pub relay.Publisher, n *atomic.Int64) relay.Publisher {
	return relay.PublisherFunc(func(ctx context.Context, msgs []relay.Message) error {
		err := pub.Publish(ctx, msgs)
		var be *relay.BatchError
		switch {
		case err == nil:
			n.Add(int64(len(msgs)))
		case errors.As(err, &be):
			n.Add(int64(len(msgs) - len(be.Failed)))
		}
		return err
	})
}

// started is a running relay with its own producer and a count of what it
// published.
type started struct {
	r         *relay.Relay
	pub       *relay.SaramaPublisher
	published atomic.Int64
	once      sync.Once
}

func (s *setup) startRelay(t *testing.T, cfg relay.Config) *started {
	t.Helper()
	pub, err := relay.NewSaramaPublisher(s.kafka(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	x := &started{pub: pub}
	x.r = s.relay(t, countingPublisher(pub, &x.published), cfg)
	if err := x.r.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { x.stop(t) })
	return x
}

// stop stops the relay gracefully (its batch in flight finishes) and
// closes its producer.
func (x *started) stop(t *testing.T) {
	t.Helper()
	x.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := x.r.Stop(ctx); err != nil {
			t.Errorf("stop relay: %v", err)
		}
		_ = x.pub.Close()
	})
}

// kill stops the relay without grace (its batch in flight abandoned
// wherever it is) and closes its producer, as a crashed pod would.
func (x *started) kill() {
	x.once.Do(func() {
		dead, cancel := context.WithCancel(context.Background())
		cancel()
		_ = x.r.Stop(dead)
		_ = x.pub.Close()
	})
}

func pollConfig() relay.Config {
	return relay.Config{BatchSize: 50, MaxBatchSize: 200, PollInterval: 20 * time.Millisecond}
}

// TestStreamModeSwitchUnderLoad switches a table between polling and
// streaming relays while writers commit continuously over 120 keys, in both
// directions, with a mixed period (1.5 s) in which the old relays and the
// new one run at once and both publish. Nothing is lost, each key's first
// deliveries come in commit order, and there is no duplicate at all: every
// relay stops gracefully (its in-flight batch is marked and committed), and
// in the mixed period a polling relay and the streaming relay serialize on
// the key's lane (try-locks on both sides) and each skips rows the other
// marked, so a duplicate can only mean that two relays published the same
// row.
func TestStreamModeSwitchUnderLoad(t *testing.T) {
	t.Parallel()
	for _, dir := range []string{"poll-to-stream", "stream-to-poll"} {
		t.Run(dir, func(t *testing.T) {
			s := newSetup(t)
			s.streaming(t)
			brokers := s.kafka(t)
			topic := testenv.Topic(t, brokers, 6)
			cons := testenv.Consume(t, brokers, topic)
			ws := s.startKeyWriters(t, topic, 4, 30)

			var old, news []*started
			if dir == "poll-to-stream" {
				old = []*started{s.startRelay(t, pollConfig()), s.startRelay(t, pollConfig())}
			} else {
				old = []*started{s.startRelay(t, streamConfig())}
				waitUntil(t, 60*time.Second, "the streaming relay to stream", func() bool { return old[0].r.StreamStatus().State == relay.Streaming })
			}
			waitUntil(t, 20*time.Second, "300 events published by the old relays", func() bool { return sum(old) >= 300 })

			// The mixed period: the new relay starts while the old ones run.
			oldBefore := sum(old)
			if dir == "poll-to-stream" {
				news = []*started{s.startRelay(t, streamConfig())}
				waitUntil(t, 60*time.Second, "the streaming relay to stream", func() bool { return news[0].r.StreamStatus().State == relay.Streaming })
			} else {
				news = []*started{s.startRelay(t, pollConfig()), s.startRelay(t, pollConfig())}
			}
			time.Sleep(1500 * time.Millisecond)
			if sum(old) == oldBefore {
				t.Errorf("%s: the old relays published nothing in the mixed period", dir)
			}
			if sum(news) == 0 {
				t.Errorf("%s: the new relays published nothing in the mixed period", dir)
			}
			for _, x := range old {
				x.stop(t)
			}
			newBefore := sum(news)
			time.Sleep(time.Second)
			total, err := ws.halt()
			if err != nil {
				t.Fatalf("writers: %v", err)
			}
			waitUntil(t, 60*time.Second, "every event published", func() bool { return s.unpublished(t) == 0 })
			if sum(news) == newBefore {
				t.Errorf("%s: the new relay published nothing after the old ones stopped", dir)
			}
			cons.WaitFor(total, 30*time.Second)
			time.Sleep(300 * time.Millisecond) // let any duplicate arrive
			dups := checkKeyOrder(t, cons.Messages(), total)
			if dups > 0 {
				t.Errorf("%s: %d duplicates, want none (graceful stops, lanes shared by both modes)", dir, dups)
			}
			if n := s.count(t, "attempts > 0 OR parked_at IS NOT NULL"); n != 0 {
				t.Errorf("%s: %d rows charged or parked", dir, n)
			}
			t.Logf("%s: %d events, %d duplicates", dir, total, dups)
		})
	}
}

func sum(xs []*started) int64 {
	var n int64
	for _, x := range xs {
		n += x.published.Load()
	}
	return n
}

func (s *setup) count(t *testing.T, where string) int {
	t.Helper()
	var n int
	if err := s.pool.QueryRow(s.ctx, "SELECT count(*) FROM "+sqlname.Ident(s.table)+" WHERE "+where).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// insertPoison writes a row by hand with the given topic, key, payload and
// headers (raw JSON, nil for NULL), bypassing the writer's checks.
func (s *setup) insertPoison(t *testing.T, topic, key string, payload, headers []byte) uuid.UUID {
	t.Helper()
	id := uuid.Must(uuid.NewV7())
	_, err := s.pool.Exec(s.ctx, "INSERT INTO "+sqlname.Ident(s.table)+
		" (event_id, aggregate_type, aggregate_id, event_type, payload, headers, topic, partition_key) VALUES ($1, 'a', $2, 'a.raw', $3, $4, $5, $2)",
		id, key, payload, headers, topic)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestStreamPoisonKeepsTheStreamGoing inserts, while a relay streams, rows
// written by hand that can never be sent (headers that are not a JSON
// object of strings, a payload over MaxMessageBytes, a topic name Kafka
// refuses) for keys k0, k1, k2, after five events of each of k0..k5, and
// then five more events of k3..k5 (the stream goes on past the poison).
// Once the poison rows are handled, five more events of every key follow.
// No sweep runs after the first (SweepInterval and PollInterval an hour):
// only the stream publishes. Under Park the poison rows are parked at once
// with their reasons, and every good event is published, the poison keys'
// later events too, each key in order. Under Hold nothing is parked: the
// poison rows are charged and wait, their keys' later events wait behind
// them, and every other key flows.
func TestStreamPoisonKeepsTheStreamGoing(t *testing.T) {
	t.Parallel()
	for _, policy := range []outbox.PoisonPolicy{outbox.Park, outbox.Hold} {
		t.Run(map[outbox.PoisonPolicy]string{outbox.Park: "park", outbox.Hold: "hold"}[policy], func(t *testing.T) {
			s := newSetup(t)
			s.streaming(t)
			brokers := s.kafka(t)
			topic := testenv.Topic(t, brokers, 4)
			cons := testenv.Consume(t, brokers, topic)
			cfg := streamConfig()
			cfg.Stream.SweepInterval, cfg.PollInterval = time.Hour, time.Hour
			cfg.MaxMessageBytes, cfg.Poison = 16<<10, policy
			x := s.startRelay(t, cfg)
			waitUntil(t, 60*time.Second, "streaming", func() bool { return x.r.StreamStatus().State == relay.Streaming })

			seq := map[string]int{}
			good := func(rounds int, keys ...string) {
				for range rounds {
					for _, k := range keys {
						err := s.uow.Do(s.ctx, func(ctx context.Context, tx unitofwork.Tx) error {
							return tx.Add(ctx, outbox.Event{AggregateType: "acct", AggregateID: k, Type: "acct.changed.v1", Topic: topic, Payload: map[string]int{"seq": seq[k]}})
						})
						if err != nil {
							t.Fatal(err)
						}
						seq[k]++
					}
				}
			}
			all := []string{"k0", "k1", "k2", "k3", "k4", "k5"}
			good(5, all...)
			poison := []uuid.UUID{
				s.insertPoison(t, topic, "k0", []byte(`{}`), []byte(`{"tenant": 7}`)),
				s.insertPoison(t, topic, "k1", []byte(`{"blob":"`+strings.Repeat("x", 32<<10)+`"}`), nil),
				s.insertPoison(t, "not a topic!", "k2", []byte(`{}`), nil),
			}
			good(5, "k3", "k4", "k5")
			cons.WaitFor(45, 30*time.Second)
			reasons := []string{"not a JSON object of strings", "MaxMessageBytes", "not a valid Kafka topic"}
			poisonRow := func(i int) (parked bool, attempts int, lastErr string) {
				var le *string
				if err := s.pool.QueryRow(s.ctx, "SELECT parked_at IS NOT NULL, attempts, last_error FROM "+sqlname.Ident(s.table)+" WHERE event_id = $1", poison[i]).Scan(&parked, &attempts, &le); err != nil {
					t.Fatal(err)
				}
				if le != nil {
					lastErr = *le
				}
				return parked, attempts, lastErr
			}
			waitUntil(t, 10*time.Second, "the poison rows handled", func() bool {
				for i := range poison {
					if _, attempts, _ := poisonRow(i); attempts == 0 {
						return false
					}
				}
				return true
			})
			good(5, all...)
			want := 75
			if policy == outbox.Hold {
				want = 60 // k0..k2's last 5 wait behind their poison row
			}
			cons.WaitFor(want, 30*time.Second)
			time.Sleep(time.Second) // anything more (what must wait) would arrive now
			msgs := cons.Messages()
			checkKeyOrder(t, msgs, want)
			if st := x.r.StreamStatus().State; st != relay.Streaming {
				t.Errorf("stream state %v after the poison rows, want streaming", st)
			}
			for i := range poison {
				parked, attempts, le := poisonRow(i)
				switch {
				case policy == outbox.Park && (!parked || !strings.Contains(le, reasons[i])):
					t.Errorf("park: poison row %d: parked %v, last_error %q; want parked with %q", i, parked, le, reasons[i])
				case policy == outbox.Hold && (parked || attempts < 1 || !strings.Contains(le, reasons[i])):
					t.Errorf("hold: poison row %d: parked %v, attempts %d, last_error %q; want held (charged, not parked) with %q", i, parked, attempts, le, reasons[i])
				}
			}
			if policy == outbox.Hold {
				for _, m := range msgs {
					if k := string(m.Key); k == "k0" || k == "k1" || k == "k2" {
						var p struct{ Seq int }
						_ = json.Unmarshal(m.Value, &p)
						if p.Seq >= 5 {
							t.Errorf("hold: %s seq %d published past its held poison row", k, p.Seq)
						}
					}
				}
				if n := s.unpublishedUnparked(t); n != 18 {
					t.Errorf("hold: %d rows wait, want 18 (3 poison rows and the 15 behind them)", n)
				}
			} else if n := s.unpublishedUnparked(t); n != 0 {
				t.Errorf("park: %d rows still wait", n)
			}
		})
	}
}

// TestStreamStandbyTakesOver runs a streaming relay and a standby while
// writers commit, stops the streaming one gracefully, then kills the one
// that took over (Stop with a cancelled context, producer closed) with a
// fresh standby waiting. Each time the standby streams within 10 s
// (StandbyRetry is 50ms: it takes well under a second on a quiet machine;
// the bound is generous, it checks that the standby takes over, not how
// fast). Nothing is lost, each key in order, and the only duplicates are
// the killed relay's abandoned batch (MaxBatchSize 200): the graceful stop
// repeats nothing.
func TestStreamStandbyTakesOver(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	s.streaming(t)
	brokers := s.kafka(t)
	topic := testenv.Topic(t, brokers, 6)
	cons := testenv.Consume(t, brokers, topic)
	ws := s.startKeyWriters(t, topic, 4, 25)
	cfg := streamConfig()
	cfg.BatchSize, cfg.MaxBatchSize = 50, 200

	a := s.startRelay(t, cfg)
	waitUntil(t, 60*time.Second, "relay A to stream", func() bool { return a.r.StreamStatus().State == relay.Streaming })
	b := s.startRelay(t, cfg)
	waitUntil(t, 20*time.Second, "relay B to stand by", func() bool { return b.r.StreamStatus().State == relay.StreamStandby })
	waitUntil(t, 20*time.Second, "A to publish 200 events", func() bool { return a.published.Load() >= 200 })
	if b.published.Load() != 0 {
		t.Errorf("the standby published %d events while A streamed", b.published.Load())
	}

	takeover := func(what string, stop func(), standby *started) {
		t.Helper()
		stop()
		took := testenv.Eventually(t, 10*time.Second, func() (bool, string) {
			st := standby.r.StreamStatus().State
			return st == relay.Streaming, fmt.Sprintf("%s: the standby is %v, want streaming", what, st)
		})
		before := standby.published.Load()
		waitUntil(t, 10*time.Second, "the new streamer to publish", func() bool { return standby.published.Load() > before+50 })
		t.Logf("%s: the standby streamed %v after the stop", what, took.Round(time.Millisecond))
	}
	takeover("graceful stop", func() { a.stop(t) }, b)
	c := s.startRelay(t, cfg)
	waitUntil(t, 20*time.Second, "relay C to stand by", func() bool { return c.r.StreamStatus().State == relay.StreamStandby })
	takeover("kill", b.kill, c)

	time.Sleep(500 * time.Millisecond)
	total, err := ws.halt()
	if err != nil {
		t.Fatalf("writers: %v", err)
	}
	waitUntil(t, 60*time.Second, "every event published", func() bool { return s.unpublished(t) == 0 })
	cons.WaitFor(total, 30*time.Second)
	time.Sleep(300 * time.Millisecond)
	dups := checkKeyOrder(t, cons.Messages(), total)
	if dups > cfg.MaxBatchSize {
		t.Errorf("%d duplicates, want at most %d (the killed relay's one abandoned batch)", dups, cfg.MaxBatchSize)
	}
	t.Logf("%d events, %d duplicates", total, dups)
}

// TestStreamHealthLag blocks the publisher of a streaming relay with tiny
// lag bounds: Health fails with the check "stream" (bytes of WAL behind
// with MaxLagBytes, the oldest transaction's age with MaxLag) while events
// wait, and is healthy again once the publisher is released and the relay
// caught up.
func TestStreamHealthLag(t *testing.T) {
	t.Parallel()
	for _, bound := range []string{"MaxLagBytes", "MaxLag"} {
		t.Run(bound, func(t *testing.T) {
			s := newSetup(t)
			s.streaming(t)
			var blocked atomic.Bool
			release := make(chan struct{})
			var once sync.Once
			pub := relay.PublisherFunc(func(ctx context.Context, _ []relay.Message) error {
				if blocked.Load() {
					select {
					case <-release:
					case <-ctx.Done():
						return ctx.Err()
					}
				}
				return nil
			})
			cfg := streamConfig()
			switch bound {
			case "MaxLagBytes":
				cfg.Stream.MaxLagBytes, cfg.Stream.MaxLag = 1, time.Hour
			case "MaxLag":
				cfg.Stream.MaxLagBytes, cfg.Stream.MaxLag = 1<<40, 300*time.Millisecond
			}
			r := s.relay(t, pub, cfg)
			if err := r.Start(s.ctx); err != nil {
				t.Fatal(err)
			}
			defer func() {
				once.Do(func() { close(release) })
				_ = r.Stop(s.ctx)
			}()
			waitUntil(t, 60*time.Second, "streaming", func() bool { return r.StreamStatus().State == relay.Streaming })
			s.write(t, "h.topic", 3, 3)
			waitUntil(t, 10*time.Second, "a healthy relay that published", func() bool { return s.unpublished(t) == 0 && r.Health(s.ctx, 0) == nil })

			blocked.Store(true)
			s.write(t, "h.topic", 3, 3)
			var he *relay.HealthError
			var last error
			testenv.Eventually(t, 10*time.Second, func() (bool, string) {
				last = r.Health(s.ctx, 0)
				return errors.As(last, &he) && he.Check == "stream",
					fmt.Sprintf("Health = %v after events began to wait (stream status %+v), want a failed stream check", last, r.StreamStatus())
			})
			if !strings.Contains(he.Error(), bound) {
				t.Errorf("Health = %v, want it to name %s", he, bound)
			}
			st := r.StreamStatus()
			if st.LagBytes <= 0 || (bound == "MaxLag" && st.Lag < 300*time.Millisecond) {
				t.Errorf("stream status while blocked: %+v, want lag", st)
			}
			once.Do(func() { close(release) })
			blocked.Store(false)
			waitUntil(t, 10*time.Second, "Health to pass after the relay caught up", func() bool {
				return s.unpublished(t) == 0 && r.Health(s.ctx, 0) == nil
			})
			// WAL written for other tables (the server's other work) moves
			// the server's end; the relay, with nothing of its own waiting,
			// confirms it, so the slot neither lags nor pins that WAL.
			if _, err := s.pool.Exec(s.ctx, "CREATE TABLE "+s.table.Schema+".scratch AS SELECT g, repeat('x', 100) AS pad FROM generate_series(1, 20000) g"); err != nil {
				t.Fatal(err)
			}
			var after string
			if err := s.pool.QueryRow(s.ctx, "SELECT pg_current_wal_lsn()::text").Scan(&after); err != nil {
				t.Fatal(err)
			}
			end, err := pglogrepl.ParseLSN(after)
			if err != nil {
				t.Fatal(err)
			}
			waitUntil(t, 10*time.Second, "the relay to confirm the WAL of other tables, with no lag", func() bool {
				st := r.StreamStatus()
				return st.Confirmed >= end && st.LagBytes == 0 && st.Lag == 0 && r.Health(s.ctx, 0) == nil
			})
		})
	}
}
