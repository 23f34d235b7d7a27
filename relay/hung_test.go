package relay_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/fxoutbox/outbox/relay"
)

// silentBroker accepts TCP connections and never answers: a hung broker.
func silentBroker(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// A broker that accepts connections but never answers must not hold the
// relay's row locks longer than BatchTimeout: the batch is abandoned, its
// rows stay unpublished and another relay can take them at once.
func TestHungBrokerIsBoundedByBatchTimeout(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	s.write(t, "hung.topic", 10, 10)
	cfg := relay.DefaultSaramaConfig()
	cfg.Net.DialTimeout, cfg.Net.ReadTimeout, cfg.Net.WriteTimeout = time.Second, time.Second, time.Second
	cfg.Metadata.Timeout = 3 * time.Second
	pub, err := relay.NewSaramaPublisher([]string{silentBroker(t)}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	r := s.relay(t, pub, relay.Config{BatchTimeout: time.Second})
	// Ended by BatchTimeout, not by the client's own timeouts: the batch's
	// context ran out (how long that took depends on the machine's load).
	n, err := r.RunOnce(s.ctx)
	if !errors.Is(err, context.DeadlineExceeded) || n != 0 {
		t.Fatalf("RunOnce = %d, %v; want nothing published and the batch ended by BatchTimeout (context.DeadlineExceeded)", n, err)
	}
	if u := s.unpublished(t); u != 10 {
		t.Fatalf("%d unpublished, want 10", u)
	}
	// The locks are gone: another relay publishes everything now.
	var got int
	other := s.relay(t, relay.PublisherFunc(func(_ context.Context, msgs []relay.Message) error { got += len(msgs); return nil }), relay.Config{})
	if n, err := other.RunOnce(s.ctx); err != nil || n != 10 {
		t.Fatalf("other relay: %d, %v; want 10", n, err)
	}
}
