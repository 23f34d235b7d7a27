package relay_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

type setup struct {
	ctx     context.Context
	pool    *pgxpool.Pool
	table   outbox.Table
	uow     *unitofwork.UnitOfWork
	brokers []string
}

func newSetup(t testing.TB) *setup {
	t.Helper()
	pool := testenv.Pool(t)
	tbl := testenv.Table(t, pool)
	uow, err := unitofwork.New(pool, &unitofwork.Config{Service: "test", Table: tbl, Propagator: propagation.TraceContext{}})
	if err != nil {
		t.Fatal(err)
	}
	return &setup{ctx: context.Background(), pool: pool, table: tbl, uow: uow}
}

func (s *setup) kafka(t testing.TB) []string {
	t.Helper()
	if s.brokers == nil {
		s.brokers = testenv.Brokers(t)
	}
	return s.brokers
}

func (s *setup) publisher(t testing.TB) *relay.SaramaPublisher {
	t.Helper()
	p, err := relay.NewSaramaPublisher(s.kafka(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func (s *setup) relay(t testing.TB, pub relay.Publisher, cfg relay.Config) *relay.Relay {
	t.Helper()
	cfg.Table = s.table
	r, err := relay.New(s.pool, pub, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// write commits n events, one per transaction, keys cycling over keys.
func (s *setup) write(t *testing.T, topic string, n, keys int) {
	t.Helper()
	s.writeRange(t, topic, 0, n, keys)
}

// writeRange commits the events of seq from to to - 1, one per
// transaction, the key of seq i "k" + i % keys.
func (s *setup) writeRange(t *testing.T, topic string, from, to, keys int) {
	t.Helper()
	for i := from; i < to; i++ {
		err := s.uow.Do(s.ctx, func(ctx context.Context, tx unitofwork.Tx) error {
			return tx.Add(ctx, outbox.Event{
				AggregateType: "order", AggregateID: fmt.Sprintf("k%d", i%keys), Type: "order.updated.v1",
				Topic: topic, Payload: map[string]int{"seq": i},
			})
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

func (s *setup) unpublished(t testing.TB) int {
	t.Helper()
	var n int
	if err := s.pool.QueryRow(s.ctx, "SELECT count(*) FROM "+sqlname.Ident(s.table)+" WHERE published_at IS NULL").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func waitUntil(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, timeout, testenv.Cond(what, cond))
}

func TestEventsArriveIntactWithTrace(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	topic := testenv.Topic(t, s.kafka(t), 4)
	cons := testenv.Consume(t, s.kafka(t), topic)

	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer func() { _ = tp.Shutdown(context.Background()) }()

	// The "HTTP request" span whose trace must reach the consumer.
	reqCtx, reqSpan := tp.Tracer("test").Start(s.ctx, "POST /orders")
	payload := map[string]any{"orderId": "o-1", "total": 99.5, "lines": []any{"a", "b"}, "nested": map[string]any{"z": 1.0, "a": nil}}
	var ids []string
	err := s.uow.Do(reqCtx, func(ctx context.Context, tx unitofwork.Tx) error {
		for i := range 3 {
			e := outbox.Event{
				AggregateType: "order", AggregateID: "o-1", Type: fmt.Sprintf("order.step%d.v1", i),
				Topic: topic, Payload: payload, Headers: map[string]string{"tenant": "acme"},
			}
			if i == 2 {
				e.Key = "explicit-key"
			}
			if err := tx.Add(ctx, e); err != nil {
				return err
			}
		}
		return nil
	})
	reqSpan.End()
	if err != nil {
		t.Fatal(err)
	}
	rows, _ := s.pool.Query(s.ctx, "SELECT event_id::text FROM "+sqlname.Ident(s.table)+" ORDER BY id")
	for rows.Next() {
		var id string
		_ = rows.Scan(&id)
		ids = append(ids, id)
	}

	r := s.relay(t, s.publisher(t), relay.Config{TracerProvider: tp, Propagator: propagation.TraceContext{}})
	n, err := r.RunOnce(s.ctx)
	if err != nil || n != 3 {
		t.Fatalf("RunOnce = %d, %v; want 3, nil", n, err)
	}
	if u := s.unpublished(t); u != 0 {
		t.Errorf("%d rows still unpublished", u)
	}
	msgs := cons.WaitFor(3, 20*time.Second)
	byID := map[string]*sarama.ConsumerMessage{}
	for _, m := range msgs {
		byID[testenv.Header(m, outbox.HeaderEventID)] = m
	}
	prop := propagation.TraceContext{}
	for i, id := range ids {
		m := byID[id]
		if m == nil {
			t.Fatalf("event %s not consumed", id)
		}
		wantKey := "o-1"
		if i == 2 {
			wantKey = "explicit-key"
		}
		if string(m.Key) != wantKey {
			t.Errorf("event %d key = %q, want %q", i, m.Key, wantKey)
		}
		if got := testenv.Header(m, outbox.HeaderEventType); got != fmt.Sprintf("order.step%d.v1", i) {
			t.Errorf("event %d x-event-type = %q", i, got)
		}
		if got := testenv.Header(m, "tenant"); got != "acme" {
			t.Errorf("event %d tenant header = %q", i, got)
		}
		var got map[string]any
		if err := json.Unmarshal(m.Value, &got); err != nil || !reflect.DeepEqual(got, payload) {
			t.Errorf("event %d payload = %s (%v), want %v", i, m.Value, err, payload)
		}
		carrier := propagation.MapCarrier{}
		for _, h := range m.Headers {
			carrier[string(h.Key)] = string(h.Value)
		}
		sc := trace.SpanContextFromContext(prop.Extract(context.Background(), carrier))
		if sc.TraceID() != reqSpan.SpanContext().TraceID() {
			t.Errorf("event %d: consumer trace id %s, want the request's %s", i, sc.TraceID(), reqSpan.SpanContext().TraceID())
		}
	}
	var publishSpans int
	for _, sp := range exp.GetSpans() {
		if sp.Name != "publish "+topic {
			continue
		}
		publishSpans++
		if sp.SpanKind != trace.SpanKindProducer || sp.Parent.SpanID() != reqSpan.SpanContext().SpanID() {
			t.Errorf("publish span kind %v parent %s, want producer child of the request span", sp.SpanKind, sp.Parent.SpanID())
		}
	}
	if publishSpans != 3 {
		t.Errorf("%d publish spans, want 3", publishSpans)
	}
}

func TestTwoRelaysLoseNothingDuplicateNothing(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	topic := testenv.Topic(t, s.kafka(t), 6)
	cons := testenv.Consume(t, s.kafka(t), topic)
	const total = 2000
	s.write(t, topic, total/2, 40)

	var relays []*relay.Relay
	for range 2 {
		r := s.relay(t, s.publisher(t), relay.Config{BatchSize: 50, PollInterval: 20 * time.Millisecond})
		if err := r.Start(s.ctx); err != nil {
			t.Fatal(err)
		}
		relays = append(relays, r)
	}
	s.write(t, topic, total/2, 40) // writers keep committing while both relays run
	waitUntil(t, 60*time.Second, "all rows published", func() bool { return s.unpublished(t) == 0 })
	for _, r := range relays {
		if err := r.Stop(s.ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Every record the topic holds, duplicates included (the relays stopped).
	msgs := cons.WaitFor(testenv.RecordCount(t, s.kafka(t), topic), 30*time.Second)
	seen := map[string]int{}
	for _, m := range msgs {
		seen[testenv.Header(m, outbox.HeaderEventID)]++
	}
	if len(seen) != total {
		t.Errorf("consumed %d distinct events, want %d", len(seen), total)
	}
	if len(msgs) != total {
		t.Errorf("consumed %d records for %d events: duplicates in steady state", len(msgs), total)
	}
}

func TestDrainsBacklogWithoutWaitingForTicks(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	s.write(t, "drain.topic", 500, 10)
	var calls atomic.Int64
	pub := relay.PublisherFunc(func(ctx context.Context, msgs []relay.Message) error { calls.Add(1); return nil })
	r := s.relay(t, pub, relay.Config{BatchSize: 50, MaxBatchSize: 50, PollInterval: time.Hour})
	if err := r.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Stop(s.ctx) }()
	waitUntil(t, 20*time.Second, "backlog drained with a 1h ticker", func() bool { return s.unpublished(t) == 0 })
	if c := calls.Load(); c < 10 {
		t.Errorf("%d publish calls for 500 events at batch 50, want at least 10", c)
	}
}

// A backlog drains in growing batches (doubling from BatchSize up to
// MaxBatchSize); once the relay keeps up it claims BatchSize again.
func TestBatchesGrowWhileABacklogDrains(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	writeBulk := func(n int) {
		t.Helper()
		for done := 0; done < n; done += 100 {
			err := s.uow.Do(s.ctx, func(ctx context.Context, tx unitofwork.Tx) error {
				for i := done; i < min(done+100, n); i++ {
					if err := tx.Add(ctx, outbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("k%d", i%97), Type: "order.updated.v1",
						Topic: "grow.topic", Payload: map[string]int{"seq": i}}); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, tc := range []struct {
		name      string
		max       int
		wantBurst []int // a burst of 120 after the relay caught up
		wantSizes []int
	}{
		{"default max", 0, []int{50, 70}, []int{50, 100, 200, 400, 500, 500, 250}},
		{"fixed", 50, []int{50, 50, 20}, []int{50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			writeBulk(2000)
			var mu sync.Mutex
			var sizes []int
			pub := relay.PublisherFunc(func(ctx context.Context, msgs []relay.Message) error {
				mu.Lock()
				defer mu.Unlock()
				sizes = append(sizes, len(msgs))
				return nil
			})
			r := s.relay(t, pub, relay.Config{MaxBatchSize: tc.max, PollInterval: time.Hour})
			if err := r.Start(s.ctx); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = r.Stop(s.ctx) }()
			waitUntil(t, 20*time.Second, "backlog drained", func() bool { return s.unpublished(t) == 0 })
			mu.Lock()
			got := slices.Clone(sizes)
			sizes = nil
			mu.Unlock()
			if !slices.Equal(got, tc.wantSizes) {
				t.Errorf("batch sizes while draining 2000 events: %v, want %v", got, tc.wantSizes)
			}
			// Caught up: the next burst starts again at BatchSize.
			writeBulk(120)
			r.Wake()
			waitUntil(t, 20*time.Second, "burst published", func() bool { return s.unpublished(t) == 0 })
			mu.Lock()
			defer mu.Unlock()
			if !slices.Equal(sizes, tc.wantBurst) {
				t.Errorf("batch sizes of a burst of 120 after the relay caught up: %v, want %v", sizes, tc.wantBurst)
			}
		})
	}
}

// A failure is logged once while it lasts, also when the failing batches
// differ in size (their errors carry different counts).
func TestFailureIsLoggedOnce(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	var logs bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, nil))
	var calls atomic.Int64
	pub := relay.PublisherFunc(func(context.Context, []relay.Message) error {
		calls.Add(1)
		return errors.New("broker down")
	})
	r := s.relay(t, pub, relay.Config{PollInterval: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond, Logger: logger})
	s.write(t, "down.topic", 1, 1)
	if err := r.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Stop(s.ctx) }()
	waitUntil(t, 10*time.Second, "failing batches of 1 event", func() bool { return calls.Load() >= 3 })
	s.write(t, "down.topic", 2, 2)
	n := calls.Load()
	waitUntil(t, 10*time.Second, "failing batches of 3 events", func() bool { return calls.Load() >= n+3 })
	mu.Lock()
	defer mu.Unlock()
	if got := strings.Count(logs.String(), "batch failed"); got != 1 {
		t.Errorf("%d warnings for one lasting failure, want 1:\n%s", got, logs.String())
	}
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// A batch commits its marks with synchronous_commit=off unless
// SynchronousCommit is set: the setting travels with the claim's first
// statement.
func TestSynchronousCommitSetting(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	for _, sync := range []bool{false, true} {
		tr := &sqlRecorder{}
		pool := s.tracedPool(t, tr)
		s.write(t, "sync.topic", 1, 1)
		pub := relay.PublisherFunc(func(context.Context, []relay.Message) error { return nil })
		r, err := relay.New(pool, pub, &relay.Config{Table: s.table, SynchronousCommit: sync})
		if err != nil {
			t.Fatal(err)
		}
		if n, err := r.RunOnce(s.ctx); n != 1 || err != nil {
			t.Fatalf("RunOnce = %d, %v", n, err)
		}
		pool.Close()
		if off := tr.saw("set_config('synchronous_commit', 'off'"); off == sync {
			t.Errorf("SynchronousCommit %v: the batch set synchronous_commit off: %v, want %v", sync, off, !sync)
		}
	}
}

// tracedPool returns a pool of s's database whose connections report
// their statements to tr; it closes at the test's end.
func (s *setup) tracedPool(t *testing.T, tr pgx.QueryTracer) *pgxpool.Pool {
	t.Helper()
	pc := s.pool.Config()
	pc.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(s.ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// sqlRecorder records the SQL of every statement, batched or not, with
// the connection that ran it.
type sqlRecorder struct {
	mu  sync.Mutex
	sql []connSQL
}

type connSQL struct {
	conn *pgx.Conn
	sql  string
}

func (r *sqlRecorder) add(c *pgx.Conn, sql string) {
	r.mu.Lock()
	r.sql = append(r.sql, connSQL{c, sql})
	r.mu.Unlock()
}

// saw reports whether a statement with part ran.
func (r *sqlRecorder) saw(part string) bool { return len(r.connsThatRan(part)) > 0 }

// connsThatRan returns the connections that ran a statement with part.
func (r *sqlRecorder) connsThatRan(part string) []*pgx.Conn {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*pgx.Conn
	for _, s := range r.sql {
		if strings.Contains(s.sql, part) && !slices.Contains(out, s.conn) {
			out = append(out, s.conn)
		}
	}
	return out
}

// count counts the statements with part that c ran.
func (r *sqlRecorder) count(c *pgx.Conn, part string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, s := range r.sql {
		if s.conn == c && strings.Contains(s.sql, part) {
			n++
		}
	}
	return n
}

// inTransaction counts the statements with part that c ran outside a
// transaction block and in one (after a BEGIN that no COMMIT or ROLLBACK
// ended).
func (r *sqlRecorder) inTransaction(c *pgx.Conn, part string) (outside, inside int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	in := false
	for _, s := range r.sql {
		if s.conn != c {
			continue
		}
		switch q := strings.ToLower(strings.TrimSpace(s.sql)); {
		case strings.HasPrefix(q, "begin"):
			in = true
		case q == "commit" || q == "rollback":
			in = false
		case strings.Contains(s.sql, part) && in:
			inside++
		case strings.Contains(s.sql, part):
			outside++
		}
	}
	return outside, inside
}

func (r *sqlRecorder) TraceQueryStart(ctx context.Context, c *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.add(c, d.SQL)
	return ctx
}
func (r *sqlRecorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *sqlRecorder) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (r *sqlRecorder) TraceBatchQuery(_ context.Context, c *pgx.Conn, d pgx.TraceBatchQueryData) {
	r.add(c, d.SQL)
}
func (r *sqlRecorder) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func TestWakePublishesBeforeTheTick(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	pub := relay.PublisherFunc(func(context.Context, []relay.Message) error { return nil })
	r := s.relay(t, pub, relay.Config{PollInterval: time.Hour})
	s.write(t, "wake.topic", 1, 1) // for the first poll, at start
	if err := r.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Stop(s.ctx) }()
	// Once the first poll has published it, the relay waits for its tick
	// (an hour) or a wake-up.
	waitUntil(t, 10*time.Second, "the first poll to publish", func() bool { return s.unpublished(t) == 0 })
	s.write(t, "wake.topic", 1, 1)
	time.Sleep(300 * time.Millisecond)
	if n := s.unpublished(t); n != 1 {
		t.Fatalf("%d unpublished before the wake-up, want 1: something other than Wake published", n)
	}
	r.Wake()
	waitUntil(t, 10*time.Second, "woken relay to publish", func() bool { return s.unpublished(t) == 0 })
}

func TestPublishFailureBacksOffAndRecovers(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	s.write(t, "fail.topic", 5, 5)
	var calls atomic.Int64
	var healthy atomic.Bool
	pub := relay.PublisherFunc(func(ctx context.Context, msgs []relay.Message) error {
		calls.Add(1)
		if !healthy.Load() {
			return errors.New("kafka: client has run out of available brokers to talk to")
		}
		return nil
	})
	// One worker, so the count below is one backoff sequence.
	r := s.relay(t, pub, relay.Config{PollInterval: 10 * time.Millisecond, MaxBackoff: 5 * time.Second, Workers: 1})
	if err := r.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Stop(s.ctx) }()
	// The relay retries while failing, paced: without backoff a 10ms ticker
	// would call ~100 times in a second; doubling from 10ms gives about 7
	// (a loaded machine gives fewer, never more).
	waitUntil(t, 15*time.Second, "the relay to retry the failing publisher", func() bool { return calls.Load() >= 3 })
	time.Sleep(1 * time.Second)
	if c := calls.Load(); c > 15 {
		t.Errorf("%d publish attempts in about 1s while failing, want a handful (backoff, not a busy loop)", c)
	}
	if u := s.unpublished(t); u != 5 {
		t.Errorf("%d unpublished after failures, want 5 (nothing marked)", u)
	}
	healthy.Store(true)
	waitUntil(t, 15*time.Second, "recovery after the publisher heals", func() bool { return s.unpublished(t) == 0 })
}

func TestPartialFailureHoldsTheRestOfTheKey(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	s.write(t, "partial.topic", 6, 2) // keys k0,k1,k0,k1,k0,k1
	pub := relay.PublisherFunc(func(ctx context.Context, msgs []relay.Message) error {
		return &relay.BatchError{Failed: map[int]error{2: errors.New("leader not available")}} // the second k0 event
	})
	r := s.relay(t, pub, relay.Config{})
	// The batch went through but for one event: not a failure of the
	// relay (that event and its key are retried, paced).
	n, err := r.RunOnce(s.ctx)
	if err != nil || n != 4 {
		t.Fatalf("RunOnce = %d, %v; want 4 marked and no error", n, err)
	}
	rows, _ := s.pool.Query(s.ctx, "SELECT partition_key, published_at IS NOT NULL FROM "+sqlname.Ident(s.table)+" ORDER BY id")
	var got []string
	for rows.Next() {
		var k string
		var p bool
		_ = rows.Scan(&k, &p)
		got = append(got, fmt.Sprintf("%s:%v", k, p))
	}
	want := []string{"k0:true", "k1:true", "k0:false", "k1:true", "k0:false", "k1:true"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("published flags = %v, want %v (k0 held after its failure)", got, want)
	}
}

func TestStop(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	s.write(t, "stop.topic", 3, 3)
	release := make(chan struct{})
	var entered sync.Once
	inFlight := make(chan struct{})
	pub := relay.PublisherFunc(func(ctx context.Context, msgs []relay.Message) error {
		entered.Do(func() { close(inFlight) })
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})

	// A stop context that ends first abandons the batch: nothing marked.
	r := s.relay(t, pub, relay.Config{})
	_ = r.Start(s.ctx)
	<-inFlight
	ctx, cancel := context.WithTimeout(s.ctx, 100*time.Millisecond)
	defer cancel()
	if err := r.Stop(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop = %v, want DeadlineExceeded", err)
	}
	if u := s.unpublished(t); u != 3 {
		t.Fatalf("%d unpublished after an abandoned batch, want 3", u)
	}

	// A stop context with time left lets the in-flight batch finish.
	inFlight = make(chan struct{})
	entered = sync.Once{}
	r = s.relay(t, pub, relay.Config{})
	_ = r.Start(s.ctx)
	<-inFlight
	go func() { time.Sleep(100 * time.Millisecond); close(release) }()
	if err := r.Stop(s.ctx); err != nil {
		t.Fatal(err)
	}
	if u := s.unpublished(t); u != 0 {
		t.Fatalf("%d unpublished after a graceful stop, want 0", u)
	}
	if err := r.Start(s.ctx); !errors.Is(err, relay.ErrStarted) {
		t.Errorf("second Start = %v, want ErrStarted", err)
	}
}

func TestUnreachableBrokerLeavesRowsUnpublished(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	s.write(t, "down.topic", 2, 2)
	cfg := relay.DefaultSaramaConfig()
	cfg.Metadata.Retry.Max = 0
	cfg.Net.DialTimeout = time.Second
	pub, err := relay.NewSaramaPublisher([]string{"127.0.0.1:1"}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	r := s.relay(t, pub, relay.Config{})
	if _, err := r.RunOnce(s.ctx); err == nil {
		t.Fatal("RunOnce with no broker succeeded")
	} else if want := "connect to Kafka"; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}
	if u := s.unpublished(t); u != 2 {
		t.Errorf("%d unpublished, want 2", u)
	}
}

func TestConfigValidation(t *testing.T) {
	pub := relay.PublisherFunc(func(context.Context, []relay.Message) error { return nil })
	pool := &pgxpool.Pool{}
	for _, c := range []relay.Config{
		{BatchSize: -1},
		{BatchSize: 20000},
		{BatchSize: 100, MaxBatchSize: 50},
		{MaxBatchSize: 20000},
		{PollInterval: time.Microsecond},
		{BatchTimeout: time.Millisecond},
		{PollInterval: time.Second, MaxBackoff: time.Millisecond},
		{Table: outbox.Table{Name: "drop table"}},
	} {
		if _, err := relay.New(pool, pub, &c); !errors.Is(err, outbox.ErrInvalidConfig) {
			t.Errorf("New(%+v) = %v, want ErrInvalidConfig", c, err)
		}
	}
	if _, err := relay.New(pool, nil, nil); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Errorf("nil publisher: %v", err)
	}

	breakers := map[string]func(*sarama.Config){
		"Producer.Idempotent":   func(c *sarama.Config) { c.Producer.Idempotent = false },
		"Producer.RequiredAcks": func(c *sarama.Config) { c.Producer.RequiredAcks = sarama.WaitForLocal },
		"Net.MaxOpenRequests":   func(c *sarama.Config) { c.Net.MaxOpenRequests = 5 },
		"Producer.Retry.Max":    func(c *sarama.Config) { c.Producer.Retry.Max = 0 },
		"Version":               func(c *sarama.Config) { c.Version = sarama.V0_10_2_0 },
		"timeouts":              func(c *sarama.Config) { c.Net.ReadTimeout = 0 },
	}
	for field, breakIt := range breakers {
		c := relay.DefaultSaramaConfig()
		breakIt(c)
		_, err := relay.NewSaramaPublisher([]string{"localhost:9092"}, c)
		var ce *outbox.ConfigError
		if !errors.As(err, &ce) || !strings.Contains(ce.Field, field) {
			t.Errorf("breaking %s: err = %v, want a ConfigError naming it", field, err)
		}
	}
	if _, err := relay.NewSaramaPublisher(nil, nil); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Errorf("no brokers: %v", err)
	}
	if p, err := relay.NewSaramaPublisher([]string{"localhost:9092"}, relay.DefaultSaramaConfig()); err != nil {
		t.Errorf("default config rejected: %v", err)
	} else {
		_ = p.Close()
	}
}

// TestConfigNegative checks that a negative setting is an error naming the
// field (zero means the default; only Retention takes a negative value).
func TestConfigNegative(t *testing.T) {
	pub := relay.PublisherFunc(func(context.Context, []relay.Message) error { return nil })
	pool := &pgxpool.Pool{}
	for field, c := range map[string]relay.Config{
		"PollInterval":          {PollInterval: -1},
		"BatchSize":             {BatchSize: -1},
		"MaxBatchSize":          {MaxBatchSize: -1},
		"Workers":               {Workers: -1},
		"Lanes":                 {Lanes: -1},
		"MaxAttempts":           {MaxAttempts: -1},
		"MaxMessageBytes":       {MaxMessageBytes: -1},
		"CleanupInterval":       {CleanupInterval: -1},
		"CleanupBatch":          {CleanupBatch: -1},
		"BatchTimeout":          {BatchTimeout: -1},
		"MaxBackoff":            {MaxBackoff: -1},
		"StatsInterval":         {StatsInterval: -1},
		"Stream.MaxLag":         {Mode: relay.Stream, Stream: relay.StreamConfig{MaxLag: -1}},
		"Stream.MaxLagBytes":    {Mode: relay.Stream, Stream: relay.StreamConfig{MaxLagBytes: -1}},
		"Stream.Linger":         {Mode: relay.Stream, Stream: relay.StreamConfig{Linger: -1}},
		"Stream.StandbyRetry":   {Mode: relay.Stream, Stream: relay.StreamConfig{StandbyRetry: -1}},
		"Stream.StatusInterval": {Mode: relay.Stream, Stream: relay.StreamConfig{StatusInterval: -1}},
		"Stream.SweepInterval":  {Mode: relay.Stream, Stream: relay.StreamConfig{SweepInterval: -1}},
		"Stream.RetryInterval":  {Mode: relay.Stream, Stream: relay.StreamConfig{RetryInterval: -1}},
	} {
		_, err := relay.New(pool, pub, &c)
		var ce *outbox.ConfigError
		if !errors.As(err, &ce) || ce.Field != field || !strings.Contains(ce.Reason, "default") {
			t.Errorf("%s negative: err = %v, want a ConfigError for %s saying its default", field, err, field)
		}
	}
	if _, err := relay.New(pool, pub, &relay.Config{Retention: -1}); err != nil {
		t.Errorf("Retention -1 (no deletion): %v", err)
	}
}
