package relay_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/admin"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
)

// TestExactlyOnceRefusesWhatItCannotKeep: exactly-once needs cursor
// progress when it streams, per-key lanes, the relay's own producer and a
// transaction timeout within the batch's.
func TestExactlyOnceRefusesWhatItCannotKeep(t *testing.T) {
	t.Parallel()
	pub, err := relay.NewSaramaPublisher([]string{"127.0.0.1:1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	own := relay.PublisherFunc(func(context.Context, []relay.Message) error { return nil })
	for _, c := range []struct {
		name string
		pub  relay.Publisher
		cfg  relay.Config
		want string
	}{
		{"stream with marks", pub, relay.Config{Mode: relay.Stream, Progress: relay.ProgressMarks}, "needs Progress cursor in Mode Stream"},
		{"unordered", pub, relay.Config{Ordering: relay.Unordered}, "needs Ordering PerKey"},
		{"own publisher", own, relay.Config{}, "pass a *relay.SaramaPublisher"},
		{"timeout", pub, relay.Config{TransactionTimeout: time.Minute}, "TransactionTimeout"},
		{"timeout too short", pub, relay.Config{TransactionTimeout: time.Millisecond}, "TransactionTimeout"},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.cfg.Delivery = relay.ExactlyOnce
			_, err := relay.New(fakeDB{}, c.pub, &c.cfg)
			var ce *outbox.ConfigError
			if !errors.As(err, &ce) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("New = %v, want a config error saying %q", err, c.want)
			}
		})
	}
}

// fakeDB is a DB that New accepts; the refusals come before any query.
type fakeDB struct{}

func (fakeDB) Begin(context.Context) (pgx.Tx, error) { return nil, errors.New("not a database") }

// failMarks is the relay's pool, except that the batch's mark statement
// fails while fail is set: the Kafka transaction has committed, and the
// database marks do not follow (a crash between the two, without losing
// the process).
type failMarks struct {
	relay.DB
	fail  *atomic.Int32 // marks still to fail
	table string
}

func (d failMarks) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := d.DB.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return failMarksTx{Tx: tx, d: d}, nil
}

type failMarksTx struct {
	pgx.Tx
	d failMarks
}

func (tx failMarksTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	for _, q := range b.QueuedQueries {
		if strings.HasPrefix(q.SQL, "UPDATE "+tx.d.table+" SET published_at = now() WHERE id = ANY($1)") && tx.d.fail.Add(-1) >= 0 {
			_ = tx.Tx.Rollback(ctx)
			return tx.Tx.SendBatch(ctx, &pgx.Batch{}) // fails: the transaction is closed
		}
	}
	return tx.Tx.SendBatch(ctx, b)
}

// TestExactlyOnceMarksFollowTheCommit: the database marks of committed
// Kafka transactions fail (three times), so the rows stay unpublished in
// the table; the relay reads the lane's progress back before the lane's
// next transaction, marks them, and sends none of them again. A
// read_committed consumer gets each event once.
func TestExactlyOnceMarksFollowTheCommit(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	topic := testenv.Topic(t, s.kafka(t), 4)
	cons := testenv.ConsumeCommitted(t, s.kafka(t), topic)
	var fail atomic.Int32
	fail.Store(3)
	r, err := relay.New(failMarks{DB: s.pool, fail: &fail, table: sqlname.Ident(s.table)}, s.publisher(t),
		&relay.Config{Table: s.table, Delivery: relay.ExactlyOnce, PollInterval: 20 * time.Millisecond, Lanes: 4})
	if err != nil {
		t.Fatal(err)
	}
	const n = 300
	s.write(t, topic, n, 8)
	if err := r.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 60*time.Second, "all events published", func() bool { return s.unpublished(t) == 0 })
	if err := r.Stop(s.ctx); err != nil {
		t.Fatal(err)
	}
	if fail.Load() >= 0 {
		t.Fatalf("%d mark failures left: the test did not fail the marks", fail.Load()+1)
	}
	eachOnce(t, cons, n)
}

// eachOnce waits for n records on a read_committed consumer, gives a
// duplicate time to arrive, and fails unless they are n distinct events.
func eachOnce(t *testing.T, cons *testenv.Consumer, n int) {
	t.Helper()
	cons.WaitFor(n, 30*time.Second)
	time.Sleep(500 * time.Millisecond)
	msgs := cons.Messages()
	ids := map[string]bool{}
	for _, m := range msgs {
		ids[testenv.Header(m, outbox.HeaderEventID)] = true
	}
	if len(msgs) != n || len(ids) != n {
		t.Fatalf("read_committed: %d records, %d distinct events of %d; want each once", len(msgs), len(ids), n)
	}
}

