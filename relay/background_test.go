package relay_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// A writer in another process (here: another pool) wakes a listening relay
// through a coalesced NOTIFY; the relay's ticker is an hour. The listener
// survives its connection being killed.
func TestListenWakesAcrossProcesses(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	var published atomic.Int64
	pub := relay.PublisherFunc(func(_ context.Context, msgs []relay.Message) error {
		published.Add(int64(len(msgs)))
		return nil
	})
	r := s.relay(t, pub, relay.Config{PollInterval: time.Hour, Listen: true})
	if err := r.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Stop(s.ctx) }()

	writerPool := testenv.Pool(t)
	notifier, err := unitofwork.NewNotifier(writerPool, s.table, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer notifier.Close()
	uow, err := unitofwork.New(writerPool, &unitofwork.Config{Table: s.table, OnCommit: notifier.OnCommit})
	if err != nil {
		t.Fatal(err)
	}
	write := func() {
		err := uow.Do(s.ctx, func(ctx context.Context, tx unitofwork.Tx) error {
			return tx.Add(ctx, outbox.Event{AggregateType: "a", AggregateID: "1", Type: "a.b", Topic: "listen.topic"})
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	listener := func() (pid int) {
		_ = s.pool.QueryRow(s.ctx, "SELECT pid FROM pg_stat_activity WHERE query = $1", `LISTEN "`+sqlname.Channel(s.table)+`"`).Scan(&pid)
		return pid
	}
	waitUntil(t, 10*time.Second, "the relay to LISTEN", func() bool { return listener() != 0 })
	write()
	waitUntil(t, 10*time.Second, "a notified relay to publish", func() bool { return published.Load() == 1 })

	// Kill the listening connection: the relay reconnects by itself.
	old := listener()
	if _, err := s.pool.Exec(s.ctx, "SELECT pg_terminate_backend($1)", old); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 15*time.Second, "the relay to LISTEN again", func() bool { p := listener(); return p != 0 && p != old })
	write()
	waitUntil(t, 10*time.Second, "a notified relay to publish after reconnecting", func() bool { return published.Load() == 2 })
}

func TestListenNeedsAPool(t *testing.T) {
	pub := relay.PublisherFunc(func(context.Context, []relay.Message) error { return nil })
	var db relay.DB = fakeBeginner{}
	if _, err := relay.New(db, pub, &relay.Config{Listen: true}); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Errorf("Listen without a pool: %v", err)
	}
}

type fakeBeginner struct{}

func (fakeBeginner) Begin(context.Context) (pgx.Tx, error) { return nil, errors.New("unused") }

func TestCleanupDeletesOnlyOldPublishedRows(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	s.write(t, "cleanup.topic", 2500, 10)
	// 2300 rows published 4 days ago; 100 published just now; 100 unpublished.
	ctx := s.ctx
	exec := func(sql string) {
		if _, err := s.pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	exec("UPDATE " + sqlname.Ident(s.table) + " SET created_at = now() - interval '4 days', published_at = now() - interval '4 days' WHERE id IN (SELECT id FROM " + sqlname.Ident(s.table) + " ORDER BY id LIMIT 2300)")
	exec("UPDATE " + sqlname.Ident(s.table) + " SET published_at = now() WHERE id IN (SELECT id FROM " + sqlname.Ident(s.table) + " WHERE published_at IS NULL ORDER BY id LIMIT 100)")
	r := s.relay(t, relay.PublisherFunc(func(context.Context, []relay.Message) error { return nil }), relay.Config{CleanupBatch: 1000})
	var rounds []int
	for {
		n, err := r.Cleanup(ctx)
		if err != nil {
			t.Fatal(err)
		}
		rounds = append(rounds, n)
		if n < 1000 {
			break
		}
	}
	if len(rounds) != 3 || rounds[0] != 1000 || rounds[1] != 1000 || rounds[2] != 300 {
		t.Errorf("cleanup rounds deleted %v, want [1000 1000 300]", rounds)
	}
	var left, unpublished int
	_ = s.pool.QueryRow(ctx, "SELECT count(*), count(*) FILTER (WHERE published_at IS NULL) FROM "+sqlname.Ident(s.table)).Scan(&left, &unpublished)
	if left != 200 || unpublished != 100 {
		t.Errorf("left %d rows (%d unpublished), want 200 (100)", left, unpublished)
	}
	// Retention < 0 disables deletion.
	r = s.relay(t, relay.PublisherFunc(func(context.Context, []relay.Message) error { return nil }), relay.Config{Retention: -1})
	if n, err := r.Cleanup(ctx); n != 0 || err != nil {
		t.Errorf("disabled cleanup deleted %d, %v", n, err)
	}
}

// Identity order is not commit order: a transaction that took its id first
// and commits last is still published, one that rolls back never is, and
// same-key writers that lock their aggregate keep their order.
func TestLateCommitsLoseNothing(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	var got, values []string
	pub := relay.PublisherFunc(func(_ context.Context, msgs []relay.Message) error {
		for _, m := range msgs {
			got = append(got, string(m.Key))
			values = append(values, string(m.Value))
		}
		return nil
	})
	r := s.relay(t, pub, relay.Config{})
	ev := func(key string) outbox.Event {
		return outbox.Event{AggregateType: "a", AggregateID: key, Type: "a.b", Topic: "late.topic"}
	}
	begin := func() pgx.Tx {
		tx, err := s.pool.Begin(s.ctx)
		if err != nil {
			t.Fatal(err)
		}
		return tx
	}
	late, rolled, early := begin(), begin(), begin()
	for _, c := range []struct {
		tx  pgx.Tx
		key string
	}{{late, "late"}, {rolled, "rolled-back"}, {early, "early"}} {
		if err := s.uow.AddTx(s.ctx, c.tx, ev(c.key)); err != nil {
			t.Fatal(err)
		}
	}
	if err := early.Commit(s.ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := r.RunOnce(s.ctx); err != nil {
		t.Fatal(err)
	}
	if err := late.Commit(s.ctx); err != nil {
		t.Fatal(err)
	}
	_ = rolled.Rollback(s.ctx)
	if _, err := r.RunOnce(s.ctx); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != "early" || got[1] != "late" {
		t.Fatalf("published %v, want [early late]", got)
	}

	// Same key, writers lock the aggregate: the second waits for the first,
	// so its event gets the later id and commits later.
	got, values = nil, nil
	if _, err := s.pool.Exec(s.ctx, "CREATE TABLE "+s.table.Schema+".acct (id text PRIMARY KEY, n int)"); err != nil {
		t.Fatal(err)
	}
	_, _ = s.pool.Exec(s.ctx, "INSERT INTO "+s.table.Schema+".acct VALUES ('k', 0)")
	first := make(chan struct{})
	second := make(chan error, 1)
	go func() {
		second <- s.uow.Do(s.ctx, func(ctx context.Context, tx unitofwork.Tx) error {
			<-first // start after the first writer holds the lock
			var n int
			if err := tx.QueryRow(ctx, "SELECT n FROM "+s.table.Schema+".acct WHERE id = 'k' FOR UPDATE").Scan(&n); err != nil {
				return err
			}
			e := ev("k")
			e.Payload = map[string]int{"n": n + 1}
			return tx.Add(ctx, e)
		})
	}()
	err := s.uow.Do(s.ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		if _, err := tx.Exec(ctx, "UPDATE "+s.table.Schema+".acct SET n = 1 WHERE id = 'k'"); err != nil {
			return err
		}
		close(first)
		time.Sleep(100 * time.Millisecond) // the second writer is now blocked on the row
		e := ev("k")
		e.Payload = map[string]int{"n": 1}
		return tx.Add(ctx, e)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := <-second; err != nil {
		t.Fatal(err)
	}
	var payloads []string
	rows, _ := s.pool.Query(s.ctx, "SELECT payload::text FROM "+sqlname.Ident(s.table)+" WHERE partition_key = 'k' ORDER BY id")
	payloads, _ = pgx.CollectRows(rows, pgx.RowTo[string])
	if len(payloads) != 2 || payloads[0] != `{"n": 1}` || payloads[1] != `{"n": 2}` {
		t.Errorf("same-key events in id order: %v, want n=1 then n=2", payloads)
	}
	if _, err := r.RunOnce(s.ctx); err != nil {
		t.Fatal(err)
	}
	if len(values) != 2 || values[0] != `{"n": 1}` || values[1] != `{"n": 2}` {
		t.Errorf("same-key events published as %v, want n=1 then n=2", values)
	}
}

var _ relay.DB = (*pgxpool.Pool)(nil)
