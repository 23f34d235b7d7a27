package partition_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/locks"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/tablesql"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/migrations"
	"github.com/fxoutbox/outbox/relay/internal/partition"
)

// setUp creates a partitioned table with hour-long partitions.
func setUp(t *testing.T) (*pgxpool.Pool, partition.Env) {
	t.Helper()
	pool := testenv.Pool(t)
	tbl := outbox.Table{Schema: testenv.Name("t_"), Name: "Orders"}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA "+tbl.Schema+" CASCADE") })
	if err := migrations.Partitioned.WithInterval(time.Hour).Up(context.Background(), pool, tbl); err != nil {
		t.Fatal(err)
	}
	return pool, partition.Env{Table: tbl, Cursor: sqlname.Cursor(tbl), Delivered: tablesql.Delivered(tbl),
		LockNS: locks.Namespace(tbl.String()), LockKey: locks.Partitions, LockTimeout: 200 * time.Millisecond, Retention: time.Hour}
}

// idAt is a UUIDv7 of time at.
func idAt(t testing.TB, at time.Time) uuid.UUID {
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

func insert(ctx context.Context, pool *pgxpool.Pool, e partition.Env, id uuid.UUID, key string) (string, error) {
	var part string
	err := pool.QueryRow(ctx, "INSERT INTO "+sqlname.Ident(e.Table)+" (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key)"+
		" VALUES ($1, 'a', $2, 'e', '{}', 't', $2) RETURNING tableoid::regclass::text", id, key).Scan(&part)
	return part, err
}

func layout(t *testing.T, pool *pgxpool.Pool, e partition.Env) partition.Layout {
	t.Helper()
	l, err := partition.Load(context.Background(), pool, e.Table)
	if err != nil || !l.Partitioned {
		t.Fatalf("layout %+v, %v", l, err)
	}
	return l
}

// covered checks that the partitions tile the ids: head, contiguous ranges,
// tail.
func covered(t *testing.T, l partition.Layout) {
	t.Helper()
	if !l.Parts[0].Head() || !l.Parts[len(l.Parts)-1].Tail() {
		t.Fatalf("no head or tail: %+v", l.Parts)
	}
	for i := 1; i < len(l.Parts); i++ {
		if l.Parts[i].LoID != l.Parts[i-1].HiID {
			t.Fatalf("gap or overlap between %s and %s: %+v", l.Parts[i-1].Name, l.Parts[i].Name, l.Parts)
		}
	}
}

// The migration's layout is what Extend keeps: nothing to do now; three
// hours later, three partitions more, named as the migration names them,
// and the tail moved past them.
func TestExtendSplitsEmptyTail(t *testing.T) {
	t.Parallel()
	pool, e := setUp(t)
	ctx := context.Background()
	now := time.Now()
	before := layout(t, pool, e)
	if before.Interval() != time.Hour || len(before.Parts) != 11 {
		t.Fatalf("interval %s, %d partitions", before.Interval(), len(before.Parts))
	}
	if made, kept, err := partition.Extend(ctx, pool, e, now); err != nil || len(made) != 0 || len(kept) != 0 {
		t.Fatalf("Extend now: %v %v %v", made, kept, err)
	}
	made, _, err := partition.Extend(ctx, pool, e, now.Add(3*time.Hour))
	if err != nil || len(made) != 3 {
		t.Fatalf("Extend +3h: %v, %v", made, err)
	}
	after := layout(t, pool, e)
	covered(t, after)
	tail := before.Tail()
	if want := partition.Name("Orders", tail.Lo); made[0] != want {
		t.Errorf("made %v, want %s first", made, want)
	}
	if got := after.Tail().Lo; !got.Equal(tail.Lo.Add(3 * time.Hour)) {
		t.Errorf("tail from %s, want %s", got, tail.Lo.Add(3*time.Hour))
	}
}

// Writers whose ids lie past the partitions made (no relay for longer than
// the horizon) write into the tail, and go on writing while Extend bounds
// it: no write fails, the rows keep their place, a new tail follows.
func TestExtendBoundsTailThatTookWrites(t *testing.T) {
	t.Parallel()
	pool, e := setUp(t)
	ctx := context.Background()
	now := time.Now()
	tail := layout(t, pool, e).Tail()
	for i := range 50 {
		if part, err := insert(ctx, pool, e, idAt(t, now.Add(10*time.Hour+time.Duration(i)*time.Minute)), fmt.Sprint("pre", i)); err != nil || !strings.Contains(part, "Orders_tail") {
			t.Fatalf("insert past the horizon: %s, %v", part, err)
		}
	}
	writeCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var writeErrs []error
	written := 0
	for w := range 4 {
		wg.Go(func() {
			for i := 0; writeCtx.Err() == nil; i++ {
				// now, past the horizon, and at the far end of what the
				// re-bounded tail will hold (Ahead+1 intervals ahead)
				at := []time.Time{time.Now(), now.Add(11 * time.Hour), now.Add(8 * time.Hour)}[i%3]
				_, err := insert(context.WithoutCancel(writeCtx), pool, e, idAt(t, at), fmt.Sprint(w))
				mu.Lock()
				written++
				if err != nil {
					writeErrs = append(writeErrs, err)
				}
				mu.Unlock()
			}
		})
	}
	var made []string
	var err error
	for range 20 { // retried while another step holds a lock
		if made, _, err = partition.Extend(ctx, pool, e, now); err == nil || !errors.Is(err, partition.ErrBusy) {
			break
		}
	}
	stop()
	wg.Wait()
	if err != nil || len(made) != 1 || made[0] != partition.Name("Orders", tail.Lo) {
		t.Fatalf("Extend: %v, %v", made, err)
	}
	if len(writeErrs) > 0 || written == 0 {
		t.Fatalf("%d of %d writes failed: %v", len(writeErrs), written, writeErrs[0])
	}
	l := layout(t, pool, e)
	covered(t, l)
	var old partition.Part
	for _, p := range l.Parts {
		if p.Name == made[0] {
			old = p
		}
	}
	if !old.Lo.Equal(tail.Lo) || !old.Hi.After(now.Add(10*time.Hour+50*time.Minute)) || !l.Tail().Lo.Equal(old.Hi) {
		t.Fatalf("bounded tail %+v, new tail %+v", old, l.Tail())
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+l.Ident(made[0])+" WHERE partition_key LIKE 'pre%'").Scan(&n); err != nil || n != 50 {
		t.Fatalf("rows kept in the bounded tail: %d, %v", n, err)
	}
	// Nothing left to do.
	if made, _, err := partition.Extend(ctx, pool, e, now); err != nil || len(made) != 0 {
		t.Fatalf("Extend again: %v, %v", made, err)
	}
}

// An id far ahead of the clock in the tail keeps it unbounded, said why;
// writes go on.
func TestExtendLeavesFarAheadTail(t *testing.T) {
	t.Parallel()
	pool, e := setUp(t)
	ctx := context.Background()
	now := time.Now()
	if _, err := insert(ctx, pool, e, idAt(t, now.AddDate(1, 0, 0)), "k"); err != nil {
		t.Fatal(err)
	}
	made, kept, err := partition.Extend(ctx, pool, e, now.Add(3*time.Hour))
	if err != nil || len(made) != 0 || len(kept) != 1 || !strings.HasPrefix(kept[0].Reason, partition.ReasonAhead+":") {
		t.Fatalf("Extend: %v %v %v", made, kept, err)
	}
	if _, err := insert(ctx, pool, e, idAt(t, now.Add(9*time.Hour)), "k"); err != nil {
		t.Fatal(err)
	}
}

// position records every lane (one) as having delivered all committed rows.
func position(t *testing.T, pool *pgxpool.Pool, e partition.Env) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), "INSERT INTO "+sqlname.Ident(e.Cursor)+" (lane, lanes, done, base) VALUES (0, 1, pg_current_snapshot(), 0)"+
		" ON CONFLICT (lane) DO UPDATE SET done = excluded.done"); err != nil {
		t.Fatal(err)
	}
}

