package relay_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/locks"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
)

// killKeepers terminates the backends that hold session locks on the
// table's lanes: the connections on which a cursor relay's workers keep
// their lanes, as if the relay's host had crashed.
func (s *setup) killKeepers(t *testing.T) int {
	t.Helper()
	ns := uint32(locks.Namespace(s.table.String()))
	var n int
	err := s.pool.QueryRow(s.ctx, `SELECT count(pg_terminate_backend(pid)) FROM (SELECT DISTINCT pid FROM pg_locks
		WHERE locktype = 'advisory' AND classid = $1::bigint::oid AND objsubid = 2 AND granted AND pid <> pg_backend_pid()) p`, int64(ns)).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// countByID counts each event's deliveries.
func countByID(msgs []*sarama.ConsumerMessage) map[string]int {
	out := map[string]int{}
	for _, m := range msgs {
		out[testenv.Header(m, outbox.HeaderEventID)]++
	}
	return out
}

// consumeAll waits until cons has read every record that the partitions of
// topic hold (up to their high-water marks, testenv.RecordCount) and
// returns what it read. Call it once nothing publishes to topic any more
// (the relays stopped, or drained by RunOnce): a late duplicate is then
// counted, not missed.
func consumeAll(t *testing.T, cons *testenv.Consumer, brokers []string, topic string) []*sarama.ConsumerMessage {
	t.Helper()
	return cons.WaitFor(testenv.RecordCount(t, brokers, topic), 30*time.Second)
}

// A cursor relay's worker keeps the lanes it delivers on between batches
// and writes their positions only every keepSaveEvery (here: never, before
// it stops). What a crash repeats is exactly what the rows did not hold:
// killed, its connection's locks go, and the lanes' next holder (here the
// relay itself, on a new connection) sends those events again, each key in
// order; nothing is lost. At Stop the kept positions are written, and a
// new relay sends nothing again.
func TestCursorKeptLanesCrashRepeatsOnlyWhatRowsDoNotHold(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	s.cursor(t)
	brokers := s.kafka(t)
	topic := testenv.Topic(t, brokers, 4)
	cons := testenv.Consume(t, brokers, topic)
	const total = 40
	r := s.relay(t, s.publisher(t), relay.Config{Progress: relay.ProgressCursor, PollInterval: 20 * time.Millisecond})
	relay.SetKeepSaveEvery(r, time.Hour)
	if err := r.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = r.Stop(context.Background())
		}
	})
	s.write(t, topic, total, 8)
	cons.WaitForDistinct(total, 30*time.Second)
	// The rows of the lanes were not written: they hold none of the events.
	if n := s.waiting(t); n != total {
		t.Fatalf("the lanes' rows hold %d of %d delivered events before any write was due; want 0 (kept lanes are written every keepSaveEvery)", total-n, total)
	}
	if n := s.killKeepers(t); n == 0 {
		t.Fatal("no connection holds the table's lanes: the relay's worker does not keep them")
	}
	// Each event again, once, from the rows' positions.
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		n := len(cons.Messages())
		return n >= 2*total, fmt.Sprintf("%d messages, want %d (each event again after the crash)", n, 2*total)
	})
	// Stop writes the kept positions (see below); once it returned the relay
	// sends nothing more, and every record it sent is read: a third copy
	// of an event too.
	if err := r.Stop(s.ctx); err != nil {
		t.Fatal(err)
	}
	stopped = true
	msgs := consumeAll(t, cons, brokers, topic)
	distinct, dups := checkOrder(t, msgs)
	if distinct != total || dups != total {
		t.Errorf("got %d distinct events and %d duplicates; want %d and %d (each event once more)", distinct, dups, total, total)
	}
	for id, n := range countByID(msgs) {
		if n != 2 {
			t.Errorf("event %s delivered %d times, want 2", id, n)
		}
	}
	// The second copies keep each key's order too.
	checkOrder(t, msgs[len(msgs)-total:])
	// Stop wrote the kept positions: a new relay sends nothing again.
	if n := s.waiting(t); n != 0 {
		t.Fatalf("after Stop the lanes' rows leave %d events to deliver, want 0", n)
	}
	r2 := s.relay(t, s.publisher(t), relay.Config{Progress: relay.ProgressCursor})
	drain(t, r2) // RunOnce returns after the broker acknowledged what it sent
	if n := len(consumeAll(t, cons, brokers, topic)); n != 2*total {
		t.Errorf("%d messages after a new relay's claims, want %d: the positions written at Stop hold every event", n, 2*total)
	}
}

