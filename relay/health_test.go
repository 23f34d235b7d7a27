package relay_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/relay"
)

func TestHealth(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	var down atomic.Bool
	pub := relay.PublisherFunc(func(context.Context, []relay.Message) error {
		if down.Load() {
			return errors.New("kafka: client has run out of available brokers to talk to")
		}
		return nil
	})
	r := s.relay(t, pub, relay.Config{PollInterval: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	check := func(want string) {
		t.Helper()
		err := r.Health(s.ctx, 500*time.Millisecond)
		var he *relay.HealthError
		switch {
		case want == "" && err != nil:
			t.Errorf("Health = %v, want healthy", err)
		case want != "" && (!errors.As(err, &he) || he.Check != want):
			t.Errorf("Health = %v, want a failed %q check", err, want)
		}
	}
	check("relay") // not started
	if err := r.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	check("")
	down.Store(true)
	s.write(t, "h.topic", 3, 3)
	waitUntil(t, 5*time.Second, "a failed batch", func() bool { return r.Health(s.ctx, 0) != nil })
	check("broker")
	time.Sleep(600 * time.Millisecond)
	down.Store(false)
	waitUntil(t, 5*time.Second, "recovery", func() bool { return s.unpublished(t) == 0 })
	check("")
	// An event older than maxAge waiting (here: rows the relay cannot see
	// yet because a long transaction holds... simulated by backdating).
	if err := r.Stop(s.ctx); err != nil {
		t.Fatal(err)
	}
	check("relay")
	r2 := s.relay(t, pub, relay.Config{PollInterval: time.Hour})
	s.write(t, "h.topic", 1, 1)
	_, _ = s.pool.Exec(s.ctx, "UPDATE "+sqlname.Ident(s.table)+" SET created_at = now() - interval '1 minute' WHERE published_at IS NULL")
	down.Store(true)
	_ = r2.Start(s.ctx)
	defer func() { _ = r2.Stop(s.ctx) }()
	waitUntil(t, 5*time.Second, "the first batch to fail", func() bool { return r2.Health(s.ctx, 0) != nil })
	down.Store(false)
	err := r2.Health(s.ctx, 30*time.Second)
	var he *relay.HealthError
	if !errors.As(err, &he) || (he.Check != "backlog" && he.Check != "broker") {
		t.Errorf("Health with a minute-old event = %v, want broker or backlog failure", err)
	}
}

func TestSaramaPing(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	if err := s.publisher(t).Ping(s.ctx); err != nil {
		t.Errorf("Ping to the test broker: %v", err)
	}
	cfg := relay.DefaultSaramaConfig()
	cfg.Metadata.Retry.Max = 0
	down, _ := relay.NewSaramaPublisher([]string{"127.0.0.1:1"}, cfg)
	defer down.Close()
	if err := down.Ping(s.ctx); err == nil {
		t.Error("Ping to a closed port succeeded")
	}
}
