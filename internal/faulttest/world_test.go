package faulttest

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/tablesql"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// Relay settings of the fault tests.
const (
	batchSize = 50
	// maxBatchSize lets batches grow while a backlog drains (the relay's
	// default behaviour), within a bound the duplicate limits use.
	maxBatchSize = 4 * batchSize
	pollInterval = 50 * time.Millisecond
	// maxBackoff keeps the relay's retry wait short, so it notices the
	// broker's return within seconds (the default, 30s, would too, only
	// slower).
	maxBackoff = 2 * time.Second
	// writerPause is each writer's pause between commits.
	writerPause = 5 * time.Millisecond
)

// world is one fault scenario: an outbox table, an aggregate table whose
// rows writers lock, a topic on the fault broker, a unit of work.
type world struct {
	ctx     context.Context
	pool    *pgxpool.Pool
	table   outbox.Table
	account string // the aggregate table, quoted
	uow     *unitofwork.UnitOfWork
	brokers []string
	topic   string
	keys    int
	// delivery is the relays' (OUTBOX_TEST_DELIVERY unless a test sets
	// it); under ExactlyOnce check reads committed and allows no
	// duplicate.
	delivery relay.Delivery
	// progress is the relays' (OUTBOX_TEST_PROGRESS where it applies, see
	// progressFor); under ProgressCursor the table has the cursor
	// migration and published, unpublished and the SQL of delivered and
	// waiting read the lanes' positions.
	progress relay.Progress
}

// payload is what every event carries: its aggregate and that aggregate's
// sequence number, 1, 2, 3, ... in commit order.
type payload struct {
	Account string `json:"account"`
	Seq     int64  `json:"seq"`
}

func newWorld(t *testing.T, b *broker, keys int) *world {
	t.Helper()
	return newWorldOn(t, testenv.Pool(t), b.brokers(), keys)
}

// newWorldOn builds a world on any database pool and Kafka-protocol brokers
// (the fault tests that break neither use KAFKA_BROKERS; the PostgreSQL
// restart test uses a cluster of its own).
func newWorldOn(t *testing.T, pool *pgxpool.Pool, brokers []string, keys int) *world {
	t.Helper()
	return newWorldFor(t, pool, brokers, keys, testDelivery(t), relay.Poll)
}

// newWorldFor is newWorldOn for relays of the given delivery and mode: the
// world's progress is OUTBOX_TEST_PROGRESS where those relays can record
// it (see progressFor), and its table gets the cursor migration then.
func newWorldFor(t *testing.T, pool *pgxpool.Pool, brokers []string, keys int, delivery relay.Delivery, mode relay.Mode) *world {
	t.Helper()
	return newWorldWith(t, pool, brokers, keys, delivery, progressFor(t, delivery, mode))
}

// newWorldWith is newWorldFor with the relays' progress given: under
// ProgressCursor the table gets the cursor migration.
func newWorldWith(t *testing.T, pool *pgxpool.Pool, brokers []string, keys int, delivery relay.Delivery, progress relay.Progress) *world {
	t.Helper()
	ctx := context.Background()
	tbl := testenv.Table(t, pool)
	w := &world{
		ctx: ctx, pool: pool, table: tbl, keys: keys, brokers: brokers, delivery: delivery, progress: progress,
		account: pgx.Identifier{tbl.Schema, "account"}.Sanitize(),
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+w.account+" (id text PRIMARY KEY, seq bigint NOT NULL DEFAULT 0)"); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "INSERT INTO "+w.account+" (id) SELECT 'acct-' || lpad(i::text, 3, '0') FROM generate_series(0, $1 - 1) i", keys); err != nil {
		t.Fatal(err)
	}
	if progress == relay.ProgressCursor {
		cursorReady(t, pool, tbl)
	}
	w.topic = testenv.Topic(t, w.brokers, 6)
	if delivery == relay.ExactlyOnce {
		// What an exactly-once failure needs to be understood: the
		// transactions left undecided on the topic and the progress topic.
		t.Cleanup(func() {
			if t.Failed() {
				dumpOpen(t, w.brokers, w.topic, progressTopic(tbl))
			}
		})
	}
	uow, err := unitofwork.New(pool, &unitofwork.Config{Table: tbl})
	if err != nil {
		t.Fatal(err)
	}
	w.uow = uow
	return w
}

func (w *world) key(i int) string { return fmt.Sprintf("acct-%03d", i%w.keys) }

