package admin_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/admin"
	"github.com/fxoutbox/outbox/internal/locks"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// A table with thousands of published, unpublished and parked rows: the
// status counts each kind, measures the oldest age and the rates over the
// last minute, and groups the parked events by topic and reason (numbers
// in the errors do not split groups).
func TestStatusCounts(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	// Published long ago: outside the window and the default horizon.
	s.seed(t, rows{n: 3000, createdAgo: "interval '2 hours'", published: "now() - interval '90 min'"})
	// Written 30 minutes ago, published 10 seconds ago: the publish rate.
	s.seed(t, rows{n: 2000, createdAgo: "interval '30 min'", published: "now() - interval '10 s'"})
	// The backlog: 1400 written 5 minutes ago (the oldest), 600 just now.
	s.seed(t, rows{n: 1400, createdAgo: "interval '5 min'"})
	s.seed(t, rows{n: 600, createdAgo: "interval '10 s'"})
	// Parked: two topics, two reasons.
	s.seed(t, rows{n: 1000, topic: "'orders.big'", createdAgo: "interval '20 min'", parked: "now() - interval '19 min' + g * interval '1 ms'", attempts: "1",
		lastErr: "'cannot be sent: message of ' || (2000000 + g) || ' bytes exceeds MaxMessageBytes 1000000'"})
	s.seed(t, rows{n: 500, topic: "'not a topic!'", createdAgo: "interval '20 min'", parked: "now() - interval '18 min'", attempts: "1",
		lastErr: "'cannot be sent: \"not a topic!\" is not a valid Kafka topic'"})
	// A row published in the future's clock skew must not make ages negative:
	// covered by greatest(); here the oldest is plainly 5 minutes old.

	st, err := admin.ReadStatus(s.ctx, s.pool, s.table, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st.Backlog != 2000 || st.BacklogCapped || st.Parked != 1500 {
		t.Errorf("backlog %d (capped %v), parked %d; want 2000, 1500", st.Backlog, st.BacklogCapped, st.Parked)
	}
	if st.OldestAge < 5*time.Minute || st.OldestAge > 6*time.Minute || st.OldestCreatedAt == nil {
		t.Errorf("oldest age %v (%v), want about 5m", st.OldestAge, st.OldestCreatedAt)
	}
	if st.WrittenPerSecond != 10 || st.PublishedPerSecond != 2000.0/60 {
		t.Errorf("rates: written %.2f/s, published %.2f/s; want 10/s (600 in a minute), 33.33/s (2000 in a minute)", st.WrittenPerSecond, st.PublishedPerSecond)
	}
	if st.RateWindow != time.Minute || st.RateHorizon != time.Hour || st.Lanes != 64 {
		t.Errorf("window %v, horizon %v, lanes %d", st.RateWindow, st.RateHorizon, st.Lanes)
	}
	want := []struct {
		topic, reason string
		n             int64
	}{
		{"orders.big", "cannot be sent: message of N bytes exceeds MaxMessageBytes N", 1000},
		{"not a topic!", `cannot be sent: "not a topic!" is not a valid Kafka topic`, 500},
	}
	if len(st.ParkedGroups) != len(want) {
		t.Fatalf("parked groups %+v", st.ParkedGroups)
	}
	for i, w := range want {
		g := st.ParkedGroups[i]
		if g.Topic != w.topic || g.Reason != w.reason || g.Count != w.n || g.Example == "" || g.LastParkedAt.Before(g.FirstParkedAt) {
			t.Errorf("group %d = %+v, want %s / %s: %d", i, g, w.topic, w.reason, w.n)
		}
	}
	// ParkedGroups -1 skips the groups, not the counts.
	if st, err := admin.ReadStatus(s.ctx, s.pool, s.table, &admin.StatusOptions{ParkedGroups: -1}); err != nil || st.Parked != 1500 || len(st.ParkedGroups) != 0 {
		t.Errorf("ParkedGroups -1: parked %d, groups %+v, %v", st.Parked, st.ParkedGroups, err)
	}
	// The JSON form is snake_case with durations in seconds.
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"backlog", "oldest_age_seconds", "published_per_second", "written_per_second", "parked", "parked_groups", "lanes_held", "sessions", "rate_window_seconds"} {
		if _, ok := m[k]; !ok {
			t.Errorf("status JSON has no %q: %s", k, b)
		}
	}
	if m["rate_window_seconds"] != 60.0 || m["backlog"] != 2000.0 {
		t.Errorf("status JSON: %s", b)
	}

	// An empty table: zeros, no oldest event.
	st, err = admin.ReadStatus(s.ctx, s.pool, newSetup(t).table, nil)
	if err != nil || st.Backlog != 0 || st.OldestAge != 0 || st.OldestCreatedAt != nil || st.Parked != 0 || len(st.ParkedGroups) != 0 {
		t.Errorf("empty table: %+v, %v", st, err)
	}
}

