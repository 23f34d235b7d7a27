package relay_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/fxoutbox/outbox/relay"
)

func collect(t *testing.T, reader sdkmetric.Reader) map[string]metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m.Data
		}
	}
	return out
}

func sumInt(a metricdata.Aggregation, attr attribute.KeyValue) int64 {
	var n int64
	switch d := a.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			if v, ok := p.Attributes.Value(attr.Key); attr.Key == "" || ok && v == attr.Value {
				n += p.Value
			}
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			n += p.Value
		}
	}
	return n
}

// The metrics an operator watches rise while the broker is down and fall
// back once it returns: backlog and age grow, transient errors count; then
// everything is published and the backlog drains to zero.
func TestMetrics(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()

	var down atomic.Bool
	down.Store(true)
	pub := relay.PublisherFunc(func(_ context.Context, msgs []relay.Message) error {
		if down.Load() {
			return errors.New("kafka: client has run out of available brokers to talk to")
		}
		return nil
	})
	s.write(t, "m.topic", 30, 3)
	r := s.relay(t, pub, relay.Config{MeterProvider: mp, PollInterval: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	if err := r.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Stop(s.ctx) }()
	time.Sleep(300 * time.Millisecond)

	m := collect(t, reader)
	if b := sumInt(m[relay.MetricBacklog], attribute.KeyValue{}); b != 30 {
		t.Errorf("backlog while down = %d, want 30", b)
	}
	if g, ok := m[relay.MetricOldestAge].(metricdata.Gauge[float64]); !ok || len(g.DataPoints) != 1 || g.DataPoints[0].Value < 0.2 {
		t.Errorf("oldest age while down = %+v, want >= 0.2s", m[relay.MetricOldestAge])
	}
	if e := sumInt(m[relay.MetricErrors], attribute.String("error.type", "transient")); e < 30 {
		t.Errorf("transient errors = %d, want at least one failed batch of 30", e)
	}
	if p := sumInt(m[relay.MetricPublished], attribute.KeyValue{}); p != 0 {
		t.Errorf("published while down = %d", p)
	}

	down.Store(false)
	waitUntil(t, 10*time.Second, "publishing after the broker returns", func() bool { return s.unpublished(t) == 0 })
	m = collect(t, reader)
	if p := sumInt(m[relay.MetricPublished], attribute.String("messaging.destination.name", "m.topic")); p != 30 {
		t.Errorf("published = %d, want 30", p)
	}
	if b := sumInt(m[relay.MetricBacklog], attribute.KeyValue{}); b != 0 {
		t.Errorf("backlog after recovery = %d, want 0", b)
	}
	if h, ok := m[relay.MetricLatency].(metricdata.Histogram[float64]); !ok || h.DataPoints[0].Count != 30 {
		t.Errorf("latency histogram = %+v, want 30 observations", m[relay.MetricLatency])
	}
	if h, ok := m[relay.MetricBatchSize].(metricdata.Histogram[int64]); !ok || h.DataPoints[0].Sum < 30 {
		t.Errorf("batch size histogram = %+v", m[relay.MetricBatchSize])
	}
	if _, ok := m[relay.MetricParked]; !ok {
		t.Error("no parked gauge")
	}
}
