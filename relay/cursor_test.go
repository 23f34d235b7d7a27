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
	"github.com/fxoutbox/outbox/migrations"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// drain runs r's batches until one publishes nothing.
func drain(t *testing.T, r *relay.Relay) {
	t.Helper()
	for {
		n, err := r.RunOnce(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
	}
}

// cursor applies the cursor migration to the setup's table.
func (s *setup) cursor(t testing.TB) {
	t.Helper()
	if err := migrations.Cursor.Up(s.ctx, s.pool, s.table); err != nil {
		t.Fatal(err)
	}
}

// noRowUpdated fails the test when a row of the table was written after its
// INSERT: its xmin is no longer the writing transaction's id, or it is
// marked published.
func (s *setup) noRowUpdated(t *testing.T) {
	t.Helper()
	var rows, updated int
	err := s.pool.QueryRow(s.ctx, "SELECT count(*), count(*) FILTER (WHERE xmin <> xid(txid) OR published_at IS NOT NULL) FROM "+sqlname.Ident(s.table)+" WHERE parked_at IS NULL").Scan(&rows, &updated)
	if err != nil {
		t.Fatal(err)
	}
	if updated > 0 {
		t.Errorf("%d of %d rows were written after their INSERT: cursor progress must not touch delivered rows", updated, rows)
	}
}

// cursorTopic makes s's table a cursor table and returns a topic of
// partitions partitions on the test's broker, and a consumer of it.
func (s *setup) cursorTopic(t *testing.T, partitions int32) (string, *testenv.Consumer) {
	t.Helper()
	s.cursor(t)
	brokers := s.kafka(t)
	topic := testenv.Topic(t, brokers, partitions)
	return topic, testenv.Consume(t, brokers, topic)
}

// checkOrder fails the test when a key's events (payload seq 0, 1, ...)
// first arrived out of order, and returns the number of duplicates.
func checkOrder(t *testing.T, msgs []*sarama.ConsumerMessage) (distinct, dups int) {
	t.Helper()
	seen := map[string]bool{}
	last := map[string]int{}
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
		if l, ok := last[k]; ok && p.Seq <= l {
			t.Errorf("key %s: seq %d arrived after seq %d", k, p.Seq, l)
		}
		last[k] = p.Seq
	}
	return len(seen), dups
}

