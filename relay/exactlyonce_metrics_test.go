package relay_test

import (
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
)

// TestExactlyOnceMetricsCountFencesAndAborts: two relays take one lane from
// each other on the broker. Relay b's takeover fences relay a's producer;
// a learns it only from the broker, at its next batch, whose transaction it
// aborts; then a takes the lane back, fencing b. Each relay's
// outbox.transactions, outbox.transaction.duration and outbox.fences count
// exactly those transactions and fences.
func TestExactlyOnceMetricsCountFencesAndAborts(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	topic := testenv.Topic(t, s.kafka(t), 1)
	cons := testenv.ConsumeCommitted(t, s.kafka(t), topic)
	readerA, mpA := newReader(t)
	readerB, mpB := newReader(t)
	a := s.relay(t, s.publisher(t), relay.Config{Delivery: relay.ExactlyOnce, Lanes: 1, MeterProvider: mpA})
	b := s.relay(t, s.publisher(t), relay.Config{Delivery: relay.ExactlyOnce, Lanes: 1, MeterProvider: mpB})
	defer func() { _ = a.Stop(s.ctx); _ = b.Stop(s.ctx) }()
	const n = 5
	runOnce := func(r *relay.Relay, who string, want int) {
		t.Helper()
		if got, err := r.RunOnce(s.ctx); err != nil || got != want {
			t.Fatalf("%s: RunOnce = %d, %v; want %d", who, got, err, want)
		}
	}
	outcome := func(o string) attribute.KeyValue { return relay.AttrTxnOutcome.String(o) }
	side := func(s string) attribute.KeyValue { return relay.AttrFenceSide.String(s) }
	type want struct {
		committed, aborted, unknown int64
		batches                     uint64 // duration observations of committed batches
		abortedBatches              uint64
		fencing, fenced             int64
	}
	verify := func(step, who string, reader *sdkmetric.ManualReader, w want) {
		t.Helper()
		m := collect(t, reader)
		txns, dur, fences := m[relay.MetricTransactions], m[relay.MetricTxnDuration], m[relay.MetricFences]
		got := want{
			committed:      counter(txns, outcome("committed")),
			aborted:        counter(txns, outcome("aborted")),
			unknown:        counter(txns, outcome("unknown")),
			batches:        observations(dur, outcome("committed")),
			abortedBatches: observations(dur, outcome("aborted")),
			fencing:        counter(fences, side("fencing")),
			fenced:         counter(fences, side("fenced")),
		}
		if got != w {
			t.Errorf("%s: relay %s's metrics = %+v, want %+v", step, who, got, w)
		}
	}

	s.write(t, topic, n, 2)
	runOnce(a, "relay a", n)
	// A lane nobody owned: one transaction registers a as its owner (no
	// duration: it is no batch), one publishes the batch.
	verify("a's first batch", "a", readerA, want{committed: 2, batches: 1})

	s.write(t, topic, n, 2)
	runOnce(b, "relay b, taking the lane over", n)
	verify("b took the lane", "b", readerB, want{committed: 2, batches: 1, fencing: 1})
	verify("b took the lane", "a", readerA, want{committed: 2, batches: 1})

	s.write(t, topic, n, 2)
	runOnce(a, "relay a, fenced", 0)
	verify("a found it was fenced", "a", readerA, want{committed: 2, batches: 1, aborted: 1, abortedBatches: 1, fenced: 1})
	// The aborted transaction says why: error.type, never empty.
	if d, ok := collect(t, readerA)[relay.MetricTransactions].(metricdata.Sum[int64]); ok {
		for _, p := range d.DataPoints {
			if v, _ := p.Attributes.Value(relay.AttrTxnOutcome); v.AsString() != "aborted" {
				continue
			}
			if typ, ok := p.Attributes.Value("error.type"); !ok || typ.AsString() == "" {
				t.Errorf("relay a's aborted transaction carries no error.type: %v", p.Attributes.ToSlice())
			}
		}
	}

	runOnce(a, "relay a, taking the lane back", n)
	verify("a took the lane back", "a", readerA, want{committed: 4, batches: 2, aborted: 1, abortedBatches: 1, fenced: 1, fencing: 1})
	eachOnce(t, cons, 3*n)
}

// TestExactlyOnceReplicasKeepTheirLanes: two started relays drain a
// backlog spread over four lanes. Each worker keeps the lanes it took over
// locked between its batches, so neither takes a lane the other owns: no
// producer is fenced and no transaction aborted, while a read_committed
// consumer gets every event once, each key in write order. Then relay a
// stops, which lets its lanes go at once: relay b delivers the events
// written after it, on every lane, taking a's lanes over (fencing a's
// producer, once per lane's owner).
func TestExactlyOnceReplicasKeepTheirLanes(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	topic := testenv.Topic(t, s.kafka(t), 4)
	cons := testenv.ConsumeCommitted(t, s.kafka(t), topic)
	const n, keys = 2000, 40
	s.write(t, topic, n, keys)
	readerA, mpA := newReader(t)
	readerB, mpB := newReader(t)
	// BatchTimeout 2 minutes: a kept connection that outlived its relay
	// would hold its lanes for its idle_session_timeout, over 2 minutes.
	cfg := relay.Config{Delivery: relay.ExactlyOnce, Lanes: 4, BatchSize: 500, PollInterval: 20 * time.Millisecond, BatchTimeout: 2 * time.Minute}
	cfgA, cfgB := cfg, cfg
	cfgA.MeterProvider, cfgB.MeterProvider = mpA, mpB
	// Relay a polls once a minute: once its lanes are drained it sleeps
	// and runs no batch that would let its kept lanes go, so at Stop it
	// still keeps the lanes of its last batches.
	cfgA.PollInterval = time.Minute
	a := s.relay(t, s.publisher(t), cfgA)
	b := s.relay(t, s.publisher(t), cfgB)
	defer func() { _ = a.Stop(s.ctx); _ = b.Stop(s.ctx) }()
	for _, r := range []*relay.Relay{a, b} {
		if err := r.Start(s.ctx); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, 60*time.Second, "the backlog published", func() bool { return s.unpublished(t) == 0 })
	fences := func(reader *sdkmetric.ManualReader) (fencing, fenced, aborted int64) {
		m := collect(t, reader)
		f := m[relay.MetricFences]
		return counter(f, relay.AttrFenceSide.String("fencing")), counter(f, relay.AttrFenceSide.String("fenced")),
			counter(m[relay.MetricTransactions], relay.AttrTxnOutcome.String("aborted"))
	}
	for _, x := range []struct {
		who    string
		reader *sdkmetric.ManualReader
	}{{"a", readerA}, {"b", readerB}} {
		if fencing, fenced, aborted := fences(x.reader); fencing+fenced+aborted != 0 {
			t.Errorf("relay %s while draining: fenced others %d times, was fenced %d times, aborted %d transactions; want none (each keeps its lanes)", x.who, fencing, fenced, aborted)
		}
	}

	if err := a.Stop(s.ctx); err != nil {
		t.Fatal(err)
	}
	s.writeRange(t, topic, n, n+keys, keys) // one more event per key: every lane
	// b takes a's lanes as soon as a stopped, long before a kept
	// connection left behind would time out.
	waitUntil(t, 60*time.Second, "the events after a stopped published by b", func() bool { return s.unpublished(t) == 0 })
	if err := b.Stop(s.ctx); err != nil {
		t.Fatal(err)
	}
	onceInKeyOrder(t, cons, n+keys)
}