// A running cursor relay writes the positions of the lanes it keeps within
// keepSaveEvery of delivering, also when it then has nothing to do, and
// lets the lanes go: the rows hold every event, and another relay can lock
// the lanes.
func TestCursorKeptLanesAreWrittenWhileIdle(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	topic, cons := s.cursorTopic(t, 4)
	const lanes = 16
	r := s.relay(t, s.publisher(t), relay.Config{Progress: relay.ProgressCursor, PollInterval: 50 * time.Millisecond, Lanes: lanes})
	if err := r.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop(context.Background()) })
	s.write(t, topic, 30, 6)
	cons.WaitForDistinct(30, 30*time.Second)
	s.keptLanesWrittenAndFree(t, lanes)
}

// keptLanesWrittenAndFree waits until a running relay that has nothing to
// deliver wrote the positions of the lanes it kept (their rows leave no
// delivered event to deliver) and let all lanes of lanes go.
func (s *setup) keptLanesWrittenAndFree(t *testing.T, lanes int) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		n := s.waiting(t)
		return n == 0, fmt.Sprintf("the lanes' rows leave %d delivered events to deliver while the relay runs", n)
	})
	ns := locks.Namespace(s.table.String())
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		var free int
		err := s.pool.QueryRow(s.ctx, "SELECT count(*) FILTER (WHERE pg_try_advisory_xact_lock($1, l)) FROM generate_series(0, $2 - 1) l", ns, lanes).Scan(&free)
		return err == nil && free == lanes, fmt.Sprintf("%d of %d lanes free (%v) once the relay has nothing to deliver", free, lanes, err)
	})
}

// A worker that keeps lanes reads them without Find while they have events
// to send (here: Find only when they have none). Those claims keep every
// guarantee of a claim through Find: each event once, each key in order,
// and the late rows of a transaction that was open while its kept lane's
// windows opened and closed are delivered after it commits.
func TestCursorKeptLanesClaimWithoutFind(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	topic, cons := s.cursorTopic(t, 4)
	// Two lanes and twenty keys: after the first events both lanes are
	// kept, so every later key is in a kept lane.
	r := s.relay(t, s.publisher(t), relay.Config{Progress: relay.ProgressCursor, PollInterval: 20 * time.Millisecond, Lanes: 2})
	relay.SetKeepSaveEvery(r, time.Hour)
	relay.SetKeepFind(r, time.Hour)
	if err := r.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Stop(s.ctx) }()
	s.writeRange(t, topic, 0, 100, 20)
	cons.WaitForDistinct(100, 30*time.Second)

	// A transaction opens and writes first (its rows have lower ids than
	// the next ones) and stays open while the kept lanes deliver on.
	long, err := s.pool.Begin(s.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = long.Rollback(s.ctx) }()
	for i := range 3 {
		if err := s.uow.AddTx(s.ctx, long, outbox.Event{AggregateType: "order", AggregateID: "slow", Type: "order.updated.v1",
			Topic: topic, Payload: map[string]int{"seq": i}}); err != nil {
			t.Fatal(err)
		}
	}
	before := relay.KeptClaims(r)
	s.writeRange(t, topic, 100, 300, 20)
	cons.WaitForDistinct(300, 30*time.Second)
	if relay.KeptClaims(r) == before {
		t.Fatal("no claim read the kept lanes without Find while they had events to send")
	}
	for _, m := range cons.Messages() {
		if string(m.Key) == "slow" {
			t.Fatal("an event of the open transaction was delivered before it committed")
		}
	}
	if err := long.Commit(s.ctx); err != nil {
		t.Fatal(err)
	}
	s.writeRange(t, topic, 300, 400, 20)
	cons.WaitForDistinct(403, 30*time.Second)
	time.Sleep(200 * time.Millisecond)
	distinct, dups := checkOrder(t, cons.Messages())
	if distinct != 403 || dups != 0 {
		t.Errorf("got %d distinct events and %d duplicates, want 403 and 0", distinct, dups)
	}
	s.noRowUpdated(t)
}

