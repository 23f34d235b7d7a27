package faulttest

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/fxoutbox/outbox/relay"
)

// envDelivery selects the delivery of the relays the battery starts:
// "exactly-once" runs every relay (in this process and the re-exec'd
// relay processes) with relay.ExactlyOnce, and the checks then read the
// topics read_committed and allow no duplicate. Unset (or
// "at-least-once"): the relays' default.
const envDelivery = "OUTBOX_TEST_DELIVERY"

var (
	deliveryOnce sync.Once
	deliveryVal  relay.Delivery
	deliveryErr  error
)

// testDelivery is the delivery OUTBOX_TEST_DELIVERY asks for; a bad value
// fails the test.
func testDelivery(t testing.TB) relay.Delivery {
	t.Helper()
	deliveryOnce.Do(func() {
		deliveryVal, deliveryErr = parseChoice(os.Getenv(envDelivery), relay.AtLeastOnce, relay.ExactlyOnce)
	})
	if deliveryErr != nil {
		t.Fatalf("%s: %v", envDelivery, deliveryErr)
	}
	return deliveryVal
}

// offsets returns, for each partition of topic, its high-water mark and
// its last stable offset (what a read_committed consumer may read up to:
// the first offset of the oldest transaction still open, else the
// high-water mark).
func offsets(ctx context.Context, client sarama.Client, topic string) (hw, lso map[int32]int64, err error) {
	parts, err := client.Partitions(topic)
	if err != nil {
		return nil, nil, err
	}
	hw, lso = map[int32]int64{}, map[int32]int64{}
	for _, p := range parts {
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		leader, err := client.Leader(topic, p)
		if err != nil {
			return nil, nil, err
		}
		for _, iso := range []sarama.IsolationLevel{sarama.ReadUncommitted, sarama.ReadCommitted} {
			req := sarama.NewOffsetRequest(client.Config().Version)
			req.IsolationLevel = iso
			req.AddBlock(topic, p, sarama.OffsetNewest, 1)
			resp, err := leader.GetAvailableOffsets(req)
			if err != nil {
				return nil, nil, err
			}
			blk := resp.GetBlock(topic, p)
			if blk == nil {
				return nil, nil, sarama.ErrIncompleteResponse
			}
			if blk.Err != sarama.ErrNoError {
				return nil, nil, blk.Err
			}
			if iso == sarama.ReadUncommitted {
				hw[p] = blk.Offset
			} else {
				lso[p] = blk.Offset
			}
		}
	}
	return hw, lso, nil
}

// offsetClient is a sarama client for offsets, closed at cleanup.
func offsetClient(t testing.TB, brokers []string) sarama.Client {
	t.Helper()
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V2_8_0_0
	cfg.Metadata.Retry.Max = 10
	cfg.Metadata.Retry.Backoff = 200 * time.Millisecond
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		t.Fatalf("kafka client: %v", err)
	}
	t.Cleanup(func() { _ = client.Close() })
	return client
}

// settled waits until no transaction is open on topic (every partition's
// last stable offset is its high-water mark), for at most timeout, and
// reports whether it happened.
func settled(t testing.TB, client sarama.Client, topic string, timeout time.Duration) bool {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		hw, lso, err := offsets(context.Background(), client, topic)
		if err == nil {
			open := false
			for p := range hw {
				if lso[p] < hw[p] {
					open = true
				}
			}
			if !open {
				return true
			}
		}
		if time.Now().After(deadline) {
			return false
		}
		_ = client.RefreshMetadata(topic)
		time.Sleep(50 * time.Millisecond)
	}
}
