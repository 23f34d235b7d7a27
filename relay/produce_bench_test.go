package relay_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
)

// BenchmarkPublish measures SaramaPublisher alone: Publish calls of 500
// messages (256-byte payloads, 200 keys, the relay's headers) to a topic
// with 12 partitions on the broker at KAFKA_BROKERS, one caller and two
// concurrent callers (as a relay with Workers: 2). It reports events/s.
//
//	go test -run '^$' -bench Publish -benchtime 200x ./relay
func BenchmarkPublish(b *testing.B) {
	brokers := testenv.Brokers(b)
	topic := testenv.Topic(b, brokers, 12)
	pub, err := relay.NewSaramaPublisher(brokers, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	payload := []byte(`{"data":"` + strings.Repeat("x", 256-11) + `"}`)
	batch := func(caller int) []relay.Message {
		msgs := make([]relay.Message, 500)
		for i := range msgs {
			id := uuid.New()
			msgs[i] = relay.Message{EventID: id, Topic: topic, Key: []byte(fmt.Sprintf("c%d-k%d", caller, i%200)), Value: payload,
				Headers: []relay.Header{
					{Key: outbox.HeaderEventID, Value: []byte(id.String())},
					{Key: outbox.HeaderEventType, Value: []byte("acct.changed")},
					{Key: "traceparent", Value: []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")},
				}}
		}
		return msgs
	}
	for _, callers := range []int{1, 2} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			batches := make([][]relay.Message, callers)
			for c := range batches {
				batches[c] = batch(c)
			}
			b.ResetTimer()
			errs := make(chan error, callers)
			for c := range callers {
				go func() {
					for range b.N {
						if err := pub.Publish(context.Background(), batches[c]); err != nil {
							errs <- err
							return
						}
					}
					errs <- nil
				}()
			}
			for range callers {
				if err := <-errs; err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*callers*500)/b.Elapsed().Seconds(), "events/s")
		})
	}
}
