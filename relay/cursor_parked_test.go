package relay_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/admin"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// parkedCopy is a row of the parked table (cursor mode).
type parkedCopy struct {
	id                 int64
	reason, lastError  string
	attempts           int
	firstTry, lastTry  *time.Time
	topic, key, evType string
	hasSeq             bool // the payload has the key "seq" (read without printing it)
}

// parked reads event id's row in the parked table; ok is false when it has
// none.
func (s *setup) parked(t testing.TB, id uuid.UUID) (p parkedCopy, ok bool) {
	t.Helper()
	err := s.pool.QueryRow(s.ctx, "SELECT id, reason, coalesce(last_error, ''), attempts, first_try_at, last_try_at, coalesce(topic, ''), coalesce(partition_key, ''),"+
		" coalesce(event_type, ''), coalesce(payload ? 'seq', false) FROM "+sqlname.Ident(sqlname.Parked(s.table))+" WHERE event_id = $1", id).
		Scan(&p.id, &p.reason, &p.lastError, &p.attempts, &p.firstTry, &p.lastTry, &p.topic, &p.key, &p.evType, &p.hasSeq)
	if errors.Is(err, pgx.ErrNoRows) {
		return p, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return p, true
}

// inTable reports whether the outbox table holds event id, and its row id.
func (s *setup) inTable(t testing.TB, id uuid.UUID) (int64, bool) {
	t.Helper()
	var rowID int64
	err := s.pool.QueryRow(s.ctx, "SELECT id FROM "+sqlname.Ident(s.table)+" WHERE event_id = $1", id).Scan(&rowID)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return rowID, true
}

// addEvent writes one event through the unit of work.
func (s *setup) addEvent(t testing.TB, key, topic string, seq int) uuid.UUID {
	t.Helper()
	id := uuid.Must(uuid.NewV7())
	err := s.uow.Do(s.ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		return tx.Add(ctx, outbox.Event{ID: id, AggregateType: "order", AggregateID: key, Type: "order.updated.v1", Topic: topic, Payload: map[string]int{"seq": seq}})
	})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// failingTopics wraps pub: events for the topic "missing" fail as a topic
// that does not exist until fixed is set, then go to the topic real; events
// for "refused" always fail permanently (a cause that retries may cure,
// charged MaxAttempts times). As a publisher must, it holds (relay.ErrHeld)
// the later events of a key that failed in the call.
func failingTopics(pub relay.Publisher, real string, fixed *atomic.Bool) relay.Publisher {
	return relay.PublisherFunc(func(ctx context.Context, msgs []relay.Message) error {
		failed := map[int]error{}
		blocked := map[string]bool{}
		var good []relay.Message
		for i, m := range msgs {
			switch {
			case blocked[string(m.Key)]:
				failed[i] = relay.ErrHeld
				continue
			case m.Topic == "missing" && !fixed.Load():
				failed[i] = outbox.Permanent(fmt.Errorf("%s: %w", m.Topic, sarama.ErrUnknownTopicOrPartition))
				blocked[string(m.Key)] = true
				continue
			case m.Topic == "missing":
				m.Topic = real
			case m.Topic == "refused":
				failed[i] = outbox.Permanent(errors.New("refused by policy"))
				blocked[string(m.Key)] = true
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
}

// runUntil runs r's batches until cond holds.
func runUntil(t *testing.T, r *relay.Relay, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		if cond() {
			return true, ""
		}
		if _, err := r.RunOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
		return false, what + ": not yet, after another batch"
	})
}

// Under cursor progress a poison event moves: its row leaves the table and
// a copy with its reason, attempts, tries and last error is in the parked
// table, written in the batch that moves its lane on. An event whose topic
// does not exist is parked at once; one refused MaxAttempts times after
// its third try. Among the events of other keys, and of its own, nothing
// stalls: every other event is delivered once.
func TestCursorParkMovesTheRow(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	topic, cons := s.cursorTopic(t, 4)
	var fixed atomic.Bool
	r := s.relay(t, failingTopics(s.publisher(t), topic, &fixed), relay.Config{Progress: relay.ProgressCursor, MaxAttempts: 3, PollInterval: 20 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	var missing, refused uuid.UUID
	good := 0
	for i := range 60 {
		switch i {
		case 17:
			missing = s.addEvent(t, "k1", "missing", i)
		case 31:
			refused = s.addEvent(t, "k2", "refused", i)
		default:
			s.addEvent(t, fmt.Sprintf("k%d", i%6), topic, i)
			good++
		}
	}
	runUntil(t, r, "both poison events parked", func() bool {
		_, a := s.parked(t, missing)
		_, b := s.parked(t, refused)
		return a && b
	})
	drain(t, r)
	msgs := cons.WaitForDistinct(good, 30*time.Second)
	time.Sleep(200 * time.Millisecond)
	if distinct, dups := checkOrder(t, cons.Messages()); distinct != good || dups != 0 {
		t.Errorf("got %d distinct events and %d duplicates (of %d messages), want %d and 0", distinct, dups, len(msgs), good)
	}
	for _, c := range []struct {
		id             uuid.UUID
		attempts       int
		topic, key     string
		reason, errMsg string
	}{
		{missing, 1, "missing", "k1", "[kafka.unknown_topic_or_partition] topic \"missing\" does not exist", "does not exist on this broker"},
		{refused, 3, "refused", "k2", "refused by policy", "refused by policy"},
	} {
		if _, ok := s.inTable(t, c.id); ok {
			t.Errorf("%s: parked, yet still in the outbox table", c.topic)
		}
		p, _ := s.parked(t, c.id)
		if p.attempts != c.attempts || !strings.Contains(p.reason, c.reason) || !strings.Contains(p.lastError, c.errMsg) {
			t.Errorf("%s: parked with attempts %d, reason %q, last error %q; want %d, a reason with %q, an error with %q",
				c.topic, p.attempts, p.reason, p.lastError, c.attempts, c.reason, c.errMsg)
		}
		if p.topic != c.topic || p.key != c.key || p.evType != "order.updated.v1" || !p.hasSeq {
			t.Errorf("%s: the parked copy is not the event: topic %q, key %q, type %q, payload with seq %v", c.topic, p.topic, p.key, p.evType, p.hasSeq)
		}
		if p.firstTry == nil || p.lastTry == nil || p.lastTry.Before(*p.firstTry) || (c.attempts > 1 && !p.lastTry.After(*p.firstTry)) {
			t.Errorf("%s: first try %v, last try %v; want both, the last after the first when tried more than once", c.topic, p.firstTry, p.lastTry)
		}
	}
	s.noRowUpdated(t)
	st, err := admin.ReadStatus(s.ctx, s.pool, s.table, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st.Backlog != 0 || st.Parked != 2 || len(st.ParkedGroups) != 2 {
		t.Errorf("status: backlog %d, parked %d in %d groups; want 0, 2 in 2", st.Backlog, st.Parked, len(st.ParkedGroups))
	}
}

// Under Hold nothing moves: a poison event stays in its row, charged, and
// stops only its own lane; the events of the other lanes are delivered.
func TestCursorHoldStopsOnlyItsLane(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	topic, cons := s.cursorTopic(t, 4)
	var fixed atomic.Bool
	const lanes = 8
	r := s.relay(t, failingTopics(s.publisher(t), topic, &fixed), relay.Config{Progress: relay.ProgressCursor, Poison: outbox.Hold, Lanes: lanes, PollInterval: 20 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	poison := s.addEvent(t, "held", "missing", 0)
	var behind []uuid.UUID
	for i := range 3 {
		behind = append(behind, s.addEvent(t, "held", topic, 1+i))
	}
	// Keys of the other lanes (the relay's lane function).
	var others int
	for i := 0; others < 40; i++ {
		key := fmt.Sprintf("o%d", i)
		if laneOf(t, s, key, lanes) == laneOf(t, s, "held", lanes) {
			continue
		}
		s.addEvent(t, key, topic, i)
		others++
	}
	runUntil(t, r, "the other lanes' events delivered", func() bool { return distinctIDs(cons) >= others })
	for range 20 {
		if _, err := r.RunOnce(s.ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	got := map[string]bool{}
	for _, m := range cons.Messages() {
		got[testenv.Header(m, outbox.HeaderEventID)] = true
	}
	for _, id := range append([]uuid.UUID{poison}, behind...) {
		if got[id.String()] {
			t.Errorf("event %s of the held key was delivered past the held poison event", id)
		}
	}
	if len(got) != others {
		t.Errorf("%d events delivered, want the %d of the other lanes", len(got), others)
	}
	if _, ok := s.parked(t, poison); ok {
		t.Errorf("under Hold the poison event moved to the parked table")
	}
	_, parkedInRow, attempts, _ := s.row(t, poison)
	if parkedInRow || attempts == 0 {
		t.Errorf("held poison event: parked %v, attempts %d; want it waiting, charged", parkedInRow, attempts)
	}
	// Fixed: the lane goes on, in order.
	fixed.Store(true)
	runUntil(t, r, "the held key's events delivered", func() bool { return distinctIDs(cons) == others+4 })
	if _, dups := checkOrder(t, cons.Messages()); dups != 0 {
		t.Errorf("%d duplicates", dups)
	}
}

// distinctIDs is the number of distinct event ids cons received.
func distinctIDs(cons *testenv.Consumer) int {
	seen := map[string]bool{}
	for _, m := range cons.Messages() {
		seen[testenv.Header(m, outbox.HeaderEventID)] = true
	}
	return len(seen)
}

// laneOf is the relay's lane of key.
func laneOf(t *testing.T, s *setup, key string, lanes int) int {
	t.Helper()
	var l int
	if err := s.pool.QueryRow(s.ctx, "SELECT (hashtext($1) & 2147483647) % $2", key, lanes).Scan(&l); err != nil {
		t.Fatal(err)
	}
	return l
}

// An operator works the parked table: list and show name the parked
// events; a requeue writes one back into the table (a new row id, the same
// event id) and the relay delivers it once; a delete drops one for good;
// a replay by filter sends delivered events again.
func TestCursorParkedRequeueDeleteReplay(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	topic, cons := s.cursorTopic(t, 2)
	var fixed atomic.Bool
	r := s.relay(t, failingTopics(s.publisher(t), topic, &fixed), relay.Config{Progress: relay.ProgressCursor})
	first := s.addEvent(t, "a", topic, 0)
	requeued := s.addEvent(t, "b", "missing", 0)
	deleted := s.addEvent(t, "c", "missing", 0)
	s.addEvent(t, "a", topic, 1)
	runUntil(t, r, "two events parked", func() bool {
		_, a := s.parked(t, requeued)
		_, b := s.parked(t, deleted)
		return a && b
	})
	drain(t, r)
	old, _ := s.parked(t, requeued)

	list, err := admin.ListParked(s.ctx, s.pool, s.table, admin.Filter{Topic: "missing"})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].EventID != requeued || list[1].EventID != deleted {
		t.Fatalf("ListParked: %+v, want the two events for the missing topic in order", list)
	}
	if p := list[0]; p.Attempts != 1 || !strings.HasPrefix(p.Reason, "[kafka.unknown_topic_or_partition]") || p.FirstTryAt == nil || p.ParkedAt.IsZero() || p.Key != "b" {
		t.Errorf("ListParked's first event: %+v", p)
	}
	if n, err := admin.CountParked(s.ctx, s.pool, s.table, admin.Filter{Error: "does not exist"}); err != nil || n != 2 {
		t.Errorf("CountParked by the reason's text: %d, %v; want 2", n, err)
	}
	if n, err := admin.CountParked(s.ctx, s.pool, s.table, admin.Filter{Error: "does not exist on this broker"}); err != nil || n != 2 {
		t.Errorf("CountParked by the last error's text: %d, %v; want 2", n, err)
	}
	got, err := admin.GetParked(s.ctx, s.pool, s.table, requeued)
	if err != nil || string(got.Payload) != `{"seq": 0}` || got.ID != old.id {
		t.Errorf("GetParked: %+v, %v", got, err)
	}
	if _, err := admin.GetParked(s.ctx, s.pool, s.table, first); !errors.Is(err, admin.ErrNotParked) {
		t.Errorf("GetParked of a delivered event: %v, want ErrNotParked", err)
	}
	if _, err := admin.GetParked(s.ctx, s.pool, s.table, uuid.Must(uuid.NewV7())); !errors.Is(err, admin.ErrNotFound) {
		t.Errorf("GetParked of an unknown event: %v, want ErrNotFound", err)
	}

	if n, err := admin.Delete(s.ctx, s.pool, s.table, admin.Filter{EventIDs: []uuid.UUID{deleted}}, nil); err != nil || n != 1 {
		t.Fatalf("Delete: %d, %v; want 1", n, err)
	}
	if _, ok := s.parked(t, deleted); ok {
		t.Errorf("deleted, yet still parked")
	}
	fixed.Store(true)
	if n, err := admin.Requeue(s.ctx, s.pool, s.table, admin.Filter{Topic: "missing"}, nil); err != nil || n != 1 {
		t.Fatalf("Requeue: %d, %v; want 1", n, err)
	}
	if _, ok := s.parked(t, requeued); ok {
		t.Errorf("requeued, yet still parked")
	}
	if rowID, ok := s.inTable(t, requeued); !ok || rowID <= old.id {
		t.Errorf("requeued: in the table %v with row id %d; want a new id above %d", ok, rowID, old.id)
	}
	if st, err := admin.ReadStatus(s.ctx, s.pool, s.table, nil); err != nil || st.Backlog != 1 || st.Parked != 0 {
		t.Errorf("after the requeue: backlog %d, parked %d (%v); want 1 and 0", st.Backlog, st.Parked, err)
	}
	drain(t, r)
	cons.WaitForDistinct(3, 30*time.Second)

	// Past the idle lanes' next sweep, the first event is in every
	// lane's done snapshot: it can be replayed.
	time.Sleep(1100 * time.Millisecond)
	drain(t, r)
	if n, err := admin.Replay(s.ctx, s.pool, s.table, admin.Filter{Key: "a", EventIDs: []uuid.UUID{first}}, nil); err != nil || n != 1 {
		t.Fatalf("Replay: %d, %v; want 1", n, err)
	}
	drain(t, r)
	waitUntil(t, 30*time.Second, "the replayed event", func() bool {
		n := 0
		for _, m := range cons.Messages() {
			if testenv.Header(m, outbox.HeaderEventID) == first.String() {
				n++
			}
		}
		return n == 2
	})
	time.Sleep(200 * time.Millisecond)
	ids := map[string]int{}
	for _, m := range cons.Messages() {
		ids[testenv.Header(m, outbox.HeaderEventID)]++
	}
	if ids[requeued.String()] != 1 || ids[deleted.String()] != 0 || len(ids) != 3 {
		t.Errorf("got %v; want the requeued event once, the deleted one never, 3 events", ids)
	}
}

// A table parked in place by an older relay (or in marks mode, before it
// moved to cursor mode) has its parked rows moved to the parked table by
// the first cursor relay, where admin finds them.
func TestCursorAdoptsRowsParkedInPlace(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	s.cursor(t)
	brokers := s.kafka(t)
	topic := testenv.Topic(t, brokers, 1)
	old := s.addEvent(t, "a", topic, 0)
	if _, err := s.pool.Exec(s.ctx, "UPDATE "+sqlname.Ident(s.table)+" SET parked_at = now(), attempts = 5, last_error = '[kafka.message_too_large] too large' WHERE event_id = $1", old); err != nil {
		t.Fatal(err)
	}
	s.addEvent(t, "a", topic, 1)
	r := s.relay(t, s.publisher(t), relay.Config{Progress: relay.ProgressCursor})
	drain(t, r)
	p, ok := s.parked(t, old)
	if !ok || p.attempts != 5 || p.reason != "[kafka.message_too_large] too large" {
		t.Fatalf("the row parked in place: moved %v, %+v", ok, p)
	}
	if _, ok := s.inTable(t, old); ok {
		t.Errorf("moved to the parked table, yet still in the outbox table")
	}
	list, err := admin.ListParked(s.ctx, s.pool, s.table, admin.Filter{})
	if err != nil || len(list) != 1 || list[0].EventID != old {
		t.Errorf("ListParked: %+v, %v", list, err)
	}
}

// Exactly once with cursor progress and poison events among the others
// (invalid topic names, parked at once without a send), on 3 replicas, one
// killed and replaced midway: every poison event moved to the parked table,
// and a read_committed consumer gets every other event once, each key in
// order. A parked row counts as passed only in the batch after it moved,
// so the positions recorded in Kafka never skip a row that is still there.
func TestCursorExactlyOnceParksPoison(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	s.cursor(t)
	brokers := s.kafka(t)
	topic := testenv.Topic(t, brokers, 4)
	cons := testenv.ConsumeCommitted(t, brokers, topic)
	start := func() (*relay.Relay, *relay.SaramaPublisher) {
		pub, err := relay.NewSaramaPublisher(brokers, nil)
		if err != nil {
			t.Fatal(err)
		}
		r := s.relay(t, pub, relay.Config{Progress: relay.ProgressCursor, Delivery: relay.ExactlyOnce, BatchSize: 20, PollInterval: 20 * time.Millisecond})
		if err := r.Start(s.ctx); err != nil {
			t.Fatal(err)
		}
		return r, pub
	}
	type rep struct {
		r   *relay.Relay
		pub *relay.SaramaPublisher
	}
	var reps []rep
	for range 3 {
		r, pub := start()
		reps = append(reps, rep{r, pub})
	}
	defer func() {
		for _, x := range reps {
			_ = x.r.Stop(s.ctx)
			_ = x.pub.Close()
		}
	}()
	var poison []uuid.UUID
	good := 0
	for i := range 400 {
		key := fmt.Sprintf("k%d", i%25)
		if i%37 == 5 {
			poison = append(poison, s.insertRaw(t, "not a topic!", key, []byte(fmt.Sprintf(`{"seq":%d}`, i))))
			continue
		}
		s.addEvent(t, key, topic, i)
		good++
		if i == 200 {
			// Kill one replica (no grace), start another.
			dead, cancel := context.WithCancel(context.Background())
			cancel()
			_ = reps[0].r.Stop(dead)
			_ = reps[0].pub.Close()
			r, pub := start()
			reps[0] = rep{r, pub}
		}
	}
	cons.WaitForDistinct(good, 60*time.Second)
	waitUntil(t, 60*time.Second, "every poison event parked", func() bool {
		for _, id := range poison {
			if _, ok := s.parked(t, id); !ok {
				return false
			}
		}
		return true
	})
	time.Sleep(500 * time.Millisecond)
	if distinct, dups := checkOrder(t, cons.Messages()); distinct != good || dups != 0 {
		t.Errorf("read_committed: %d distinct events and %d duplicates; want %d and 0", distinct, dups, good)
	}
	for _, id := range poison {
		if _, ok := s.inTable(t, id); ok {
			t.Errorf("poison event %s parked, yet still in the table", id)
		}
	}
	st, err := admin.ReadStatus(s.ctx, s.pool, s.table, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st.Backlog != 0 || st.Parked != int64(len(poison)) {
		t.Errorf("status: backlog %d, parked %d; want 0 and %d", st.Backlog, st.Parked, len(poison))
	}
}
