package relay_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/propagation"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/admin"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/migrations"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// newPartitionedSetup is newSetup on a partitioned table (one partition a
// day, cursor migration applied).
func newPartitionedSetup(t *testing.T) *setup {
	t.Helper()
	pool := testenv.Pool(t)
	tbl := outbox.Table{Schema: testenv.Name("t_")}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA "+tbl.Schema+" CASCADE") })
	if err := migrations.Partitioned.Up(context.Background(), pool, tbl); err != nil {
		t.Fatal(err)
	}
	uow, err := unitofwork.New(pool, &unitofwork.Config{Service: "test", Table: tbl, Propagator: propagation.TraceContext{}})
	if err != nil {
		t.Fatal(err)
	}
	return &setup{ctx: context.Background(), pool: pool, table: tbl, uow: uow}
}

// v7At is a UUIDv7 whose time is at.
func v7At(t testing.TB, at time.Time) uuid.UUID {
	id, err := uuid.NewV7()
	if err != nil {
		t.Fatal(err)
	}
	ms := uint64(at.UnixMilli())
	for i := range 6 {
		id[i] = byte(ms >> (40 - 8*i))
	}
	return id
}

// partitionOf names the partition that holds the event.
func (s *setup) partitionOf(t testing.TB, id uuid.UUID) string {
	t.Helper()
	var p string
	if err := s.pool.QueryRow(s.ctx, "SELECT tableoid::regclass::text FROM "+sqlname.Ident(s.table)+" WHERE event_id = $1", id).Scan(&p); err != nil {
		t.Fatal(err)
	}
	return p
}

// Writers go on while no relay runs for longer than the partitions made
// ahead (their events' v7 times lie past the horizon): no write fails. The
// relay then starts, bounds the tail that took them, makes a new one, and
// delivers every event once, each key in order; the writers go on through
// that change too, and none of their writes fails.
func TestPartitionedWritesPastTheHorizon(t *testing.T) {
	t.Parallel()
	s := newPartitionedSetup(t)
	brokers := s.kafka(t)
	topic := testenv.Topic(t, brokers, 4)
	cons := testenv.Consume(t, brokers, topic)
	start := time.Now().Add(10 * 24 * time.Hour) // the premade horizon is 7 days
	const writers, each = 4, 40
	var wg sync.WaitGroup
	errs := make(chan error, writers*each)
	var first uuid.UUID
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				id := v7At(t, start.Add(time.Duration(i*writers+w)*time.Second))
				if w == 0 && i == 0 {
					first = id
				}
				errs <- s.uow.Do(s.ctx, func(ctx context.Context, tx unitofwork.Tx) error {
					return tx.Add(ctx, outbox.Event{ID: id, AggregateType: "order", AggregateID: fmt.Sprintf("k%d", w), Type: "order.updated.v1",
						Topic: topic, Payload: map[string]int{"seq": i}})
				})
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("a write failed: %v", err)
		}
	}
	if p := s.partitionOf(t, first); !strings.HasSuffix(p, "outbox_event_tail") {
		t.Fatalf("an event past the horizon went to %s, want the tail", p)
	}
	// The writers go on, past the horizon, while the relay starts and
	// bounds the tail: none of their writes fails either.
	wctx, stopWriters := context.WithCancel(s.ctx)
	var more atomic.Int64
	var mwg sync.WaitGroup
	merrs := make(chan error, writers)
	for w := range writers {
		mwg.Go(func() {
			for i := each; wctx.Err() == nil; i++ {
				id := uuid.Must(uuid.NewV7())
				ms := uint64(start.Add(time.Duration(i*writers+w) * time.Second).UnixMilli())
				for b := range 6 {
					id[b] = byte(ms >> (40 - 8*b))
				}
				if err := s.uow.Do(s.ctx, func(ctx context.Context, tx unitofwork.Tx) error {
					return tx.Add(ctx, outbox.Event{ID: id, AggregateType: "order", AggregateID: fmt.Sprintf("k%d", w), Type: "order.updated.v1",
						Topic: topic, Payload: map[string]int{"seq": i}})
				}); err != nil {
					merrs <- fmt.Errorf("writer k%d, seq %d, while the relay kept the partitions: %w", w, i, err)
					return
				}
				more.Add(1)
			}
		})
	}
	defer func() { stopWriters(); mwg.Wait() }()
	r := s.relay(t, s.publisher(t), relay.Config{Progress: relay.ProgressCursor, CleanupInterval: 50 * time.Millisecond, PollInterval: 50 * time.Millisecond})
	if err := r.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Stop(context.Background()) }()
	cons.WaitForDistinct(writers*each, 60*time.Second)
	waitUntil(t, 30*time.Second, "the tail bounded", func() bool {
		var p string
		err := s.pool.QueryRow(s.ctx, "SELECT tableoid::regclass::text FROM "+sqlname.Ident(s.table)+" WHERE event_id = $1", first).Scan(&p)
		return err == nil && !strings.HasSuffix(p, "_tail")
	})
	bounded := more.Load()
	waitUntil(t, 30*time.Second, "writes after the tail was bounded", func() bool { return more.Load() > bounded+20 })
	stopWriters()
	mwg.Wait()
	close(merrs)
	for err := range merrs {
		t.Errorf("a write failed: %v", err)
	}
	total := writers*each + int(more.Load())
	cons.WaitForDistinct(total, 60*time.Second)
	if err := r.Stop(s.ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // late duplicates, if any
	distinct, dups := checkOrder(t, cons.Messages())
	if distinct != total || dups != 0 {
		t.Errorf("got %d distinct events and %d duplicates, want %d and 0", distinct, dups, total)
	}
	// A new tail from past the events, and later writes still land.
	if err := s.uow.Do(s.ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		return tx.Add(ctx, outbox.Event{ID: v7At(t, start.Add(time.Hour)), AggregateType: "order", AggregateID: "k0", Type: "order.updated.v1", Topic: topic, Payload: map[string]int{"seq": 999}})
	}); err != nil {
		t.Fatal(err)
	}
	s.noRowUpdated(t)
}

