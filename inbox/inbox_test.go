package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fxoutbox/outbox/inbox"
	"github.com/fxoutbox/outbox/unitofwork"
)

// Every event applied once, and again once after the offsets are reset to
// the start (a new group under the same consumer name reads everything
// again): the inbox drops the redeliveries. The same event sent twice (new
// offsets, same x-event-id) is also applied once.
func TestOnceAcrossOffsetReset(t *testing.T) {
	t.Parallel()
	modes(t, 3, func(t *testing.T, e *env) {
		want := e.produce(events(300, 20)...)
		resent := want[7]
		resent.Seq = 1000 // a re-sent event: same id, new offset (payload ignored: dropped)
		e.produce(resent)

		g := group()
		c := e.start(e.config(g, e.effect("a")))
		e.waitEffects(len(want))
		stop(t, c)
		offs := e.committed(g, 3)
		var total int64
		for _, o := range offs {
			total += o
		}
		if total != int64(len(want)+1) {
			t.Fatalf("committed offsets %v add up to %d, want every record (%d)", offs, total, len(want)+1)
		}

		// Offsets reset to the start: a new group, same consumer name.
		g2 := group()
		e.start(e.config(g2, e.effect("b")))
		e.waitCommitted(g2, 3, len(want)+1, 60*time.Second)
		e.checkOnce(want)
	})
}

// A consumer that dies between its database commit and its offset commit
// (simulated: auto-commit off, so nothing it marked reaches the broker)
// leaves every record to be redelivered; the next member applies none of
// them a second time and misses none.
func TestCrashBetweenCommitAndOffsetCommit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	first := e.produce(events(100, 10)...)
	g := group()
	cfg := e.config(g, e.effect("crashing"))
	cfg.Sarama.Consumer.Offsets.AutoCommit.Enable = false
	c := e.start(cfg)
	e.waitEffects(len(first))
	stop(t, c)
	if offs := e.committed(g, 2); offs[0] > 0 || offs[1] > 0 {
		t.Fatalf("offsets committed %v: the simulated crash must leave none", offs)
	}
	more := events(50, 10)
	for i := range more {
		more[i].Seq += 100
	}
	more = e.produce(more...)
	e.start(e.config(g, e.effect("next")))
	all := append(first, more...)
	e.waitEffects(len(all))
	eventually(t, 60*time.Second, "every offset committed", func() bool {
		offs := e.committed(g, 2)
		return offs[0]+offs[1] == int64(len(all))
	})
	e.checkOnce(all)
}

// Different keys of one partition are applied in parallel, and the
// committed offset stays below a record still in progress: while key A's
// first record blocks, key B's records are applied, yet the offset stays
// at A's record; once A is released everything is committed.
func TestKeyParallelOffsetsStayBelowInProgress(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	recs := e.produce(ev{Key: "A", Seq: 0}, ev{Key: "B", Seq: 0}, ev{Key: "B", Seq: 1}, ev{Key: "A", Seq: 1}, ev{Key: "B", Seq: 2})
	release := make(chan struct{})
	var blocked atomic.Bool
	effect := e.effect("p")
	g := group()
	cfg := e.config(g, func(ctx context.Context, tx unitofwork.Tx, m *inbox.Message) error {
		if string(m.Key) == "A" && m.Offset == 0 {
			blocked.Store(true)
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return effect(ctx, tx, m)
	})
	cfg.Concurrency = 4
	e.start(cfg)
	eventually(t, 60*time.Second, "key B applied while key A is blocked", func() bool {
		var n int
		_ = e.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+e.effects+` WHERE key = 'B'`).Scan(&n)
		return n == 3 && blocked.Load()
	})
	time.Sleep(500 * time.Millisecond) // several auto-commit intervals
	if off := e.committed(g, 1)[0]; off > 0 {
		t.Fatalf("committed offset %d passed the record in progress at offset 0", off)
	}
	var n int
	_ = e.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+e.effects+` WHERE key = 'A'`).Scan(&n)
	if n != 0 {
		t.Fatalf("key A's second record was applied before its first: %d effects", n)
	}
	close(release)
	eventually(t, 60*time.Second, "everything committed", func() bool { return e.committed(g, 1)[0] == 5 })
	e.checkOnce(recs)
}

