package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Metric names (OpenTelemetry, unit in brackets). Every instrument carries
// the attribute outbox.table; per-topic ones also messaging.destination.name.
//
//	outbox.events.published     counter   [{event}]  events acknowledged by the broker and marked
//	outbox.publish.errors       counter   [{event}]  failed events; error.type = transient | permanent
//	outbox.batch.size           histogram [{event}]  events per claimed batch
//	outbox.publish.latency      histogram [s]        from the writing transaction's start to the broker's ack
//	outbox.backlog              gauge     [{event}]  unpublished, unparked events (counted up to 1,000,000)
//	outbox.oldest.age           gauge     [s]        age of the oldest unpublished, unparked event (0 when none)
//	outbox.parked               gauge     [{event}]  parked events
//
// The gauges cost one statement per collection that reads only the partial
// indexes on unpublished and on parked rows, never the whole table.
const (
	MetricPublished = "outbox.events.published"
	MetricErrors    = "outbox.publish.errors"
	MetricBatchSize = "outbox.batch.size"
	MetricLatency   = "outbox.publish.latency"
	MetricBacklog   = "outbox.backlog"
	MetricOldestAge = "outbox.oldest.age"
	MetricParked    = "outbox.parked"
)

type metrics struct {
	table     attribute.KeyValue
	published metric.Int64Counter
	errors    metric.Int64Counter
	batch     metric.Int64Histogram
	latency   metric.Float64Histogram
	// register starts the gauges' collection callback (at Start; Stop
	// unregisters it).
	register func() (metric.Registration, error)
}

func newMetrics(r *Relay, mp metric.MeterProvider) (*metrics, error) {
	meter := mp.Meter("github.com/fxoutbox/outbox/relay")
	ms := &metrics{table: attribute.String("outbox.table", r.cfg.Table.String())}
	var errs []error
	var err error
	ms.published, err = meter.Int64Counter(MetricPublished, metric.WithUnit("{event}"), metric.WithDescription("Events acknowledged by the broker and marked published."))
	errs = append(errs, err)
	ms.errors, err = meter.Int64Counter(MetricErrors, metric.WithUnit("{event}"), metric.WithDescription("Events that failed to publish, by error.type (transient or permanent)."))
	errs = append(errs, err)
	ms.batch, err = meter.Int64Histogram(MetricBatchSize, metric.WithUnit("{event}"), metric.WithDescription("Events per claimed batch."),
		metric.WithExplicitBucketBoundaries(1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000))
	errs = append(errs, err)
	ms.latency, err = meter.Float64Histogram(MetricLatency, metric.WithUnit("s"), metric.WithDescription("Time from the writing transaction's start to the broker's acknowledgement."),
		metric.WithExplicitBucketBoundaries(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300))
	errs = append(errs, err)
	backlog, err := meter.Int64ObservableGauge(MetricBacklog, metric.WithUnit("{event}"), metric.WithDescription("Unpublished, unparked events (counted up to 1,000,000)."))
	errs = append(errs, err)
	age, err := meter.Float64ObservableGauge(MetricOldestAge, metric.WithUnit("s"), metric.WithDescription("Age of the oldest unpublished, unparked event; 0 when there is none."))
	errs = append(errs, err)
	parked, err := meter.Int64ObservableGauge(MetricParked, metric.WithUnit("{event}"), metric.WithDescription("Parked events."))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	ms.register = func() (metric.Registration, error) {
		return meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
			st, err := r.Stats(ctx)
			if err != nil {
				return err
			}
			attrs := metric.WithAttributes(ms.table)
			o.ObserveInt64(backlog, st.Backlog, attrs)
			o.ObserveFloat64(age, st.OldestAge.Seconds(), attrs)
			o.ObserveInt64(parked, st.Parked, attrs)
			return nil
		}, backlog, age, parked)
	}
	return ms, nil
}

// Stats is a snapshot of a table's state.
type Stats struct {
	Backlog   int64         // unpublished, unparked events, counted up to 1,000,000
	OldestAge time.Duration // age of the oldest of them; 0 when there is none
	Parked    int64         // parked events
}

// Stats reads the backlog, the age of its oldest event and the number of
// parked events in one statement that reads only the partial indexes.
func (r *Relay) Stats(ctx context.Context) (Stats, error) {
	var st Stats
	tx, err := r.db.Begin(ctx)
	if err != nil {
		return st, fmt.Errorf("relay: stats: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var ageSec float64
	if err := tx.QueryRow(ctx, r.q.stats).Scan(&st.Backlog, &ageSec, &st.Parked); err != nil {
		return st, fmt.Errorf("relay: stats of %s: %w", r.cfg.Table, err)
	}
	st.OldestAge = time.Duration(ageSec * float64(time.Second))
	return st, nil
}

// record updates the per-batch instruments after a commit.
func (m *metrics) record(ctx context.Context, rows []row, errs []error, acked time.Time) {
	if m == nil {
		return
	}
	table := metric.WithAttributes(m.table)
	m.batch.Record(ctx, int64(len(rows)), table)
	perTopic := map[string]int64{}
	var transient, permanent int64
	for i, err := range errs {
		switch {
		case err == nil:
			perTopic[rows[i].topic]++
			m.latency.Record(ctx, acked.Sub(rows[i].createdAt).Seconds(), table)
		case IsPermanent(err):
			permanent++
		case !errors.Is(err, ErrHeld):
			transient++
		}
	}
	for topic, n := range perTopic {
		m.published.Add(ctx, n, metric.WithAttributes(m.table, attribute.String("messaging.destination.name", topic)))
	}
	if transient > 0 {
		m.errors.Add(ctx, transient, metric.WithAttributes(m.table, attribute.String("error.type", "transient")))
	}
	if permanent > 0 {
		m.errors.Add(ctx, permanent, metric.WithAttributes(m.table, attribute.String("error.type", "permanent")))
	}
}
