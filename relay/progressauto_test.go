package relay_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox/migrations"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/relay/internal/failure"
)

// switchDB is a relay.DB that begins on down until up is set, then on up:
// a database that cannot be reached and then can.
type switchDB struct {
	down, up relay.DB
	isUp     atomic.Bool
}

func (d *switchDB) Begin(ctx context.Context) (pgx.Tx, error) {
	if d.isUp.Load() {
		return d.up.Begin(ctx)
	}
	return d.down.Begin(ctx)
}

// ProgressAuto, the default, follows the table. A table without the cursor
// migration is delivered with marks, and so is one given the migration
// later, until a relay recorded cursor progress on it (its marks relays may
// still be delivering the events written before); from then on an auto
// relay records cursor progress where a marks relay would refuse to start.
// A table migrations.Install made records cursor progress from the first
// batch; a relay started while the database cannot be reached starts, and
// reads the table at its first batch that reaches it.
func TestProgressAutoFollowsTheTable(t *testing.T) {
	t.Parallel()
	var sent atomic.Int64
	pub := relay.PublisherFunc(func(_ context.Context, msgs []relay.Message) error {
		sent.Add(int64(len(msgs)))
		return nil
	})
	runOnce := func(s *setup, cfg relay.Config, want int) {
		t.Helper()
		if n, err := s.relay(t, pub, cfg).RunOnce(s.ctx); err != nil || n != want {
			t.Fatalf("RunOnce (Progress %v): %d, %v; want %d delivered", cfg.Progress, n, err, want)
		}
	}

	s := newSetup(t)
	s.write(t, "auto.marks", 6, 3)
	m := s.relay(t, pub, relay.Config{})
	if p := m.Progress(); p != relay.ProgressAuto {
		t.Errorf("Progress before the table was read: %v, want auto", p)
	}
	if n, err := m.RunOnce(s.ctx); err != nil || n != 6 {
		t.Fatalf("RunOnce on a table without the cursor migration: %d, %v; want 6", n, err)
	}
	if p := m.Progress(); p != relay.ProgressMarks {
		t.Errorf("Progress on a table without the cursor migration: %v, want marks", p)
	}
	if n := s.unpublished(t); n != 0 {
		t.Errorf("no cursor migration: %d rows left unmarked, want every row marked", n)
	}
	s.cursor(t)
	s.write(t, "auto.marks", 2, 2)
	runOnce(s, relay.Config{}, 2)
	if n := s.unpublished(t); n != 0 {
		t.Errorf("cursor migration, no cursor relay yet: %d rows left unmarked, want every row marked", n)
	}
	s.write(t, "auto.marks", 2, 2)
	runOnce(s, relay.Config{Progress: relay.ProgressCursor}, 2) // the first cursor relay
	s.write(t, "auto.marks", 3, 3)
	if err := s.relay(t, pub, relay.Config{Progress: relay.ProgressMarks}).Start(s.ctx); !errors.Is(err, relay.ErrCursorTable) {
		t.Fatalf("a marks relay's Start after a cursor relay: %v, want ErrCursorTable", err)
	}
	// m chose marks, and its next check finds the table in cursor progress:
	// it sends nothing, and says to restart it.
	relay.ExpireMarksCheck(m)
	if n, err := m.RunOnce(s.ctx); !errors.Is(err, relay.ErrCursorTable) || n != 0 || !strings.Contains(err.Error(), "restart it") {
		t.Fatalf("the auto relay that chose marks, after a cursor relay: %d, %v; want nothing sent and ErrCursorTable saying to restart it", n, err)
	}
	runOnce(s, relay.Config{}, 3)
	if n := s.unpublished(t); n != 5 {
		t.Errorf("after a cursor relay: %d rows unmarked, want the 5 delivered since (cursor progress marks none)", n)
	}

	made := newSetup(t)
	if _, err := made.pool.Exec(made.ctx, "DROP SCHEMA "+made.table.Schema+" CASCADE"); err != nil {
		t.Fatal(err)
	}
	if created, err := migrations.Install(made.ctx, made.pool, made.table); err != nil || !created {
		t.Fatalf("Install: %v, %v", created, err)
	}
	if err := made.relay(t, pub, relay.Config{Progress: relay.ProgressMarks}).Start(made.ctx); !errors.Is(err, relay.ErrCursorTable) {
		t.Fatalf("a marks relay's Start on a table Install made: %v, want ErrCursorTable", err)
	}
	made.write(t, "auto.cursor", 6, 3)
	dead, err := pgxpool.New(made.ctx, "postgres://postgres@"+closedAddr(t)+"/outbox?sslmode=disable&connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	db := &switchDB{down: dead, up: made.pool}
	rc, err := relay.New(db, pub, &relay.Config{Table: made.table, PollInterval: 20 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Start(made.ctx); err != nil {
		t.Fatalf("Start while the database cannot be reached: %v; want the relay started", err)
	}
	defer func() { _ = rc.Stop(context.Background()) }()
	if _, err := rc.RunOnce(made.ctx); failure.Type(err) != "database.connection" {
		t.Fatalf("a batch while the database cannot be reached: %v (error.type %q), want database.connection", err, failure.Type(err))
	}
	before := sent.Load()
	db.isUp.Store(true)
	waitUntil(t, 30*time.Second, "the relay to deliver the 6 events of the table Install made", func() bool { return sent.Load() >= before+6 })
	waitUntil(t, 10*time.Second, "the lanes' positions to hold them", func() bool { return made.waiting(t) == 0 })
	made.noRowUpdated(t)
	if p := rc.Progress(); p != relay.ProgressCursor {
		t.Errorf("Progress on the table Install made: %v, want cursor", p)
	}
}

// Exactly-once streaming needs cursor progress: with Progress auto on a
// table that chose marks, Start refuses, saying what to do, before it
// touches Kafka.
func TestProgressAutoExactlyOnceStreamNeedsCursor(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	s.streaming(t)
	pub, err := relay.NewSaramaPublisher([]string{"127.0.0.1:1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	r := s.relay(t, pub, relay.Config{Mode: relay.Stream, Delivery: relay.ExactlyOnce})
	err = r.Start(s.ctx)
	if !errors.Is(err, relay.ErrCursorNotReady) || !strings.Contains(err.Error(), "exactly-once streaming needs cursor progress") {
		t.Fatalf("Start: %v, want ErrCursorNotReady saying exactly-once streaming needs cursor progress", err)
	}
	t.Log(err)
}

// Only ProgressAuto under PerKey leaves the choice to the table: cursor
// progress needs lanes, so auto is marks under Unordered.
func TestProgressFollowsTable(t *testing.T) {
	for _, c := range []struct {
		cfg  relay.Config
		want bool
	}{
		{relay.Config{}, true},
		{relay.Config{Ordering: relay.Unordered}, false},
		{relay.Config{Progress: relay.ProgressMarks}, false},
		{relay.Config{Progress: relay.ProgressCursor}, false},
	} {
		if got := c.cfg.ProgressFollowsTable(); got != c.want {
			t.Errorf("Progress %v, Ordering %v: ProgressFollowsTable = %v, want %v", c.cfg.Progress, c.cfg.Ordering, got, c.want)
		}
	}
}

// A streaming relay with Progress auto started while the database cannot
// be reached starts, as a polling one does: its stream reads the table
// once it can, and streams with the progress the table chose.
func TestProgressAutoStreamStartsWhileTheDatabaseIsDown(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	if _, err := s.pool.Exec(s.ctx, "DROP SCHEMA "+s.table.Schema+" CASCADE"); err != nil {
		t.Fatal(err)
	}
	if created, err := migrations.Install(s.ctx, s.pool, s.table); err != nil || !created {
		t.Fatalf("Install: %v, %v", created, err)
	}
	s.streaming(t)
	s.write(t, "auto.stream", 5, 3)
	var sent atomic.Int64
	pub := relay.PublisherFunc(func(_ context.Context, msgs []relay.Message) error {
		sent.Add(int64(len(msgs)))
		return nil
	})
	dead, err := pgxpool.New(s.ctx, "postgres://postgres@"+closedAddr(t)+"/outbox?sslmode=disable&connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	db := &switchDB{down: dead, up: s.pool}
	cfg := streamConfig()
	cfg.Table, cfg.MaxBackoff = s.table, 50*time.Millisecond
	conn := s.pool.Config().ConnConfig.Config
	cfg.Stream.ConnConfig = &conn
	r, err := relay.New(db, pub, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(s.ctx); err != nil {
		t.Fatalf("Start of a streaming relay while the database cannot be reached: %v; want it started", err)
	}
	defer func() { _ = r.Stop(context.Background()) }()
	if p := r.Progress(); p != relay.ProgressAuto {
		t.Errorf("Progress before the table could be read: %v, want auto", p)
	}
	db.isUp.Store(true)
	waitUntil(t, 60*time.Second, "the stream to deliver the 5 events", func() bool { return sent.Load() >= 5 })
	waitUntil(t, 60*time.Second, "streaming", func() bool { return r.StreamStatus().State == relay.Streaming })
	if p := r.Progress(); p != relay.ProgressCursor {
		t.Errorf("Progress on the table Install made: %v, want cursor", p)
	}
}