// A record whose handler keeps failing is parked after MaxAttempts with its
// reason; the records after it, of its key and others, flow. A record
// without x-event-id is parked at once with a clear reason. Parked records
// are listed, retried (applied once, its parking gone) and deleted.
func TestPoisonIsParkedAndTheRestFlows(t *testing.T) {
	t.Parallel()
	modes(t, 2, func(t *testing.T, e *env) {
		recs := e.produce(
			ev{Key: "a", Seq: 0}, ev{Key: "a", Seq: 1, Poison: true}, ev{Key: "a", Seq: 2},
			ev{Key: "d", Seq: 0}, ev{ID: "-", Key: "d", Seq: 1}, ev{Key: "d", Seq: 2},
		)
		var fixed atomic.Bool
		var tries atomic.Int32
		effect := e.effect("p")
		g := group()
		cfg := e.config(g, func(ctx context.Context, tx unitofwork.Tx, m *inbox.Message) error {
			if fixed.Load() {
				_, err := tx.Exec(ctx, `INSERT INTO `+e.effects+` (consumer, event_id, key, seq) VALUES ('c', $1, $2, 1)`, m.ID, string(m.Key))
				return err
			}
			if contains(string(m.Value), "poison") {
				if tries.Add(1) == 2 {
					panic("the handler's bug") // a panic counts as an attempt, the process goes on
				}
			}
			return effect(ctx, tx, m)
		})
		cfg.MaxAttempts = 3
		c := e.start(cfg)
		eventually(t, 60*time.Second, "the good records applied", func() bool { return e.count() == 4 })
		eventually(t, 60*time.Second, "every offset committed", func() bool {
			offs := e.committed(g, 2)
			return offs[0]+offs[1] == 6
		})
		parked, err := c.List(context.Background(), inbox.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(parked) != 2 {
			t.Fatalf("parked %d records, want 2: %+v", len(parked), parked)
		}
		var poison, noID inbox.Parked
		for _, p := range parked {
			if p.EventID == "" {
				noID = p
			} else {
				poison = p
			}
		}
		if poison.EventID != recs[1].ID || poison.Attempts != 3 || poison.ErrorType != inbox.ErrorTypeHandler ||
			!contains(poison.LastError, "poison record 1") || string(poison.Key) != "a" || poison.Headers["x-event-id"] != recs[1].ID {
			t.Errorf("poison parked as %+v", poison)
		}
		if tries.Load() != 3 {
			t.Errorf("handler tried the poison record %d times, want MaxAttempts 3", tries.Load())
		}
		if noID.ErrorType != inbox.ErrorTypeNoEventID || !contains(noID.LastError, "x-event-id") || noID.Attempts != 0 {
			t.Errorf("record without x-event-id parked as %+v", noID)
		}
		if err := c.Delete(context.Background(), noID.ID); err != nil {
			t.Fatal(err)
		}
		if err := c.Delete(context.Background(), noID.ID); !errors.Is(err, inbox.ErrNotFound) {
			t.Fatalf("second Delete = %v, want ErrNotFound", err)
		}
		fixed.Store(true)
		if err := c.Retry(context.Background(), poison.ID); err != nil {
			t.Fatal(err)
		}
		if err := c.Retry(context.Background(), poison.ID); !errors.Is(err, inbox.ErrNotFound) {
			t.Fatalf("second Retry = %v, want ErrNotFound", err)
		}
		if left, _ := c.List(context.Background(), inbox.ListOptions{}); len(left) != 0 {
			t.Fatalf("parked after retry and delete: %+v", left)
		}
		// A redelivery of the parked-then-retried event is still dropped.
		e.produce(recs[1])
		g2 := group()
		e.start(e.config(g2, e.effect("again")))
		eventually(t, 60*time.Second, "the second group commits every record", func() bool {
			offs := e.committed(g2, 2)
			return offs[0]+offs[1] == 7
		})
		if n := e.count(); n != 5 {
			t.Fatalf("%d effects, want 5 (4 good records and the retried poison, once each)", n)
		}
	})
}

// A transient failure of the handler's statements (serialization failure
// 40001, raised by PostgreSQL) is retried without counting: with
// MaxAttempts 1 the record is still applied, not parked.
func TestTransientHandlerErrorsAreNotCounted(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	recs := e.produce(ev{Key: "a"}, ev{Key: "a", Seq: 1})
	var fails atomic.Int32
	effect := e.effect("t")
	cfg := e.config(group(), func(ctx context.Context, tx unitofwork.Tx, m *inbox.Message) error {
		if m.Offset == 0 && fails.Add(1) <= 5 {
			_, err := tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END $$`)
			return fmt.Errorf("apply: %w", err)
		}
		return effect(ctx, tx, m)
	})
	cfg.MaxAttempts = 1
	c := e.start(cfg)
	e.waitEffects(2)
	e.checkOnce(recs)
	if p, _ := c.List(context.Background(), inbox.ListOptions{}); len(p) != 0 {
		t.Fatalf("parked %+v", p)
	}
}

// Records whose event type no route takes are skipped and their offsets
// committed; with ParkUnrouted they are parked. EventIDOrPosition applies
// a record without x-event-id once, identified by its position.
func TestUnroutedAndIdentity(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	recs := e.produce(ev{Key: "a", Type: "other.v1"}, ev{ID: "-", Key: "a", Seq: 1}, ev{Key: "a", Seq: 2})
	g := group()
	cfg := e.config(g, nil)
	cfg.Routes = []inbox.Route{{Topic: e.topic, Type: "thing.happened.v1", Handler: e.effect("u")}}
	cfg.Identity = inbox.EventIDOrPosition
	c := e.start(cfg)
	eventually(t, 60*time.Second, "every offset committed", func() bool { return e.committed(g, 1)[0] == 3 })
	stop(t, c)
	var ids []string
	rows, _ := e.pool.Query(context.Background(), `SELECT event_id FROM `+e.effects+` ORDER BY n`)
	for rows.Next() {
		var id string
		_ = rows.Scan(&id)
		ids = append(ids, id)
	}
	rows.Close()
	if want := e.topic + "/0/1"; len(ids) != 2 || ids[0] != want || ids[1] != recs[2].ID {
		t.Fatalf("applied %v, want [%s %s]", ids, want, recs[2].ID)
	}

	g2 := group()
	cfg = e.config(g2, nil)
	cfg.Name = "strict"
	cfg.Routes = []inbox.Route{{Topic: e.topic, Type: "thing.happened.v1", Handler: e.effect("s")}}
	cfg.ParkUnrouted = true
	c = e.start(cfg)
	eventually(t, 60*time.Second, "every offset committed", func() bool { return e.committed(g2, 1)[0] == 3 })
	parked, err := c.List(context.Background(), inbox.ListOptions{})
	if err != nil || len(parked) != 2 {
		t.Fatalf("parked %+v, %v; want the unrouted record and the one without x-event-id", parked, err)
	}
	if parked[0].ErrorType != inbox.ErrorTypeNoRoute || parked[0].EventID != recs[0].ID || parked[1].ErrorType != inbox.ErrorTypeNoEventID {
		t.Fatalf("parked %+v", parked)
	}
}