// A worker that keeps every lane has no lane for Find to find: its claims
// read the kept lanes alone however long ago Find ran (here it would be
// due at every claim), each event once and each key in order; idle, it
// writes their positions and lets them go.
func TestCursorKeptEveryLaneClaimsWithoutFind(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	topic, cons := s.cursorTopic(t, 4)
	const lanes = 2
	r := s.relay(t, s.publisher(t), relay.Config{Progress: relay.ProgressCursor, PollInterval: 20 * time.Millisecond, Lanes: lanes})
	relay.SetKeepFind(r, time.Nanosecond)
	if err := r.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop(context.Background()) })
	s.writeRange(t, topic, 0, 100, 20) // twenty keys: both lanes are kept after the first events
	cons.WaitForDistinct(100, 30*time.Second)
	before := relay.KeptClaims(r)
	s.writeRange(t, topic, 100, 300, 20)
	cons.WaitForDistinct(300, 30*time.Second)
	if relay.KeptClaims(r) == before {
		t.Fatal("no claim read the lanes without Find while the worker kept every lane")
	}
	time.Sleep(100 * time.Millisecond)
	if distinct, dups := checkOrder(t, cons.Messages()); distinct != 300 || dups != 0 {
		t.Errorf("got %d distinct events and %d duplicates, want 300 and 0", distinct, dups)
	}
	s.keptLanesWrittenAndFree(t, lanes)
	s.noRowUpdated(t)
}

// A worker that keeps every lane (here the one lane) and reads only events
// held back behind a key's failure returns without Find: the failed key's
// events go once its retry is due, in order, and the other key's flow
// meanwhile, each once.
func TestCursorKeptEveryLaneHeldKeyGoesOnInOrder(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	topic, cons := s.cursorTopic(t, 4)
	pub := &flakyPublisher{pub: s.publisher(t), flaky: "flaky", failures: 3}
	r := s.relay(t, pub, relay.Config{Progress: relay.ProgressCursor, PollInterval: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, Lanes: 1})
	relay.SetKeepFind(r, time.Nanosecond)
	if err := r.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop(context.Background()) })
	for i := range 5 {
		s.addEvent(t, "flaky", topic, i)
		s.addEvent(t, "ok", topic, i)
	}
	msgs := cons.WaitForDistinct(10, 30*time.Second)
	pub.mu.Lock()
	if pub.failures != 0 {
		t.Errorf("test bug: %d of the flaky key's failures were not used", pub.failures)
	}
	pub.mu.Unlock()
	seqs := seqsByKey(msgs)
	for _, k := range []string{"flaky", "ok"} {
		if fmt.Sprint(seqs[k]) != "[0 1 2 3 4]" {
			t.Errorf("key %s arrived as %v, want [0 1 2 3 4]", k, seqs[k])
		}
	}
	s.noRowUpdated(t)
}

// A worker draining a backlog keeps the lanes it read: its batches of
// MaxBatchSize write the positions each time and read the lanes that are
// behind first, but a lane is let go only when no batch took it for the
// write interval, not at each of those writes (where the lanes ahead would
// be let go and found again batch after batch).
func TestCursorKeptLanesStayKeptThroughADrain(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	topic, cons := s.cursorTopic(t, 4)
	s.write(t, topic, 1500, 50) // the backlog, before the relay starts
	r := s.relay(t, s.publisher(t), relay.Config{Progress: relay.ProgressCursor, PollInterval: 20 * time.Millisecond,
		Lanes: 8, BatchSize: 40, MaxBatchSize: 40})
	relay.SetKeepSaveEvery(r, time.Hour)
	if err := r.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop(context.Background()) })
	cons.WaitForDistinct(1500, 60*time.Second)
	if n := relay.KeptFreed(r); n != 0 {
		t.Errorf("the worker let go of kept lanes %d times while it drained the backlog; want none", n)
	}
	time.Sleep(100 * time.Millisecond)
	if distinct, dups := checkOrder(t, cons.Messages()); distinct != 1500 || dups != 0 {
		t.Errorf("got %d distinct events and %d duplicates, want 1500 and 0", distinct, dups)
	}
	s.noRowUpdated(t)
}

