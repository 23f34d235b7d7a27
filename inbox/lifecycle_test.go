package inbox_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/inbox"
	"github.com/fxoutbox/outbox/unitofwork"
)

// Two owners hold the same records at the same time (as the old and the
// new owner of a partition can for a moment around a rebalance; here two
// groups under one consumer name): the second insert of an inbox row waits
// for the first transaction and then skips, so each effect happens once.
func TestTwoOwnersAtOnceApplyOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	all := e.produce(events(200, 20)...)
	slow := func(member string) inbox.Handler {
		effect := e.effect(member)
		return func(ctx context.Context, tx unitofwork.Tx, m *inbox.Message) error {
			if err := effect(ctx, tx, m); err != nil {
				return err
			}
			time.Sleep(2 * time.Millisecond) // hold the inbox row a while
			return nil
		}
	}
	gx, gy := group(), group()
	e.start(e.config(gx, slow("x")))
	e.start(e.config(gy, slow("y")))
	e.waitEffects(len(all))
	// Both owners are through every record (a second effect would be
	// committed by now) once each group committed all offsets.
	e.waitCommitted(gx, 2, len(all), 90*time.Second)
	e.waitCommitted(gy, 2, len(all), 90*time.Second)
	e.checkOnce(all)
}

// Stop with a record in progress that does not finish: after DrainTimeout
// its transaction is cancelled and rolls back, Stop returns within its
// context, and the offset stays before it; the next member applies it once.
func TestStopAbandonsWorkInProgressCleanly(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	recs := e.produce(ev{Key: "a"}, ev{Key: "b"})
	g := group()
	var started atomic.Bool
	effect := e.effect("stuck")
	cfg := e.config(g, func(ctx context.Context, tx unitofwork.Tx, m *inbox.Message) error {
		if err := effect(ctx, tx, m); err != nil {
			return err
		}
		if string(m.Key) == "a" {
			started.Store(true)
			<-ctx.Done() // never finishes by itself
			return ctx.Err()
		}
		return nil
	})
	cfg.DrainTimeout = 300 * time.Millisecond
	c, err := inbox.New(e.pool, e.uow, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "the stuck record started and the other applied", func() bool { return started.Load() && e.count() == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if off := e.committed(g, 1)[0]; off > 0 {
		t.Fatalf("committed offset %d passed the abandoned record", off)
	}
	e.start(e.config(g, e.effect("next")))
	e.waitEffects(2)
	eventually(t, 60*time.Second, "both offsets committed", func() bool { return e.committed(g, 1)[0] == 2 })
	e.checkOnce(recs)
}

// With Hold, a record that keeps failing is retried past MaxAttempts and
// never parked: its key waits, other keys flow, and once the handler
// accepts it, it and the rest of its key are applied in order. Under
// BatchSize, one worker and a first record that takes a while, so that the
// held record and key b's are taken together in one batch: key b flows
// even then.
func TestHoldKeepsTheKeyWaiting(t *testing.T) {
	t.Parallel()
	modes(t, 1, func(t *testing.T, e *env) {
		recs := e.produce(ev{Key: "slow"}, ev{Key: "a", Seq: 0, Poison: true}, ev{Key: "a", Seq: 1}, ev{Key: "b", Seq: 0})
		var fixed atomic.Bool
		var tries atomic.Int32
		effect := e.effect("h")
		cfg := e.config(group(), func(ctx context.Context, tx unitofwork.Tx, m *inbox.Message) error {
			if m.Offset == 0 {
				time.Sleep(300 * time.Millisecond) // the others are read meanwhile
			}
			if m.Offset == 1 {
				if tries.Add(1); !fixed.Load() {
					return errors.New("not yet")
				}
				_, err := tx.Exec(ctx, `INSERT INTO `+e.effects+` (consumer, event_id, key, seq) VALUES ('c', $1, 'a', 0)`, m.ID)
				return err
			}
			return effect(ctx, tx, m)
		})
		cfg.MaxAttempts, cfg.Poison, cfg.Concurrency = 2, outbox.Hold, 2 // the held record takes one worker
		if e.batch > 1 {
			cfg.Concurrency = 1
		}
		c := e.start(cfg)
		eventually(t, 60*time.Second, "key b applied and the held record retried past MaxAttempts", func() bool {
			return e.count() == 2 && tries.Load() > 4
		})
		if p, _ := c.List(context.Background(), inbox.ListOptions{}); len(p) != 0 {
			t.Fatalf("Hold parked %+v", p)
		}
		fixed.Store(true)
		e.waitEffects(4)
		e.checkOnce(recs)
	})
}

// Cleanup deletes only this consumer's inbox rows older than Retention.
func TestCleanupDeletesOldRows(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	ctx := context.Background()
	in := e.inbox.Schema + ".outbox_inbox"
	_, err := e.pool.Exec(ctx, `INSERT INTO `+in+` (consumer, event_id, topic, "partition", "offset", processed_at)
		SELECT c, 'e' || i, 't', 0, i, now() - interval '1 hour' * i + interval '30 minutes' FROM generate_series(1, 2500) i, (VALUES ('c'), ('other')) v(c)`)
	if err != nil {
		t.Fatal(err)
	}
	cfg := e.config(group(), e.effect("r"))
	cfg.Retention = 100 * time.Hour
	c, err := inbox.New(e.pool, e.uow, cfg)
	if err != nil {
		t.Fatal(err)
	}
	n, err := c.Cleanup(ctx)
	if err != nil || n != 2400 {
		t.Fatalf("Cleanup = %d, %v; want the 2400 rows older than 100h", n, err)
	}
	var left, others int
	_ = e.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE consumer = 'c'), count(*) FILTER (WHERE consumer = 'other') FROM `+in).Scan(&left, &others)
	if left != 100 || others != 2500 {
		t.Fatalf("left %d own rows (want 100) and %d of another consumer (want 2500)", left, others)
	}
}

// Start does not wait for Kafka: with no broker reachable it succeeds, the
// consumer retries in the background, Health reports the failure, and Stop
// returns at once. With a broker, Health is nil once the group is joined.
func TestHealthAndStartWithoutKafka(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	cfg := e.config(group(), e.effect("h"))
	cfg.Brokers = []string{"127.0.0.1:1"}
	c, err := inbox.New(e.pool, e.uow, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Health(context.Background()); err == nil {
		t.Fatal("Health before Start = nil")
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatalf("Start without a reachable broker: %v", err)
	}
	eventually(t, 60*time.Second, "Health reports the unreachable broker", func() bool { return c.Health(context.Background()) != nil })
	t.Logf("Health: %v", c.Health(context.Background()))
	stop(t, c)

	recs := e.produce(ev{Key: "a"})
	ok := e.start(e.config(group(), e.effect("h")))
	e.waitEffects(1)
	if err := ok.Health(context.Background()); err != nil {
		t.Fatalf("Health while consuming: %v", err)
	}
	e.checkOnce(recs)
}

// A try that outlives TryTimeout is cancelled (its transaction rolls back)
// and retried without counting: with MaxAttempts 1 the record is applied
// once, not parked.
func TestTryTimeoutRetries(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	recs := e.produce(ev{Key: "a"}, ev{Key: "a", Seq: 1})
	var tries atomic.Int32
	effect := e.effect("slow")
	cfg := e.config(group(), func(ctx context.Context, tx unitofwork.Tx, m *inbox.Message) error {
		if err := effect(ctx, tx, m); err != nil {
			return err
		}
		if m.Offset == 0 && tries.Add(1) <= 2 {
			<-ctx.Done() // hangs past the try's deadline
			return ctx.Err()
		}
		return nil
	})
	cfg.TryTimeout, cfg.MaxAttempts = 200*time.Millisecond, 1
	c := e.start(cfg)
	e.waitEffects(2)
	e.checkOnce(recs)
	if p, _ := c.List(context.Background(), inbox.ListOptions{}); len(p) != 0 || tries.Load() != 3 {
		t.Fatalf("parked %+v after %d tries, want none after 3", p, tries.Load())
	}
}