// commit records the next event of account key. The UPDATE locks the
// account's row (as SELECT ... FOR UPDATE would) until the commit, so
// writers of one account serialize and its events are written in sequence
// order: the locking DESIGN.md asks of writers that share an aggregate.
func (w *world) commit(ctx context.Context, key string) error { return w.commitTo(ctx, key, w.topic) }

// commitTo is commit with the event sent to topic instead of the world's.
func (w *world) commitTo(ctx context.Context, key, topic string) error {
	return w.uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		var seq int64
		if err := tx.QueryRow(ctx, "UPDATE "+w.account+" SET seq = seq + 1 WHERE id = $1 RETURNING seq", key).Scan(&seq); err != nil {
			return err
		}
		return tx.Add(ctx, outbox.Event{
			AggregateType: "account", AggregateID: key, Type: "account.changed.v1",
			Topic: topic, Payload: payload{Account: key, Seq: seq},
		})
	})
}

// writers commit events on random accounts until stopped, each commit
// bounded by its own timeout.
type writers struct {
	stop    chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
	commits atomic.Int64
	mu      sync.Mutex
	errs    []error
}

func (w *world) startWriters(t *testing.T, n int) *writers {
	t.Helper()
	ws := &writers{stop: make(chan struct{})}
	for g := range n {
		ws.wg.Add(1)
		go func() {
			defer ws.wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), uint64(time.Now().UnixNano())))
			for {
				select {
				case <-ws.stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(w.ctx, 10*time.Second)
				err := w.commit(ctx, w.key(rng.IntN(w.keys)))
				cancel()
				if err != nil {
					ws.mu.Lock()
					ws.errs = append(ws.errs, err)
					ws.mu.Unlock()
				} else {
					ws.commits.Add(1)
				}
				time.Sleep(writerPause) // a steady stream, not a flood
			}
		}()
	}
	t.Cleanup(func() { ws.halt() })
	return ws
}

// halt stops the writers, waits for them and returns their errors.
func (ws *writers) halt() []error {
	ws.once.Do(func() { close(ws.stop) })
	ws.wg.Wait()
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return slices.Clone(ws.errs)
}

// startRelay starts a relay with its own SaramaPublisher (default producer
// configuration). The returned stop function stops the relay, then closes
// the producer; it also runs at cleanup.
func (w *world) startRelay(t *testing.T) (stop func()) {
	t.Helper()
	return w.startRelayWith(t, nil)
}

// startRelayWith is startRelay with the relay's configuration adjusted by
// tune (nil: the fault tests' settings).
func (w *world) startRelayWith(t *testing.T, tune func(*relay.Config)) (stop func()) {
	t.Helper()
	pub, err := relay.NewSaramaPublisher(w.brokers, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &relay.Config{
		Table: w.table, BatchSize: batchSize, MaxBatchSize: maxBatchSize, PollInterval: pollInterval, MaxBackoff: maxBackoff,
		Logger:   slog.New(slog.NewTextHandler(testWriter{t}, nil)),
		Delivery: w.delivery, // ExactlyOnce publishes through pub's brokers and configuration itself
		Progress: w.progress,
	}
	if tune != nil {
		tune(cfg)
	}
	r, err := relay.New(w.pool, pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(w.ctx); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(w.ctx, 30*time.Second)
			defer cancel()
			if err := r.Stop(ctx); err != nil {
				t.Errorf("relay stop: %v", err)
			}
			_ = pub.Close()
		})
	}
	t.Cleanup(stop)
	return stop
}

// testWriter sends the relay's log lines to the test log.
type testWriter struct{ t *testing.T }

