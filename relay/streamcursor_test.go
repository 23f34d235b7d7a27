package relay_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/tablesql"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
)

// streamCursorConfig is a Stream relay with cursor progress: it publishes
// what the slot decodes.
func streamCursorConfig() relay.Config {
	cfg := streamConfig()
	cfg.Progress = relay.ProgressCursor
	return cfg
}

// waiting counts the table's rows that their lane's position does not hold
// (the cursor's backlog).
func (s *setup) waiting(t testing.TB) int {
	t.Helper()
	var n int
	err := s.pool.QueryRow(s.ctx, "SELECT count(*) FROM "+sqlname.Ident(s.table)+" e JOIN "+sqlname.Ident(sqlname.Cursor(s.table))+
		" c ON c.lane = (hashtext(e.partition_key) & 2147483647) % c.lanes WHERE NOT pg_visible_in_snapshot(e.txid, c.done)").Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestStreamCursorPublishesWhatItDecodes: under cursor progress the
// streaming relay publishes events written before its slot existed and
// before it started (by polling, at the handover) and then those it
// decodes, each key in order, each event once; it writes nothing to the
// rows, and its checkpoint moves the lanes' positions past every event.
func TestStreamCursorPublishesWhatItDecodes(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	s.cursor(t)
	topic := testenv.Topic(t, s.kafka(t), 4)
	cons := testenv.Consume(t, s.kafka(t), topic)
	s.writeSeq(t, topic, 0, 30, 3) // before the slot: only the table has them
	s.streaming(t)
	s.writeSeq(t, topic, 30, 30, 3) // in the slot and in the table

	r := s.streamRelay(t, s.publisher(t), streamCursorConfig())
	s.writeSeq(t, topic, 60, 60, 3) // only streamed
	cons.WaitForDistinct(120, 30*time.Second)
	time.Sleep(200 * time.Millisecond) // duplicates, if any, are counted too
	if dups := checkKeyOrder(t, cons.Messages(), 120); dups > 0 {
		t.Errorf("%d events sent twice, want none (nothing crashed)", dups)
	}
	s.noRowUpdated(t)
	waitUntil(t, 15*time.Second, "the checkpoint to hold every event", func() bool { return s.waiting(t) == 0 })
	if st := r.StreamStatus(); st.Checkpoint.IsZero() || st.Confirmed == 0 {
		t.Errorf("stream status %+v: want a checkpoint and a confirmed position", st)
	}
	// outboxctl stream status shows the checkpoint: every lane written by
	// the stream, none left open.
	st, err := tablesql.ReadStream(s.ctx, s.pool, s.table)
	if err != nil {
		t.Fatal(err)
	}
	if cp := st.Checkpoint; cp == nil || cp.OpenWindows != 0 || cp.AgeSeconds > 60 {
		t.Errorf("tablesql.ReadStream's checkpoint %+v, want the lanes' positions, none open, written lately", cp)
	}
}

// TestStreamCursorSlotDroppedResumesFromCheckpoint: the slot is dropped
// while the relay is stopped and events are written; the next start finds
// no slot, publishes what the table holds past the last checkpoint by
// polling, creates a slot and streams again. Every event arrives, each key in
// order; the ones sent twice are at most those the stream published after
// its last checkpoint.
func TestStreamCursorSlotDroppedResumesFromCheckpoint(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	s.cursor(t)
	topic := testenv.Topic(t, s.kafka(t), 4)
	cons := testenv.Consume(t, s.kafka(t), topic)
	slot := testenv.Streaming(t, s.pool, s.table, true)

	r := s.streamRelay(t, s.publisher(t), streamCursorConfig())
	s.writeSeq(t, topic, 0, 40, 4)
	cons.WaitForDistinct(40, 30*time.Second)
	waitUntil(t, 15*time.Second, "a checkpoint past the first events", func() bool { return s.waiting(t) == 0 })
	s.writeSeq(t, topic, 40, 10, 4) // perhaps past the last checkpoint
	cons.WaitForDistinct(50, 30*time.Second)
	if err := r.Stop(s.ctx); err != nil {
		t.Fatal(err)
	}
	// The stopped relay's walsender may take a moment to end (it holds
	// the slot until then).
	waitUntil(t, 30*time.Second, "the slot dropped once the stopped relay's walsender ended", func() bool {
		_, err := s.pool.Exec(s.ctx, "SELECT pg_drop_replication_slot($1)", slot)
		var pe *pgconn.PgError
		if err != nil && !(errors.As(err, &pe) && pe.Code == "55006") { // object_in_use

			t.Fatal(err)
		}
		return err == nil
	})
	s.writeSeq(t, topic, 50, 50, 4) // in no slot

	r = s.streamRelay(t, s.publisher(t), streamCursorConfig())
	s.writeSeq(t, topic, 100, 20, 4)
	cons.WaitForDistinct(120, 30*time.Second)
	time.Sleep(200 * time.Millisecond) // duplicates, if any, are counted too
	if dups := checkKeyOrder(t, cons.Messages(), 120); dups > 10 {
		t.Errorf("%d events sent twice, want at most the 10 published after the last checkpoint", dups)
	}
	s.noRowUpdated(t)
	waitUntil(t, 15*time.Second, "the checkpoint to hold every event", func() bool { return s.waiting(t) == 0 })
}

// flakyPublisher fails the events of key flaky transiently for their first
// failures sends, and the event of key poison with seq 0 permanently,
// always; it holds a
// key's later events in the same call behind its failure, as a publisher
// must (relay.ErrHeld).
type flakyPublisher struct {
	pub      relay.Publisher
	flaky    string
	poison   string
	mu       sync.Mutex
	failures int
}

func (p *flakyPublisher) Publish(ctx context.Context, msgs []relay.Message) error {
	failed := map[int]error{}
	blocked := map[string]bool{}
	var pass []relay.Message
	var at []int
	p.mu.Lock()
	for i, m := range msgs {
		k := string(m.Key)
		switch {
		case blocked[k]:
			failed[i] = relay.ErrHeld
		case k == p.poison && seqIn(m.Value) == 0:
			failed[i] = outbox.Permanent(errors.New("refused by the test"))
			blocked[k] = true
		case k == p.flaky && p.failures > 0:
			p.failures--
			failed[i] = errors.New("flaky broker (test)")
			blocked[k] = true
		default:
			pass = append(pass, m)
			at = append(at, i)
		}
	}
	p.mu.Unlock()
	if len(pass) > 0 {
		if err := p.pub.Publish(ctx, pass); err != nil {
			var be *relay.BatchError
			for j, i := range at {
				switch {
				case errors.As(err, &be) && be.Failed[j] != nil:
					failed[i] = be.Failed[j]
				case !errors.As(err, &be):
					failed[i] = err
				}
			}
		}
	}
	if len(failed) > 0 {
		return &relay.BatchError{Failed: failed}
	}
	return nil
}

// TestStreamCursorFailuresHoldOnlyTheirKey: a key whose events fail
// transiently waits for its retries while the others flow, then goes in
// order; a key whose event fails permanently has it parked (moved to the
// parked table after MaxAttempts) and its later events go on.
func TestStreamCursorFailuresHoldOnlyTheirKey(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	s.cursor(t)
	topic := testenv.Topic(t, s.kafka(t), 4)
	cons := testenv.Consume(t, s.kafka(t), topic)
	s.streaming(t)
	pub := &flakyPublisher{pub: s.publisher(t), flaky: "flaky", poison: "poison", failures: 3}
	cfg := streamCursorConfig()
	cfg.MaxAttempts = 2
	r := s.streamRelay(t, pub, cfg)

	poison := s.addEvent(t, "poison", topic, 0)
	for i := range 5 {
		s.addEvent(t, "flaky", topic, i)
		s.addEvent(t, "ok", topic, i)
	}
	after := s.addEvent(t, "poison", topic, 1)
	msgs := cons.WaitForDistinct(11, 30*time.Second)
	seqs := seqsByKey(msgs)
	for _, k := range []string{"flaky", "ok"} {
		if fmt.Sprint(seqs[k]) != "[0 1 2 3 4]" {
			t.Errorf("key %s arrived as %v, want [0 1 2 3 4]", k, seqs[k])
		}
	}
	if fmt.Sprint(seqs["poison"]) != "[1]" {
		t.Errorf("key poison arrived as %v, want [1] (its first event parked)", seqs["poison"])
	}
	// Hang guards, not timings: on Apache Kafka under CI's load the park
	// once took more than 10 s.
	waitUntil(t, time.Minute, "the poison event parked", func() bool { _, ok := s.parked(t, poison); return ok })
	if _, ok := s.inTable(t, poison); ok {
		t.Errorf("the parked event is still in the table")
	}
	if _, ok := s.parked(t, after); ok {
		t.Errorf("the key's next event was parked too")
	}
	waitUntil(t, time.Minute, "the checkpoint to hold every event", func() bool { return s.waiting(t) == 0 })
	_ = r
}

// seqIn is the seq of a payload {"seq": n}; -1 when it has none.
func seqIn(payload []byte) int {
	var p struct{ Seq *int }
	if json.Unmarshal(payload, &p) != nil || p.Seq == nil {
		return -1
	}
	return *p.Seq
}

// seqsByKey returns each key's seqs (seqIn), in the order msgs arrived.
func seqsByKey(msgs []*sarama.ConsumerMessage) map[string][]int {
	seqs := map[string][]int{}
	for _, m := range msgs {
		seqs[string(m.Key)] = append(seqs[string(m.Key)], seqIn(m.Value))
	}
	return seqs
}