// Retention on a partitioned table drops a delivered partition whole
// (Cleanup deletes no row), keeps one with an undelivered event and says
// so in admin.ReadStatus; a marks relay is refused; a v4 event id gets an
// error that says what to do.
func TestPartitionedRetentionAndRefusals(t *testing.T) {
	t.Parallel()
	s := newPartitionedSetup(t)
	var mu sync.Mutex
	sent := 0
	pub := relay.PublisherFunc(func(_ context.Context, batch []relay.Message) error {
		mu.Lock()
		defer mu.Unlock()
		sent += len(batch)
		return nil
	})
	// The previous day's partition has passed its upper bound.
	yesterday := time.Now().UTC().Truncate(24 * time.Hour).Add(-time.Hour)
	old := v7At(t, yesterday)
	if err := s.uow.Do(s.ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		if err := tx.Add(ctx, outbox.Event{ID: old, AggregateType: "order", AggregateID: "k1", Type: "order.updated.v1", Topic: "t"}); err != nil {
			return err
		}
		return tx.Add(ctx, outbox.Event{AggregateType: "order", AggregateID: "k2", Type: "order.updated.v1", Topic: "t"})
	}); err != nil {
		t.Fatal(err)
	}
	part := s.partitionOf(t, old)

	marks := s.relay(t, pub, relay.Config{Progress: relay.ProgressMarks})
	if err := marks.Start(s.ctx); !errors.Is(err, relay.ErrPartitionedTable) {
		t.Fatalf("a marks relay: Start = %v, want ErrPartitionedTable", err)
	}

	r := s.relay(t, pub, relay.Config{Progress: relay.ProgressCursor, Retention: time.Millisecond})
	// Not delivered yet: kept, and said why.
	rep, err := r.MaintainPartitions(s.ctx)
	if err != nil || len(rep.Dropped) != 0 || len(rep.Kept) != 1 || !strings.HasPrefix(rep.Kept[0].Reason, "undelivered:") {
		t.Fatalf("before delivery: %+v, %v", rep, err)
	}
	st, err := admin.ReadStatus(s.ctx, s.pool, s.table, nil)
	if err != nil || len(st.PartitionsKept) != 1 || !strings.Contains(part, st.PartitionsKept[0].Name) || !strings.HasPrefix(st.PartitionsKept[0].Reason, "undelivered:") {
		t.Fatalf("status: %+v, %v", st.PartitionsKept, err)
	}
	drain(t, r)
	if n, err := r.Cleanup(s.ctx); err != nil || n != 0 {
		t.Fatalf("Cleanup: %d, %v", n, err)
	}
	var gone bool
	if err := s.pool.QueryRow(s.ctx, "SELECT to_regclass($1) IS NULL", part).Scan(&gone); err != nil || !gone {
		t.Fatalf("partition %s still there (%v)", part, err)
	}
	var left int
	if err := s.pool.QueryRow(s.ctx, "SELECT count(*) FROM "+sqlname.Ident(s.table)).Scan(&left); err != nil || left != 1 {
		t.Fatalf("%d rows left, want today's one (%v)", left, err)
	}
	if st, err := admin.ReadStatus(s.ctx, s.pool, s.table, nil); err != nil || len(st.PartitionsKept) != 0 {
		t.Fatalf("status after the drop: %+v, %v", st.PartitionsKept, err)
	}
	// The old id can be written again: the head took its range.
	if _, err := s.pool.Exec(s.ctx, "INSERT INTO "+sqlname.Ident(s.table)+" (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key) VALUES ($1, 'order', 'k1', 'e', '{}', 't', 'k1')", old); err != nil {
		t.Fatalf("old id again: %v", err)
	}
	if p := s.partitionOf(t, old); !strings.HasSuffix(p, "outbox_event_head") {
		t.Fatalf("old id again went to %s, want the head", p)
	}
	// The default, auto, records cursor progress on a partitioned table.
	auto := s.relay(t, pub, relay.Config{})
	if err := auto.Start(s.ctx); err != nil {
		t.Fatalf("a relay with the default Progress (auto) on a partitioned table: Start = %v, want it started with cursor progress", err)
	}
	if p := auto.Progress(); p != relay.ProgressCursor {
		t.Errorf("the default Progress (auto) on a partitioned table chose %v, want cursor", p)
	}
	if err := auto.Stop(s.ctx); err != nil {
		t.Fatal(err)
	}

	err = s.uow.Do(s.ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		return tx.Add(ctx, outbox.Event{ID: uuid.New(), AggregateType: "order", AggregateID: "k1", Type: "order.updated.v1", Topic: "t"})
	})
	if !errors.Is(err, outbox.ErrInvalidEvent) || !strings.Contains(err.Error(), "version 4") {
		t.Fatalf("a v4 id: %v, want ErrInvalidEvent naming the version", err)
	}
	t.Log(err)
}
