package relay_test

import (
	"strings"
	"testing"
	"time"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
)

// TestPoisonDoesNotHoldItsKeysEarlierEvents claims, in one batch, three
// good events of a key followed by a poison event of the same key (over
// MaxMessageBytes, known bad before any send). The good events come first:
// they are published in that batch, under Park and under Hold alike; only
// the key's events after the poison wait. (Before, the poison's key was
// blocked for the whole batch, its earlier events included: under Hold
// they came back with the poison in every batch and were never published.)
func TestPoisonDoesNotHoldItsKeysEarlierEvents(t *testing.T) {
	t.Parallel()
	for _, policy := range []outbox.PoisonPolicy{outbox.Park, outbox.Hold} {
		name := map[outbox.PoisonPolicy]string{outbox.Park: "park", outbox.Hold: "hold"}[policy]
		t.Run(name, func(t *testing.T) {
			s := newSetup(t)
			brokers := s.kafka(t)
			topic := testenv.Topic(t, brokers, 2)
			cons := testenv.Consume(t, brokers, topic)
			s.write(t, topic, 3, 1) // k0: seq 0, 1, 2
			s.insertPoison(t, topic, "k0", []byte(`{"blob":"`+strings.Repeat("x", 32<<10)+`"}`), nil)
			r := s.relay(t, s.publisher(t), relay.Config{MaxMessageBytes: 16 << 10, Poison: policy, PollInterval: time.Millisecond, MaxBackoff: 5 * time.Millisecond})
			for range 5 {
				if _, err := r.RunOnce(s.ctx); err != nil {
					t.Fatalf("RunOnce: %v", err)
				}
				time.Sleep(20 * time.Millisecond) // the poison's retry comes due
			}
			if n := s.count(t, "published_at IS NOT NULL"); n != 3 {
				t.Errorf("%s: %d events published after 5 batches, want the 3 written before the poison", name, n)
			}
			cons.WaitFor(3, 10*time.Second)
			checkKeyOrder(t, cons.Messages(), 3)
		})
	}
}