// A cursor relay delivers every event once, each key in order, in batches
// that cross many windows, and writes nothing to the rows: each row's xmin
// is still its INSERT's.
func TestCursorDeliversWithoutWritingRows(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	topic, cons := s.cursorTopic(t, 4)
	// Some events before the relay's first claim, some between its
	// batches, in transactions of several events.
	s.write(t, topic, 120, 7)
	r := s.relay(t, s.publisher(t), relay.Config{Progress: relay.ProgressCursor, BatchSize: 25, MaxBatchSize: 25})
	total := 120
	for round := range 6 {
		drain(t, r)
		err := s.uow.Do(s.ctx, func(ctx context.Context, tx unitofwork.Tx) error {
			for i := range 5 {
				if err := tx.Add(ctx, outbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("k%d", i), Type: "order.updated.v1",
					Topic: topic, Payload: map[string]int{"seq": 1000 + round*5 + i}}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		total += 5
	}
	drain(t, r)
	msgs := cons.WaitForDistinct(total, 30*time.Second)
	time.Sleep(200 * time.Millisecond)
	distinct, dups := checkOrder(t, cons.Messages())
	if distinct != total || dups != 0 {
		t.Errorf("got %d distinct events and %d duplicates (of %d messages), want %d and 0", distinct, dups, len(msgs), total)
	}
	s.noRowUpdated(t)
	// Nothing is left: another claim publishes nothing.
	if n, err := r.RunOnce(s.ctx); n != 0 || err != nil {
		t.Errorf("RunOnce after the drain: %d, %v; want 0, nil", n, err)
	}
}

// A transaction that stays open with events holds back only its own: the
// events committed meanwhile are delivered while it is open, and its own
// when it commits, none lost and none repeated.
func TestCursorOpenTransactionHoldsOnlyItsOwn(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	topic, cons := s.cursorTopic(t, 4)
	r := s.relay(t, s.publisher(t), relay.Config{Progress: relay.ProgressCursor, PollInterval: 20 * time.Millisecond})
	if err := r.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Stop(s.ctx) }()

	// The long transaction writes first, so its rows have the lowest ids.
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
	s.write(t, topic, 200, 10)
	cons.WaitForDistinct(200, 30*time.Second)
	for _, m := range cons.Messages() {
		if string(m.Key) == "slow" {
			t.Fatal("an event of the open transaction was delivered before it committed")
		}
	}
	if err := long.Commit(s.ctx); err != nil {
		t.Fatal(err)
	}
	s.writeRange(t, topic, 200, 250, 10) // more writes after the commit, on the same keys
	cons.WaitForDistinct(253, 30*time.Second)
	time.Sleep(200 * time.Millisecond)
	distinct, dups := checkOrder(t, cons.Messages())
	if distinct != 253 || dups != 0 {
		t.Errorf("got %d distinct events and %d duplicates, want 253 and 0", distinct, dups)
	}
	s.noRowUpdated(t)
}

// A rolled-back transaction's events are never sent, and leave no gap that
// stops a lane.
func TestCursorSkipsRolledBackEvents(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	topic, cons := s.cursorTopic(t, 2)
	r := s.relay(t, s.publisher(t), relay.Config{Progress: relay.ProgressCursor})
	boom := errors.New("boom")
	err := s.uow.Do(s.ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		if err := tx.Add(ctx, outbox.Event{AggregateType: "order", AggregateID: "k0", Type: "order.updated.v1", Topic: topic, Payload: map[string]int{"seq": 99}}); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatal(err)
	}
	s.write(t, topic, 10, 1)
	drain(t, r)
	cons.WaitForDistinct(10, 30*time.Second)
	time.Sleep(200 * time.Millisecond)
	if distinct, dups := checkOrder(t, cons.Messages()); distinct != 10 || dups != 0 {
		t.Errorf("got %d distinct events and %d duplicates, want 10 and 0", distinct, dups)
	}
}

// Four cursor relays, one replaced every few hundred milliseconds, while
// writers commit 20k events over 200 keys: nothing lost, each key in order,
// duplicates only around the kills, and no row written after its INSERT.
func TestCursorPerKeyOrderAcrossReplicasWithKills(t *testing.T) {
	t.Parallel()
	progressScenario(t, relay.ProgressCursor, relay.PerKey, relay.Poll, relay.AtLeastOnce, 4, 150*time.Millisecond, 250*time.Millisecond, 0)
}

// The same with 8 replicas and keys held back by transient failures: a
// lane stops before a failed event, the events of other keys past it go on
// (remembered in the lane's skip list) and are not sent twice.
func TestCursorPerKeyOrderWithHeldKeysAcrossEightReplicas(t *testing.T) {
	t.Parallel()
	progressScenario(t, relay.ProgressCursor, relay.PerKey, relay.Poll, relay.AtLeastOnce, 8, 500*time.Millisecond, 0, 150)
}

// An event whose topic does not exist is parked at once (it moves to the
// parked table), and the lane goes on past it.
func TestCursorParksPoisonAndGoesOn(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	topic, cons := s.cursorTopic(t, 2)
	pub := s.publisher(t)
	bad := relay.PublisherFunc(func(ctx context.Context, msgs []relay.Message) error {
		failed := map[int]error{}
		var good []relay.Message
		for i, m := range msgs {
			if m.Topic == "missing" {
				failed[i] = outbox.Permanent(fmt.Errorf("%s: %w", m.Topic, sarama.ErrUnknownTopicOrPartition))
				continue
			}
			good = append(good, m)
		}
		if err := pub.Publish(ctx, good); err != nil {
			return err
		}
		if len(failed) > 0 {
			return &relay.BatchError{Failed: failed}
		}
		return nil
	})
	r := s.relay(t, bad, relay.Config{Progress: relay.ProgressCursor})
	for i := range 10 {
		tp := topic
		if i == 3 {
			tp = "missing"
		}
		err := s.uow.Do(s.ctx, func(ctx context.Context, tx unitofwork.Tx) error {
			return tx.Add(ctx, outbox.Event{AggregateType: "order", AggregateID: "k", Type: "order.updated.v1", Topic: tp, Payload: map[string]int{"seq": i}})
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for range 5 {
		if _, err := r.RunOnce(s.ctx); err != nil {
			t.Fatal(err)
		}
	}
	cons.WaitForDistinct(9, 30*time.Second)
	var parked, inTable int
	if err := s.pool.QueryRow(s.ctx, "SELECT (SELECT count(*) FROM "+sqlname.Ident(sqlname.Parked(s.table))+" WHERE topic = 'missing'),"+
		" (SELECT count(*) FROM "+sqlname.Ident(s.table)+" WHERE topic = 'missing')").Scan(&parked, &inTable); err != nil {
		t.Fatal(err)
	}
	if parked != 1 || inTable != 0 {
		t.Errorf("%d events parked, %d left in the table; want 1 and 0", parked, inTable)
	}
}

// Cursor progress refuses what it cannot do yet, and a table without the
// cursor migration, saying what to do.
func TestCursorRefusals(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	for _, cfg := range []relay.Config{
		{Progress: relay.ProgressCursor, Ordering: relay.Unordered},
		{Progress: relay.Progress(7)},
	} {
		cfg.Table = s.table
		_, err := relay.New(s.pool, relay.PublisherFunc(func(context.Context, []relay.Message) error { return nil }), &cfg)
		var ce *outbox.ConfigError
		if !errors.As(err, &ce) || ce.Field != "Progress" {
			t.Errorf("%+v: got %v, want a ConfigError on Progress", cfg.Progress, err)
		}
	}
	r := s.relay(t, relay.PublisherFunc(func(context.Context, []relay.Message) error { return nil }), relay.Config{Progress: relay.ProgressCursor})
	err := r.Start(s.ctx)
	if !errors.Is(err, relay.ErrCursorNotReady) {
		t.Fatalf("Start without the cursor migration: %v, want ErrCursorNotReady", err)
	}
	t.Log(err)
}

// An operator works a cursor table as a marked one: the status counts the
// events the lanes have yet to deliver, a requeued parked event is written
// again behind the lanes' positions and delivered, and a replayed event is
// sent again. Lanes without events keep up with the others.
func TestCursorStatusRequeueReplay(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	topic, cons := s.cursorTopic(t, 2)
	var created atomic.Bool
	pub := s.publisher(t)
	wrapped := relay.PublisherFunc(func(ctx context.Context, msgs []relay.Message) error {
		failed := map[int]error{}
		var good []relay.Message
		for i, m := range msgs {
			if m.Topic == "late.topic" && !created.Load() {
				failed[i] = outbox.Permanent(fmt.Errorf("%s: %w", m.Topic, sarama.ErrUnknownTopicOrPartition))
				continue
			}
			if m.Topic == "late.topic" {
				m.Topic = topic // created: it goes where the test reads
			}
			good = append(good, m)
		}
		if err := pub.Publish(ctx, good); err != nil {
			return err
		}
		if len(failed) > 0 {
			return &relay.BatchError{Failed: failed}
		}
		return nil
	})
	// Two keys on 64 lanes: most lanes never see an event.
	r := s.relay(t, wrapped, relay.Config{Progress: relay.ProgressCursor})
	add := func(key, tp string, seq int) uuid.UUID {
		id := uuid.Must(uuid.NewV7())
		err := s.uow.Do(s.ctx, func(ctx context.Context, tx unitofwork.Tx) error {
			return tx.Add(ctx, outbox.Event{ID: id, AggregateType: "order", AggregateID: key, Type: "order.updated.v1", Topic: tp, Payload: map[string]int{"seq": seq}})
		})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	status := func() admin.Status {
		t.Helper()
		st, err := admin.ReadStatus(s.ctx, s.pool, s.table, nil)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	first := add("a", topic, 0)
	poison := add("b", "late.topic", 0)
	add("a", topic, 1)
	drain(t, r)
	if st := status(); st.Backlog != 0 || st.Parked != 1 {
		t.Errorf("after the drain: backlog %d, parked %d; want 0 and 1", st.Backlog, st.Parked)
	}
	for i := range 3 {
		add("b", topic, 1+i)
	}
	if st := status(); st.Backlog != 3 || st.OldestCreatedAt == nil {
		t.Errorf("3 events written: backlog %d, oldest %v; want 3 and a time", st.Backlog, st.OldestCreatedAt)
	}
	drain(t, r)
	if st := status(); st.Backlog != 0 {
		t.Errorf("after the second drain: backlog %d, want 0", st.Backlog)
	}
	created.Store(true)
	if n, err := admin.Requeue(s.ctx, s.pool, s.table, admin.Filter{EventIDs: []uuid.UUID{poison}}, nil); err != nil || n != 1 {
		t.Fatalf("Requeue: %d, %v; want 1", n, err)
	}
	if st := status(); st.Backlog != 1 || st.Parked != 0 {
		t.Errorf("after the requeue: backlog %d, parked %d; want 1 and 0", st.Backlog, st.Parked)
	}
	drain(t, r)
	// Past the idle lanes' next sweep, the first event is in every
	// lane's done snapshot: it can be replayed.
	time.Sleep(1100 * time.Millisecond)
	drain(t, r)
	if n, err := admin.Replay(s.ctx, s.pool, s.table, admin.Filter{EventIDs: []uuid.UUID{first}}, nil); err != nil || n != 1 {
		t.Fatalf("Replay: %d, %v; want 1", n, err)
	}
	drain(t, r)
	msgs := cons.WaitForDistinct(6, 30*time.Second)
	waitUntil(t, 30*time.Second, "the replayed event", func() bool {
		n := 0
		for _, m := range cons.Messages() {
			if testenv.Header(m, outbox.HeaderEventID) == first.String() {
				n++
			}
		}
		return n == 2
	})
	ids := map[string]int{}
	for _, m := range cons.Messages() {
		ids[testenv.Header(m, outbox.HeaderEventID)]++
	}
	if ids[poison.String()] != 1 || len(ids) != 6 {
		t.Errorf("got %v (%d messages); want the requeued event once and 6 events", ids, len(msgs))
	}
	var lagging int
	if err := s.pool.QueryRow(s.ctx, "SELECT count(*) FROM "+sqlname.Ident(sqlname.Cursor(s.table))+" WHERE NOT pg_visible_in_snapshot((SELECT txid FROM "+sqlname.Ident(s.table)+
		" WHERE event_id = $1), done)", poison).Scan(&lagging); err != nil {
		t.Fatal(err)
	}
	if lagging != 0 {
		rows, _ := s.pool.Query(s.ctx, "SELECT lane, done::text, coalesce(upto::text,''), base, pos, updated_at::text, (SELECT txid::text FROM "+sqlname.Ident(s.table)+" WHERE event_id = $1) FROM "+sqlname.Ident(sqlname.Cursor(s.table))+" ORDER BY lane LIMIT 5", poison)
		for rows.Next() {
			var l int
			var d, u, ua, tx string
			var b, p int64
			_ = rows.Scan(&l, &d, &u, &b, &p, &ua, &tx)
			t.Log(l, d, u, b, p, ua, tx)
		}
		rows.Close()
		t.Errorf("%d lanes' done snapshots lag behind the last write: idle lanes must keep up", lagging)
	}
}

// A row whose payload PostgreSQL cannot print is parked with what
// PostgreSQL said, and its lane goes on: its key's later event and the
// other keys' events are delivered.
func TestCursorUnreadableRowIsParked(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	topic, cons := s.cursorTopic(t, 4)
	s.write(t, topic, 20, 5)
	bad := s.insertUnreadable(t, topic, "kbad")
	after := s.insertRaw(t, topic, "kbad", []byte(`{"after":true}`))
	s.write(t, topic, 20, 5)
	r := s.relay(t, s.publisher(t), relay.Config{Progress: relay.ProgressCursor, PollInterval: 50 * time.Millisecond})
	if err := r.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Stop(s.ctx) }()
	cons.WaitForDistinct(41, unreadableWait)
	waitUntil(t, unreadableWait, "the unreadable row parked", func() bool {
		_, parked := s.parked(t, bad)
		return parked
	})
	p, _ := s.parked(t, bad)
	if p.attempts != 1 || !strings.Contains(p.reason, "SQLSTATE 54000") || p.key != "kbad" || p.evType != "a.raw" {
		t.Errorf("unreadable row: parked %+v; want it once, its reason naming SQLSTATE 54000, its columns copied", p)
	}
	if _, ok := s.inTable(t, bad); ok {
		t.Errorf("the unreadable row was parked, yet is still in the table")
	}
	// Its copy keeps the payload as stored (copied by the server, never
	// printed): fixed there, a requeue sends it.
	if _, err := s.pool.Exec(s.ctx, "UPDATE "+sqlname.Ident(sqlname.Parked(s.table))+" SET payload = '{\"fixed\":true}' WHERE event_id = $1 AND payload IS NOT NULL", bad); err != nil {
		t.Fatal(err)
	}
	if n, err := admin.Requeue(s.ctx, s.pool, s.table, admin.Filter{EventIDs: []uuid.UUID{bad}}, nil); err != nil || n != 1 {
		t.Fatalf("Requeue of the fixed row: %d, %v", n, err)
	}
	waitUntil(t, 60*time.Second, "the fixed row delivered", func() bool {
		for _, m := range cons.Messages() {
			if testenv.Header(m, outbox.HeaderEventID) == bad.String() {
				return true
			}
		}
		return false
	})
	got := map[string]int{}
	for _, m := range cons.Messages() {
		got[testenv.Header(m, outbox.HeaderEventID)]++
		if testenv.Header(m, outbox.HeaderEventID) == bad.String() && string(m.Value) != `{"fixed": true}` {
			t.Errorf("the unreadable row reached Kafka as %q, not as fixed", m.Value)
		}
	}
	if got[bad.String()] != 1 || got[after.String()] == 0 {
		t.Errorf("the fixed row reached Kafka %d times (want once, after its requeue); its key's later event %d times", got[bad.String()], got[after.String()])
	}
}

// Positions ahead of the server's transaction ids (what a pg_dump and
// pg_restore into a new cluster leaves) stop the relay with
// ErrCursorCluster instead of taking new events for delivered ones.
func TestCursorNoticesAnotherCluster(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	s.cursor(t)
	brokers := s.kafka(t)
	topic := testenv.Topic(t, brokers, 1)
	s.write(t, topic, 3, 1)
	r := s.relay(t, s.publisher(t), relay.Config{Progress: relay.ProgressCursor})
	if _, err := r.RunOnce(s.ctx); err != nil {
		t.Fatal(err)
	}
	// As restored elsewhere: the new cluster's ids are far behind.
	if _, err := s.pool.Exec(s.ctx, "UPDATE "+sqlname.Ident(sqlname.Cursor(s.table))+" SET done = '4000000000:4000000000:'"); err != nil {
		t.Fatal(err)
	}
	fresh := s.relay(t, s.publisher(t), relay.Config{Progress: relay.ProgressCursor})
	if err := fresh.Start(s.ctx); !errors.Is(err, relay.ErrCursorCluster) {
		t.Fatalf("Start on positions from another cluster: %v, want ErrCursorCluster", err)
	} else {
		t.Log(err)
	}
	if _, err := fresh.RunOnce(s.ctx); !errors.Is(err, relay.ErrCursorCluster) {
		t.Fatalf("RunOnce on positions from another cluster: %v, want ErrCursorCluster", err)
	}
	// A relay with marks progress refuses the table: it would send again
	// what the cursor delivered.
	marks := s.relay(t, s.publisher(t), relay.Config{Progress: relay.ProgressMarks})
	if err := marks.Start(s.ctx); !errors.Is(err, relay.ErrCursorTable) {
		t.Fatalf("Start with marks on a cursor table: %v, want ErrCursorTable", err)
	}
}

// A cursor table restored into a cluster whose transaction ids are behind
// the old ones (simulated: the rows' txids and the positions' snapshots are
// moved 4e9 ahead) stops the relay; admin.RebaseCursor carries it over, and
// the relay then delivers the rows the old cluster had not delivered and
// those written in the new one, each once, and nothing delivered again.
func TestCursorRebaseAfterRestore(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	topic, cons := s.cursorTopic(t, 2)
	r := s.relay(t, s.publisher(t), relay.Config{Progress: relay.ProgressCursor})
	write := func(from, to int) { t.Helper(); s.writeRange(t, topic, from, to, 5) }
	write(0, 10)
	drain(t, r)
	cons.WaitForDistinct(10, 30*time.Second)
	write(10, 15) // not delivered when the dump is taken
	const shift = "4000000000"
	move := func(snap string) string {
		return "((pg_snapshot_xmin(" + snap + ")::text::bigint + " + shift + ")::text || ':' || (pg_snapshot_xmax(" + snap + ")::text::bigint + " + shift + ")::text || ':' ||" +
			" coalesce((SELECT string_agg((x::text::bigint + " + shift + ")::text, ',') FROM pg_snapshot_xip(" + snap + ") x), ''))::pg_snapshot"
	}
	for _, sql := range []string{
		"UPDATE " + sqlname.Ident(s.table) + " SET txid = (txid::text::bigint + " + shift + ")::text::xid8",
		"UPDATE " + sqlname.Ident(sqlname.Cursor(s.table)) + " SET done = " + move("done") + ", upto = CASE WHEN upto IS NOT NULL THEN " + move("upto") + " END",
	} {
		if _, err := s.pool.Exec(s.ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	write(15, 18) // written in the new cluster
	fresh := s.relay(t, s.publisher(t), relay.Config{Progress: relay.ProgressCursor})
	if err := fresh.Start(s.ctx); !errors.Is(err, relay.ErrCursorCluster) {
		t.Fatalf("Start after the restore: %v, want ErrCursorCluster", err)
	}
	got, err := admin.RebaseCursor(s.ctx, s.pool, s.table)
	if err != nil {
		t.Fatal(err)
	}
	if got.Marked != 10 || got.Rewritten != 5 {
		t.Errorf("RebaseCursor = %+v, want 10 marked and 5 rewritten", got)
	}
	after := s.relay(t, s.publisher(t), relay.Config{Progress: relay.ProgressCursor})
	drain(t, after)
	cons.WaitForDistinct(18, 30*time.Second)
	time.Sleep(200 * time.Millisecond)
	if distinct, dups := checkOrder(t, cons.Messages()); distinct != 18 || dups != 0 {
		t.Errorf("got %d distinct events and %d duplicates, want 18 and 0", distinct, dups)
	}
}

// Exactly once with cursor progress: 8 replicas, one killed every 500ms; a
// lane's position travels in the progress record of each Kafka
// transaction, and whoever takes the lane over writes it to the positions
// table. A read_committed consumer gets every event once, in order, and no
// row is written after its INSERT.
func TestCursorExactlyOnceAcrossEightReplicasWithKills(t *testing.T) {
	t.Parallel()
	progressScenario(t, relay.ProgressCursor, relay.PerKey, relay.Poll, relay.ExactlyOnce, 8, 500*time.Millisecond, 0, 0)
}