// A row that cannot be read in a kept lane, met by a claim without Find
// (one statement for the kept lanes' positions and rows): the claim reads
// the lanes again the general way, the row is parked, and the lane goes on
// past it.
func TestCursorKeptLanesParkAnUnreadableRow(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	topic, cons := s.cursorTopic(t, 4)
	r := s.relay(t, s.publisher(t), relay.Config{Progress: relay.ProgressCursor, PollInterval: 20 * time.Millisecond, Lanes: 2})
	relay.SetKeepSaveEvery(r, time.Hour)
	relay.SetKeepFind(r, time.Hour)
	if err := r.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Stop(s.ctx) }()
	s.write(t, topic, 40, 10)
	cons.WaitForDistinct(40, 30*time.Second)

	before := relay.KeptClaims(r)
	// Both lanes are kept now: kbad's is one of them.
	bad := s.insertUnreadable(t, topic, "kbad")
	after := s.insertRaw(t, topic, "kbad", []byte(`{"after":true}`))
	s.write(t, topic, 40, 10)
	cons.WaitForDistinct(81, unreadableWait)
	waitUntil(t, unreadableWait, "the unreadable row parked", func() bool {
		_, parked := s.parked(t, bad)
		return parked
	})
	if relay.KeptClaims(r) == before {
		t.Error("no claim read the kept lanes without Find")
	}
	got := map[string]int{}
	for _, m := range cons.Messages() {
		got[testenv.Header(m, outbox.HeaderEventID)]++
	}
	if got[bad.String()] != 0 || got[after.String()] != 1 {
		t.Errorf("the unreadable row reached Kafka %d times (want 0: parked), its key's later event %d times (want 1)", got[bad.String()], got[after.String()])
	}
	if relay.KeptUnreadable(r) == 0 {
		t.Error("no claim without Find met the unreadable row")
	}
	dups := 0
	for _, n := range got {
		dups += n - 1
	}
	if len(got) != 81 || dups != 0 {
		t.Errorf("got %d distinct events and %d duplicates, want 81 and 0", len(got), dups)
	}
}

// A worker that keeps its lanes keeps its connection too, and sets the
// batches' settings (no parallel plans, no JIT, no sequential scans,
// generic plans, the commit's durability, the bound on an idle
// transaction) once for its session: its batches send no statement for
// them, where every batch on a pooled connection sends one. A claim that
// reads the kept lanes without Find does so before the batch's
// transaction begins (a batch with nothing to write sends that one
// statement).
func TestCursorKeptConnectionSettingsAndReads(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	s.cursor(t)
	tr := &sqlRecorder{}
	pool := s.tracedPool(t, tr)
	var sent atomic.Int64
	pub := relay.PublisherFunc(func(_ context.Context, msgs []relay.Message) error { sent.Add(int64(len(msgs))); return nil })
	r, err := relay.New(pool, pub, &relay.Config{Table: s.table, Progress: relay.ProgressCursor, PollInterval: 10 * time.Millisecond, Lanes: 2, Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	relay.SetKeepFind(r, time.Hour)
	if err := r.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 30 {
		s.write(t, "settings.topic", 1, 5)
		waitUntil(t, 10*time.Second, fmt.Sprintf("event %d to be sent", i+1), func() bool { return sent.Load() == int64(i+1) })
	}
	if err := r.Stop(s.ctx); err != nil {
		t.Fatal(err)
	}
	if relay.KeptClaims(r) == 0 {
		t.Fatal("no claim read kept lanes: the test did not run batches on a kept connection")
	}
	const session, local = "'force_generic_plan', false)", "'force_generic_plan', true)"
	// The table statistics reporter's connection sets them for its
	// session too; the worker's is the one that claims.
	var kept []*pgx.Conn
	for _, c := range tr.connsThatRan(session) {
		if tr.count(c, "pg_current_snapshot() AS now") > 0 {
			kept = append(kept, c)
		}
	}
	if len(kept) != 1 {
		t.Fatalf("%d connections that claim set the batches' settings for their session, want the worker's 1", len(kept))
	}
	if n := tr.count(kept[0], local); n > 0 {
		t.Errorf("the kept connection set the settings for a transaction %d times after it set them for its session", n)
	}
	if n := tr.count(kept[0], "pg_current_snapshot() AS now"); n < 5 {
		t.Errorf("the kept connection ran %d claims, want the batches' (30 events, one at a time)", n)
	}
	// Kept's own CTE (Load has none such). A claim that ran Find reads
	// in Find's transaction.
	outside, _ := tr.inTransaction(kept[0], "f AS MATERIALIZED")
	if claims := relay.KeptClaims(r); outside < int(claims) {
		t.Errorf("the kept lanes were read %d times outside a transaction, want at least %d (the claims that read them without Find)", outside, claims)
	}
}
