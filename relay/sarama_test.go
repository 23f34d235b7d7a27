package relay_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"

	"github.com/fxoutbox/outbox/relay"
)

// After Close, Publish and Ping fail with ErrPublisherClosed, without
// connecting; an empty Publish needs no connection at all.
func TestSaramaPublisherClosed(t *testing.T) {
	t.Parallel()
	pub, err := relay.NewSaramaPublisher([]string{"127.0.0.1:1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(context.Background(), nil); err != nil {
		t.Errorf("empty Publish = %v, want nil", err)
	}
	if err := pub.Close(); err != nil {
		t.Fatal(err)
	}
	msgs := []relay.Message{{EventID: uuid.New(), Topic: "t", Key: []byte("k"), Value: []byte(`{}`)}}
	if err := pub.Publish(context.Background(), msgs); !errors.Is(err, relay.ErrPublisherClosed) {
		t.Errorf("Publish after Close = %v, want ErrPublisherClosed", err)
	}
	if err := pub.Ping(context.Background()); !errors.Is(err, relay.ErrPublisherClosed) {
		t.Errorf("Ping after Close = %v, want ErrPublisherClosed", err)
	}
}