// TestExactlyOnceReplayIsNotUndone: an operator replays events of a lane's
// last transaction; a relay that takes the lane over reads that
// transaction back, but sends the replayed events again rather than
// marking them published.
func TestExactlyOnceReplayIsNotUndone(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	topic := testenv.Topic(t, s.kafka(t), 1)
	cons := testenv.ConsumeCommitted(t, s.kafka(t), topic)
	cfg := relay.Config{Delivery: relay.ExactlyOnce, Lanes: 1}
	const n = 20
	s.write(t, topic, n, 3)
	first := s.relay(t, s.publisher(t), cfg)
	if got, err := first.RunOnce(s.ctx); err != nil || got != n {
		t.Fatalf("RunOnce = %d, %v; want %d", got, err, n)
	}
	if err := first.Stop(s.ctx); err != nil { // closes its Kafka client
		t.Fatal(err)
	}
	replayed, err := admin.Replay(s.ctx, s.pool, s.table, admin.Filter{FromID: 5, ToID: 7}, nil)
	if err != nil || replayed != 3 {
		t.Fatalf("Replay = %d, %v; want 3", replayed, err)
	}
	second := s.relay(t, s.publisher(t), cfg) // a new owner: reads lane 0 back
	defer func() { _ = second.Stop(s.ctx) }()
	if got, err := second.RunOnce(s.ctx); err != nil || got != 3 {
		t.Fatalf("RunOnce after the replay = %d, %v; want the 3 replayed events sent again", got, err)
	}
	cons.WaitFor(n+3, 30*time.Second)
}

// TestExactlyOnceWorkersAndReplicas: two relays of four workers each share
// a table while writers commit; every worker has its own transactional id
// and takes lanes from the others. A read_committed consumer gets every
// event once, each key in write order.
func TestExactlyOnceWorkersAndReplicas(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	topic := testenv.Topic(t, s.kafka(t), 6)
	cons := testenv.ConsumeCommitted(t, s.kafka(t), topic)
	cfg := relay.Config{Delivery: relay.ExactlyOnce, Workers: 4, PollInterval: 10 * time.Millisecond, BatchSize: 20, MaxBatchSize: 100}
	var relays []*relay.Relay
	for range 2 {
		r := s.relay(t, s.publisher(t), cfg)
		if err := r.Start(s.ctx); err != nil {
			t.Fatal(err)
		}
		relays = append(relays, r)
	}
	const n, keys = 2000, 60
	t0 := time.Now()
	s.write(t, topic, n, keys)
	t1 := time.Now()
	waitUntil(t, 60*time.Second, "all events published", func() bool { return s.unpublished(t) == 0 })
	t.Logf("written in %v, published %v later", t1.Sub(t0), time.Since(t1))
	for _, r := range relays {
		if err := r.Stop(s.ctx); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(300 * time.Millisecond)
	onceInKeyOrder(t, cons, n)
}

// onceInKeyOrder waits for n records and fails unless they are n distinct
// events, each key's in write order (the "seq" of their payload).
func onceInKeyOrder(t *testing.T, cons *testenv.Consumer, n int) {
	t.Helper()
	seen := map[string]bool{}
	last := map[string]int{}
	for _, m := range cons.WaitFor(n, 30*time.Second) {
		id := testenv.Header(m, outbox.HeaderEventID)
		if seen[id] {
			t.Fatalf("event %s delivered twice to a read_committed consumer", id)
		}
		seen[id] = true
		var p struct{ Seq int }
		if err := json.Unmarshal(m.Value, &p); err != nil {
			t.Fatal(err)
		}
		if prev, ok := last[string(m.Key)]; ok && p.Seq < prev {
			t.Fatalf("key %s: seq %d after %d", m.Key, p.Seq, prev)
		}
		last[string(m.Key)] = p.Seq
	}
	if len(seen) != n {
		t.Fatalf("%d distinct events, want %d", len(seen), n)
	}
}

// TestExactlyOnceFencedWorkerSendsAgain: a relay whose lane another relay
// took meanwhile learns it was fenced only from the broker, at its next
// batch (its producer epoch is old). That batch publishes nothing, is not a
// failure (its events are held, not charged) and is logged at Debug; the
// next one takes the lane back (reading the other relay's progress) and
// publishes the events. A read_committed consumer gets each event once.
func TestExactlyOnceFencedWorkerSendsAgain(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	topic := testenv.Topic(t, s.kafka(t), 1)
	cons := testenv.ConsumeCommitted(t, s.kafka(t), topic)
	var logs bytes.Buffer
	var mu sync.Mutex
	debug := slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	a := s.relay(t, s.publisher(t), relay.Config{Delivery: relay.ExactlyOnce, Lanes: 1, Logger: debug})
	b := s.relay(t, s.publisher(t), relay.Config{Delivery: relay.ExactlyOnce, Lanes: 1})
	defer func() { _ = a.Stop(s.ctx); _ = b.Stop(s.ctx) }()
	const n = 5
	runOnce := func(r *relay.Relay, who string, want int) {
		t.Helper()
		if got, err := r.RunOnce(s.ctx); err != nil || got != want {
			t.Fatalf("%s: RunOnce = %d, %v; want %d", who, got, err, want)
		}
	}
	s.write(t, topic, n, 2)
	runOnce(a, "relay a", n)
	s.write(t, topic, n, 2)
	runOnce(b, "relay b, taking the lane over", n) // fences a's producer
	s.write(t, topic, n, 2)
	runOnce(a, "relay a, fenced", 0)
	mu.Lock()
	fenced := strings.Contains(logs.String(), "worker was fenced")
	mu.Unlock()
	if !fenced {
		t.Errorf("relay a did not log that it was fenced:\n%s", logs.String())
	}
	if got := s.count(t, "attempts > 0 OR last_error IS NOT NULL"); got != 0 {
		t.Errorf("%d events charged an attempt because their worker was fenced", got)
	}
	runOnce(a, "relay a, taking the lane back", n)
	eachOnce(t, cons, 3*n)
}