// An event written with a created_at ahead of the database's clock (a
// writer's clock or a restored row) has an age of 0, not a negative one.
func TestStatusOldestAgeNeverNegative(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	s.seed(t, rows{n: 1, createdAgo: "interval '-10 min'"})
	st, err := admin.ReadStatus(s.ctx, s.pool, s.table, nil)
	if err != nil || st.Backlog != 1 || st.OldestAge != 0 {
		t.Fatalf("status %+v, %v: want backlog 1, age 0", st, err)
	}
}

// blockingPublisher holds the relay's batch (and so its lanes) until
// released.
type blockingPublisher struct {
	entered chan struct{}
	release chan struct{}
}

func (p *blockingPublisher) Publish(ctx context.Context, msgs []relay.Message) error {
	select {
	case p.entered <- struct{}{}:
	default:
	}
	select {
	case <-p.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// A real relay with Listen, in the middle of a batch: the status shows the
// lane of the batch's key held by the relay's session (with its
// application_name), and the relay's listening session. Locks in another
// table's namespace do not show.
func TestStatusShowsLanesAndSessionsOfARealRelay(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	cfg := s.pool.Config().Copy()
	cfg.ConnConfig.RuntimeParams["application_name"] = "admin-test-relay"
	pool, err := pgxpool.NewWithConfig(s.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	pub := &blockingPublisher{entered: make(chan struct{}, 1), release: make(chan struct{})}
	r, err := relay.New(pool, pub, &relay.Config{Table: s.table, Listen: true, Retention: -1, PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// Another table's relay lock, held by this test: not ours.
	other, err := s.pool.Begin(s.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback(s.ctx)
	if _, err := other.Exec(s.ctx, "SELECT pg_advisory_xact_lock($1, 3)", locks.Namespace(outbox.Table{Schema: "elsewhere"}.String())); err != nil {
		t.Fatal(err)
	}

	uow, err := unitofwork.New(s.pool, &unitofwork.Config{Service: "shop", Table: s.table})
	if err != nil {
		t.Fatal(err)
	}
	if err := uow.Do(s.ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		return tx.Add(ctx, outbox.Event{AggregateType: "Order", AggregateID: "o-42", Type: "order.created.v1", Payload: map[string]int{"total": 1}})
	}); err != nil {
		t.Fatal(err)
	}
	var lane int
	if err := s.pool.QueryRow(s.ctx, "SELECT (hashtext('o-42') & 2147483647) % 64").Scan(&lane); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			close(pub.release)
			if err := r.Stop(context.Background()); err != nil {
				t.Error(err)
			}
		}
	}
	defer stop()
	select {
	case <-pub.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the relay never published")
	}
	// The listening session and the gauges' reporter may connect a moment
	// after the first batch: three sessions, one each.
	var st admin.Status
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		if st, err = admin.ReadStatus(s.ctx, s.pool, s.table, nil); err != nil {
			t.Fatal(err)
		}
		return len(st.Sessions) == 3, fmt.Sprintf("%d sessions, want 3 (holder, listener, reporter): %+v", len(st.Sessions), st.Sessions)
	})
	if len(st.LanesHeld) != 1 || st.LanesHeld[0].Lane != lane || st.LanesHeld[0].Since == nil {
		t.Fatalf("lanes held %+v, want lane %d of key o-42", st.LanesHeld, lane)
	}
	var holder, listener *admin.Session
	for i := range st.Sessions {
		if slices.Equal(st.Sessions[i].Lanes, []int{lane}) {
			holder = &st.Sessions[i]
		}
		if st.Sessions[i].Listening {
			listener = &st.Sessions[i]
		}
	}
	if holder == nil || holder.PID != st.LanesHeld[0].PID || holder.Application != "admin-test-relay" || holder.State != "idle in transaction" {
		t.Errorf("lane holder session %+v in %+v", holder, st.Sessions)
	}
	if listener == nil || listener.Application != "admin-test-relay" || len(listener.Lanes) != 0 || listener.PID == holder.PID {
		t.Errorf("listening session %+v in %+v", listener, st.Sessions)
	}
	reporters := 0
	for _, x := range st.Sessions {
		if x.StatsReporter {
			reporters++
			if x.Application != "admin-test-relay" || len(x.Lanes) != 0 || x.Listening {
				t.Errorf("stats reporter session %+v", x)
			}
		}
	}
	if reporters != 1 {
		t.Errorf("%d sessions report the gauges, want the relay's one: %+v", reporters, st.Sessions)
	}
	stop()
	// Stopped: no lanes held, nobody listening.
	st, err = admin.ReadStatus(s.ctx, s.pool, s.table, nil)
	if err != nil || len(st.LanesHeld) != 0 || st.Backlog != 0 {
		t.Errorf("after stop: %+v, %v", st, err)
	}
}