// Retire drops delivered partitions oldest first once Retention passed
// since their upper bound, widening the head, which then takes old ids;
// it keeps, and names, a partition with an undelivered row, one with a
// parked row, the younger ones behind it, and those inside Retention.
func TestRetire(t *testing.T) {
	t.Parallel()
	pool, e := setUp(t)
	ctx := context.Background()
	l := layout(t, pool, e)
	parts := l.Parts[1 : len(l.Parts)-1] // previous hour, this hour, 7 ahead
	for _, p := range parts[:4] {
		if _, err := insert(ctx, pool, e, idAt(t, p.Lo.Add(time.Minute)), "k"); err != nil {
			t.Fatal(err)
		}
	}
	position(t, pool, e)
	// parts[2] gets an undelivered row, parts[3] a parked one.
	if _, err := insert(ctx, pool, e, idAt(t, parts[2].Lo.Add(2*time.Minute)), "late"); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "UPDATE "+sqlname.Ident(e.Table)+" SET parked_at = now() WHERE event_id >= $1::uuid AND event_id < $2::uuid", parts[3].LoID, parts[3].HiID); err != nil {
		t.Fatal(err)
	}
	at := parts[5].Lo.Add(time.Minute) // parts[0..3] past Retention; parts[4] inside it
	dropped, kept, err := partition.Retire(ctx, pool, e, at)
	if err != nil || !slices.Equal(dropped, []string{parts[0].Name, parts[1].Name}) {
		t.Fatalf("Retire: dropped %v, %v", dropped, err)
	}
	if len(kept) != 3 || kept[0].Name != parts[2].Name || !strings.HasPrefix(kept[0].Reason, "undelivered: rows of lane 0") ||
		!strings.HasPrefix(kept[1].Reason, partition.ReasonOlder+":") || !strings.HasPrefix(kept[2].Reason, partition.ReasonRetention+":") {
		t.Fatalf("kept %+v", kept)
	}
	l = layout(t, pool, e)
	covered(t, l)
	if l.Head().HiID != parts[2].LoID || l.Parts[1].Name != parts[2].Name || l.Parts[1].Note != kept[0].Reason {
		t.Fatalf("after: head to %s, next %s (note %q)", l.Head().HiID, l.Parts[1].Name, l.Parts[1].Note)
	}
	if part, err := insert(ctx, pool, e, idAt(t, parts[0].Lo.Add(5*time.Minute)), "old"); err != nil || !strings.Contains(part, "Orders_head") {
		t.Fatalf("an old id after the drop: %s, %v", part, err)
	}
	// Delivered now: parts[2] goes, parts[3] stays for its parked row.
	position(t, pool, e)
	dropped, kept, err = partition.Retire(ctx, pool, e, at)
	if err != nil || !slices.Equal(dropped, []string{parts[2].Name}) || len(kept) == 0 || kept[0].Name != parts[3].Name || !strings.HasPrefix(kept[0].Reason, partition.ReasonParked+":") {
		t.Fatalf("Retire again: dropped %v, kept %+v, %v", dropped, kept, err)
	}
	covered(t, layout(t, pool, e))
}

