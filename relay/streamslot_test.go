package relay_test

import (
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/fxoutbox/outbox/admin"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
)

// TestStreamCursorSlotDroppedWhileStreaming: the slot a running relay
// streams from is dropped under it (its session ended first), as when the
// relay reconnects to a promoted standby that never had the slot. The
// relay finds the slot missing, says so (StreamStatus.SlotLost,
// outbox.stream.slots_lost with outbox.stream.slot.loss=missing), publishes
// from its checkpoint while it creates a new slot, and streams again:
// every event arrives, each key in order; none published before the drop
// (the checkpoint held them) or after the new slot goes twice.
func TestStreamCursorSlotDroppedWhileStreaming(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	s.cursor(t)
	topic := testenv.Topic(t, s.kafka(t), 4)
	cons := testenv.Consume(t, s.kafka(t), topic)
	testenv.Streaming(t, s.pool, s.table, true)
	reader, mp := newReader(t)
	cfg := streamCursorConfig()
	cfg.MeterProvider = mp
	r := s.streamRelay(t, s.publisher(t), cfg)
	slotsLost := func() (missing, invalidated int64) {
		m := collect(t, reader)[relay.MetricStreamSlotsLost]
		return counter(m, relay.AttrSlotLoss.String("missing")), counter(m, relay.AttrSlotLoss.String("invalidated"))
	}
	if m, i := slotsLost(); m != 0 || i != 0 || r.StreamStatus().SlotLost != 0 {
		t.Fatalf("before any loss: slots lost missing %d, invalidated %d, StreamStatus.SlotLost %d; want 0", m, i, r.StreamStatus().SlotLost)
	}

	s.writeSeq(t, topic, 0, 50, 4)
	cons.WaitForDistinct(50, 30*time.Second)
	// A checkpoint that holds them all: nothing the stream published is
	// past it, so none may be sent again.
	waitUntil(t, 15*time.Second, "a checkpoint past every event", func() bool { return s.waiting(t) == 0 })
	if err := admin.DropSlot(s.ctx, s.pool, s.table, true); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 30*time.Second, "the relay to count the missing slot", func() bool { return r.StreamStatus().SlotLost == 1 })
	s.writeSeq(t, topic, 50, 50, 4) // polled, or in the new slot
	waitUntil(t, 60*time.Second, "the relay to stream from a new slot", func() bool { return r.StreamStatus().State == relay.Streaming })
	s.writeSeq(t, topic, 100, 20, 4)
	cons.WaitForDistinct(120, 30*time.Second)
	if m, i := slotsLost(); m != 1 || i != 0 || r.StreamStatus().SlotLost != 1 {
		t.Errorf("slots lost missing %d, invalidated %d, StreamStatus.SlotLost %d; want one missing", m, i, r.StreamStatus().SlotLost)
	}
	if _, ok := collect(t, reader)[relay.MetricStreamSlotsLost].(metricdata.Sum[int64]); !ok {
		t.Errorf("%s is not a counter", relay.MetricStreamSlotsLost)
	}
	// Stopped, the relay sends nothing more: every record it sent is read,
	// duplicates too.
	if err := r.Stop(s.ctx); err != nil {
		t.Fatal(err)
	}
	msgs := consumeAll(t, cons, s.kafka(t), topic)
	checkKeyOrder(t, msgs, 120)
	// The events published before the drop (the checkpoint held them) and
	// those written once the relay streamed again go once; those written
	// while it polled may go twice at the handover (see feed).
	count := map[int]int{}
	for _, m := range msgs {
		count[seqIn(m.Value)]++
	}
	for seq, n := range count {
		if n > 1 && (seq < 50 || seq >= 100) {
			t.Errorf("event seq %d sent %d times, want once: it was published before the slot was dropped or after the relay streamed again", seq, n)
		}
	}
	s.noRowUpdated(t)
}