func (tw testWriter) Write(p []byte) (int, error) {
	tw.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// count counts the table's rows where where holds. Under cursor progress a
// parked event moved to the parked table: a where on parked_at (with
// topic, attempts and last_error) counts its rows too.
func (w *world) count(t *testing.T, where string) int {
	t.Helper()
	sql := "SELECT count(*) FROM " + sqlname.Ident(w.table) + " WHERE " + where
	if w.progress == relay.ProgressCursor && strings.Contains(where, "parked_at") {
		sql = "SELECT count(*) FROM (SELECT topic, attempts, parked_at, last_error FROM " + sqlname.Ident(w.table) +
			" UNION ALL SELECT topic, attempts, parked_at, reason FROM " + sqlname.Ident(sqlname.Parked(w.table)) + ") e WHERE " + where
	}
	var n int
	if err := w.pool.QueryRow(w.ctx, sql).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// unpublished is the number of rows not delivered yet: published_at IS
// NULL, or under cursor progress the backlog and the parked rows as
// admin.ReadStatus counts them from the lanes' positions.
func (w *world) unpublished(t *testing.T) int {
	t.Helper()
	if w.progress != relay.ProgressCursor {
		return w.count(t, "published_at IS NULL")
	}
	_, c, err := cursorCounts(w.ctx, w.pool, w.table)
	if err != nil {
		t.Fatal(err)
	}
	return int(c.Backlog + c.Parked)
}

// published is the number of rows delivered: published_at IS NOT NULL, or
// under cursor progress the rows less the backlog, in one snapshot (a
// parked event left the table for the parked table).
func (w *world) published(t *testing.T) int {
	t.Helper()
	n, err := w.publishedCount()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// publishedCount is published, returning the error.
func (w *world) publishedCount() (int, error) {
	if w.progress != relay.ProgressCursor {
		return countRows(w, "published_at IS NOT NULL")
	}
	n, c, err := cursorCounts(w.ctx, w.pool, w.table)
	return int(n - c.Backlog), err
}

// delivered and waiting are deliveredSQL and waitingSQL of the world's
// table and progress, for count's where.
func (w *world) delivered() string { return deliveredSQL(w.table, w.progress) }
func (w *world) waiting() string   { return waitingSQL(w.table, w.progress) }

// waitFor waits until cond holds (testenv.Eventually), or fails the test
// naming what it waited for, and returns how long that took (for the logs).
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	return testenv.Eventually(t, timeout, testenv.Cond(what, cond))
}

// committed is one row of the outbox table.
type committed struct {
	key string
	seq int64
	id  int64 // the row's id
}

// verify consumes the whole topic from the oldest offset (everything is
// published by now) and checks it against the outbox table: every committed
// event delivered, nothing delivered that was not committed, the first
// deliveries of each key in sequence order, and at most one batch of
// duplicates per fault.
func (w *world) verify(t *testing.T, faults int) {
	t.Helper()
	w.check(t, faults)
}

// delivery is what check found in the topic.
type delivery struct {
	events int            // committed events (rows of the outbox table)
	dups   map[string]int // event id -> records beyond its first delivery
}

// check is verify, returning which events were delivered more than once.
func (w *world) check(t *testing.T, faults int) delivery {
	t.Helper()
	dupIDs := map[string]int{}
	events := map[string]committed{}
	want := map[string][]int64{} // per key, its sequence numbers in write (id) order
	rows, err := w.pool.Query(w.ctx, "SELECT event_id::text, partition_key, (payload->>'seq')::bigint, id FROM "+sqlname.Ident(w.table)+" ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	var id string
	var c committed
	if _, err := pgx.ForEachRow(rows, []any{&id, &c.key, &c.seq, &c.id}, func() error {
		events[id] = c
		want[c.key] = append(want[c.key], c.seq)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Every committed business change has its event: an account's seq
	// counts its committed updates, each of which added one event.
	accounts, err := w.pool.Query(w.ctx, "SELECT id, seq FROM "+w.account)
	if err != nil {
		t.Fatal(err)
	}
	var acct string
	var seq int64
	if _, err := pgx.ForEachRow(accounts, []any{&acct, &seq}, func() error {
		if int64(len(want[acct])) != seq {
			t.Errorf("account %s: %d committed changes, %d outbox events", acct, seq, len(want[acct]))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// The writers' locking makes each key's sequence 1..n in id order; if
	// not, the test itself is broken, not the relay.
	for k, seqs := range want {
		for i, s := range seqs {
			if s != int64(i+1) {
				t.Fatalf("test bug: key %s written out of sequence in the table: %v", k, seqs)
			}
		}
	}

	eo := w.delivery == relay.ExactlyOnce
	var msgs []*sarama.ConsumerMessage
	if eo {
		msgs = w.readCommitted(t, events)
	} else {
		// Every topic the table's events went to (one but in
		// TestPoisonRequeuedRightAfterFix).
		topics := w.topics(t)
		total := 0
		for _, tp := range topics {
			total += testenv.RecordCount(t, w.brokers, tp)
		}
		cons := testenv.Consume(t, w.brokers, topics...)
		msgs = cons.WaitFor(total, time.Minute)
		cons.Close()
	}
	slices.SortFunc(msgs, func(a, b *sarama.ConsumerMessage) int {
		return cmp.Or(cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Offset, b.Offset))
	})

	got := map[string][]int64{} // per key, the sequence numbers of first deliveries in log order
	seen := map[string]bool{}
	at := map[string][]string{} // event id -> partition@offset of its records
	type span struct{ from, to int64 }
	dupAt := map[int32]span{} // partition -> offsets from the first to the last record of a duplicated event
	dups, strays := 0, 0
	for _, m := range msgs {
		eid := testenv.Header(m, outbox.HeaderEventID)
		e, ok := events[eid]
		if !ok {
			strays++
			if strays <= 3 {
				t.Errorf("consumed %s/%d@%d with x-event-id %q, which is not in the outbox table", m.Topic, m.Partition, m.Offset, eid)
			}
			continue
		}
		var p payload
		if err := json.Unmarshal(m.Value, &p); err != nil || p.Account != e.key || p.Seq != e.seq || string(m.Key) != e.key {
			t.Errorf("record %s/%d@%d (event %s): key %q payload %s, want key %q seq %d (%v)", m.Topic, m.Partition, m.Offset, eid, m.Key, m.Value, e.key, e.seq, err)
			continue
		}
		at[eid] = append(at[eid], fmt.Sprintf("%d@%d", m.Partition, m.Offset))
		if seen[eid] {
			dups++
			dupIDs[eid]++
			first := firstOffset(msgs, eid, m.Partition)
			if sp, ok := dupAt[m.Partition]; ok {
				dupAt[m.Partition] = span{min(sp.from, first), max(sp.to, m.Offset)}
			} else {
				dupAt[m.Partition] = span{first, m.Offset}
			}
			continue
		}
		seen[eid] = true
		got[e.key] = append(got[e.key], e.seq)
	}

	var missing []string
	for eid := range events {
		if !seen[eid] {
			missing = append(missing, eid)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		t.Errorf("%d of %d committed events never reached Kafka, e.g. %v", len(missing), len(events), missing[:min(5, len(missing))])
	}
	disordered := 0
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if g, seqs := got[k], want[k]; !slices.Equal(g, seqs) {
			disordered++
			if disordered <= 5 {
				t.Errorf("key %s: first deliveries %s, want seq 1..%d in order", k, firstDivergence(g, seqs), len(seqs))
			}
		}
	}
	if disordered > 0 {
		t.Errorf("%d of %d keys: first deliveries not in write order", disordered, len(want))
	}
	limit := maxBatchSize * faults
	if eo {
		limit = 0
	}
	if dups > limit && eo {
		t.Errorf("read_committed: %d duplicate records (beyond the first of an event id) for %d fault(s); exactly once allows none", dups, faults)
		for _, eid := range slices.Sorted(maps.Keys(dupIDs))[:min(10, len(dupIDs))] {
			e := events[eid]
			t.Logf("duplicate: event %s (row %d, key %s seq %d) at partition@offset %v", eid, e.id, e.key, e.seq, at[eid])
		}
		for _, p := range slices.Sorted(maps.Keys(dupAt)) {
			dumpBatches(t, w.brokers, w.topic, p, max(0, dupAt[p].from-5), dupAt[p].to+5)
		}
	} else if dups > limit {
		t.Errorf("%d duplicate records (beyond the first of an event id) for %d fault(s); at most %d (one batch per fault) allowed", dups, faults, limit)
	}
	if w.progress == relay.ProgressCursor {
		w.checkCursor(t)
	}
	t.Logf("delivery %v, progress %v: %d committed events over %d keys; %d records consumed: %d duplicates (limit %d), %d strays",
		w.delivery, w.progress, len(events), len(want), len(msgs), dups, limit, strays)
	return delivery{events: len(events), dups: dupIDs}
}

// checkCursor checks, once everything was delivered, what cursor progress
// promises of the table: no row marked published nor written after its
// INSERT (unless charged a failure), nothing waiting by the lanes'
// positions, and the same answer from admin.ReadStatus's backlog and from
// waiting's count.
func (w *world) checkCursor(t *testing.T) {
	t.Helper()
	var marked, touched, inDone int
	if err := w.pool.QueryRow(w.ctx, "SELECT count(*) FILTER (WHERE published_at IS NOT NULL),"+
		" count(*) FILTER (WHERE xmin <> xid(txid) AND attempts = 0 AND last_error IS NULL AND parked_at IS NULL),"+
		" count(*) FILTER (WHERE "+tablesql.Delivered(w.table)+") FROM "+sqlname.Ident(w.table)).Scan(&marked, &touched, &inDone); err != nil {
		t.Fatal(err)
	}
	if marked > 0 {
		t.Errorf("cursor progress: %d rows marked published (published_at set): a cursor relay never marks", marked)
	}
	if touched > 0 {
		t.Errorf("cursor progress: %d rows written after their INSERT without a failure charged: delivery must not write rows", touched)
	}
	n, c, err := cursorCounts(w.ctx, w.pool, w.table)
	if err != nil {
		t.Fatal(err)
	}
	// Parked events left the table (for the parked table): nothing in it
	// waits.
	waiting := w.count(t, w.waiting())
	if c.Backlog != 0 || waiting != 0 {
		t.Errorf("cursor progress: admin backlog %d (parked %d), rows waiting by the lanes' positions %d, once everything was delivered", c.Backlog, c.Parked, waiting)
	}
	t.Logf("cursor progress: %d rows, none marked; %d held by their lanes' done snapshots (tablesql.Delivered), %d by open windows; backlog %d",
		n, inDone, int(n)-waiting-inDone, c.Backlog)
}

// topics returns the topics of the table's events, w.topic first.
func (w *world) topics(t *testing.T) []string {
	t.Helper()
	rows, err := w.pool.Query(w.ctx, "SELECT DISTINCT topic FROM "+sqlname.Ident(w.table)+" WHERE topic <> $1 ORDER BY 1", w.topic)
	if err != nil {
		t.Fatal(err)
	}
	others, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{w.topic}, others...)
}

// firstOffset is the offset of the first record of event eid in partition
// of msgs (sorted by partition and offset), or -1.
func firstOffset(msgs []*sarama.ConsumerMessage, eid string, partition int32) int64 {
	for _, m := range msgs {
		if m.Partition == partition && testenv.Header(m, outbox.HeaderEventID) == eid {
			return m.Offset
		}
	}
	return -1
}

// firstDivergence describes where got departs from want.
func firstDivergence(got, want []int64) string {
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			return fmt.Sprintf("diverge at position %d: got seq %d, want %d (got %v...)", i, got[i], want[i], got[i:min(i+8, len(got))])
		}
	}
	return fmt.Sprintf("got %d deliveries, want %d", len(got), len(want))
}

// readCommitted reads the topic as exactly-once consumers do, once no
// transaction is open on it any more: read_uncommitted, every committed
// event must be there (aborted records too, which do not count), and
// read_committed, whose records it returns for check. It waits until the
// read_committed consumer has every event and then until it gets nothing
// more for a while, so that a late duplicate is in what it returns.
func (w *world) readCommitted(t *testing.T, events map[string]committed) []*sarama.ConsumerMessage {
	t.Helper()
	client := offsetClient(t, w.brokers)
	start := time.Now()
	if !settled(t, client, w.topic, 2*time.Minute) {
		t.Errorf("a Kafka transaction on %s is still open %v after every row was published: read_committed consumers are held back", w.topic, time.Since(start).Round(time.Millisecond))
	}
	ids := map[string]bool{}
	for eid := range events {
		ids[eid] = true
	}
	unc := testenv.Consume(t, w.brokers, w.topic)
	all := waitEvents(unc, ids, time.Minute)
	unc.Close()
	seen := map[string]bool{}
	for _, m := range all {
		seen[testenv.Header(m, outbox.HeaderEventID)] = true
	}
	lost := 0
	for eid := range events {
		if !seen[eid] {
			lost++
		}
	}
	if lost > 0 {
		t.Errorf("read_uncommitted: %d of %d committed events never reached Kafka, not even in an aborted transaction", lost, len(events))
	}
	cons := testenv.ConsumeCommitted(t, w.brokers, w.topic)
	defer cons.Close()
	waitEvents(cons, ids, time.Minute)
	msgs := quiet(cons, 1500*time.Millisecond)
	t.Logf("read_uncommitted: %d records (aborted ones included); read_committed: %d records", len(all), len(msgs))
	return msgs
}

// waitEvents waits until cons has a record of every event of ids (by
// x-event-id), for at most timeout, and returns what it consumed.
func waitEvents(cons *testenv.Consumer, ids map[string]bool, timeout time.Duration) []*sarama.ConsumerMessage {
	deadline := time.Now().Add(timeout)
	seen := map[string]bool{}
	n := 0
	for {
		msgs := cons.Messages()
		for _, m := range msgs[n:] {
			if eid := testenv.Header(m, outbox.HeaderEventID); ids[eid] {
				seen[eid] = true
			}
		}
		n = len(msgs)
		if len(seen) >= len(ids) || time.Now().After(deadline) {
			return msgs
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// quiet waits until cons has consumed nothing new for d and returns what
// it consumed.
func quiet(cons *testenv.Consumer, d time.Duration) []*sarama.ConsumerMessage {
	n, since := -1, time.Now()
	for {
		msgs := cons.Messages()
		if len(msgs) != n {
			n, since = len(msgs), time.Now()
		} else if time.Since(since) >= d {
			return msgs
		}
		time.Sleep(50 * time.Millisecond)
	}
}