// A transaction that holds the table (a lock DETACH waits for) keeps the
// partition, said why, and changes nothing; once it ends, the partition
// goes.
func TestRetireLockTimeout(t *testing.T) {
	t.Parallel()
	pool, e := setUp(t)
	ctx := context.Background()
	l := layout(t, pool, e)
	position(t, pool, e)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT count(*) FROM "+sqlname.Ident(e.Table)); err != nil {
		t.Fatal(err)
	}
	at := l.Parts[3].Lo.Add(time.Minute) // the previous hour is past Retention
	dropped, kept, err := partition.Retire(ctx, pool, e, at)
	_ = tx.Rollback(ctx)
	if err != nil || len(dropped) != 0 || len(kept) == 0 || !strings.HasPrefix(kept[0].Reason, partition.ReasonLockTimeout+":") {
		t.Fatalf("Retire under a lock: dropped %v, kept %+v, %v", dropped, kept, err)
	}
	covered(t, layout(t, pool, e))
	if dropped, _, err := partition.Retire(ctx, pool, e, at); err != nil || !slices.Equal(dropped, []string{l.Parts[1].Name}) {
		t.Fatalf("Retire after: %v, %v", dropped, err)
	}
}

// A bound left on the tail by a re-bounding that did not finish (the relay
// died between its steps) refuses ids past it: the next round removes it.
func TestExtendRemovesStaleTailBound(t *testing.T) {
	t.Parallel()
	pool, e := setUp(t)
	ctx := context.Background()
	now := time.Now()
	l := layout(t, pool, e)
	if _, err := pool.Exec(ctx, "ALTER TABLE "+l.Ident(l.Tail().Name)+" ADD CONSTRAINT "+partition.Bound+
		" CHECK (event_id < '"+partition.IDAt(now.Add(9*time.Hour))+"') NOT VALID"); err != nil {
		t.Fatal(err)
	}
	if _, err := insert(ctx, pool, e, idAt(t, now.Add(10*time.Hour)), "k"); err == nil {
		t.Fatal("the stale bound did not refuse an id past it")
	}
	if _, _, err := partition.Extend(ctx, pool, e, now); err != nil {
		t.Fatal(err)
	}
	if _, err := insert(ctx, pool, e, idAt(t, now.Add(10*time.Hour)), "k"); err != nil {
		t.Fatalf("after Extend: %v", err)
	}
}
