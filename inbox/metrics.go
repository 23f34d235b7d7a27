package inbox

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/semconv/v1.40.0/messagingconv"
)

// The inbox's metrics. Every one carries messaging.consumer.group.name and,
// except parked, messaging.destination.name (the topic).
const (
	// MetricProcessed counts records done, by outbox.inbox.outcome
	// (applied, duplicate, parked, ignored).
	MetricProcessed = "outbox.inbox.processed"
	// MetricErrors counts failed tries, by error.type and outbox.error.kind
	// (transient: retried, not counted; handler: counted as an attempt;
	// permanent: parked at once).
	MetricErrors = "outbox.inbox.errors"
	// MetricAge is the time from the record's timestamp (set when the relay
	// published it) to the end of its processing.
	MetricAge = "outbox.inbox.age"
	// MetricLag is, per partition this member owns, the records between
	// the committed position and the partition's high-water mark. On a
	// topic written in Kafka transactions (the relay's exactly-once mode)
	// each transaction's commit or abort marker, and aborted records, take
	// offsets too: there it stays at 1 or more once everything is applied.
	MetricLag = "outbox.inbox.lag"
	// MetricParked is the number of parked records of this consumer name.
	MetricParked = "outbox.inbox.parked"
	// MetricBatchSize is, with Config.BatchSize above 1, the records of
	// each batch transaction, by outbox.inbox.batch.outcome (committed, or
	// failed: its records were then applied alone).
	MetricBatchSize = "outbox.inbox.batch.size"
	// MetricConsumedMessages and MetricProcessDuration are the messaging
	// semantic conventions' consumer metrics.
	MetricConsumedMessages = "messaging.client.consumed.messages"
	MetricProcessDuration  = "messaging.process.duration"
)

var durationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}

type metrics struct {
	group     attribute.KeyValue
	processed metric.Int64Counter
	errors    metric.Int64Counter
	age       metric.Float64Histogram
	batch     metric.Int64Histogram
	consumedM messagingconv.ClientConsumedMessages
	duration  messagingconv.ProcessDuration
}

func newMetrics(meter metric.Meter, c *Consumer) (*metrics, error) {
	ms := &metrics{group: semconv.MessagingConsumerGroupName(c.cfg.Group)}
	var err error
	if ms.processed, err = meter.Int64Counter(MetricProcessed, metric.WithUnit("{record}"),
		metric.WithDescription("Records done, by outcome: applied, duplicate (skipped), parked, ignored (no route).")); err != nil {
		return nil, err
	}
	if ms.errors, err = meter.Int64Counter(MetricErrors, metric.WithUnit("{error}"),
		metric.WithDescription("Failed tries at a record, by error.type and outbox.error.kind (transient, handler, permanent).")); err != nil {
		return nil, err
	}
	if ms.age, err = meter.Float64Histogram(MetricAge, metric.WithUnit("s"),
		metric.WithDescription("Time from the record's timestamp to the end of its processing."),
		metric.WithExplicitBucketBoundaries(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)); err != nil {
		return nil, err
	}
	if ms.batch, err = meter.Int64Histogram(MetricBatchSize, metric.WithUnit("{record}"),
		metric.WithDescription("Records per batch transaction (Config.BatchSize above 1), by outcome: committed, or failed (its records then applied alone)."),
		metric.WithExplicitBucketBoundaries(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)); err != nil {
		return nil, err
	}
	if ms.consumedM, err = messagingconv.NewClientConsumedMessages(meter); err != nil {
		return nil, err
	}
	if ms.duration, err = messagingconv.NewProcessDuration(meter, metric.WithExplicitBucketBoundaries(durationBuckets...)); err != nil {
		return nil, err
	}
	lag, err := meter.Int64ObservableGauge(MetricLag, metric.WithUnit("{record}"),
		metric.WithDescription("Records between the committed position and the high-water mark, per partition this member owns."))
	if err != nil {
		return nil, err
	}
	parked, err := meter.Int64ObservableGauge(MetricParked, metric.WithUnit("{record}"),
		metric.WithDescription("Parked records of this consumer (counted up to 1,000,000)."))
	if err != nil {
		return nil, err
	}
	_, err = meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		c.lag.Range(func(k, v any) bool {
			topic, part, _ := strings.Cut(k.(string), "/")
			o.ObserveInt64(lag, v.(*atomic.Int64).Load(), metric.WithAttributes(ms.group,
				semconv.MessagingDestinationName(topic), semconv.MessagingDestinationPartitionID(part)))
			return true
		})
		if !c.isStarted() {
			return nil
		}
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		var n int64
		if err := c.db.QueryRow(ctx, c.sql.counted, c.cfg.Name).Scan(&n); err == nil {
			o.ObserveInt64(parked, n, metric.WithAttributes(ms.group))
		}
		return nil
	}, lag, parked)
	return ms, err
}

// batched records a batch transaction of n records on topic.
func (m *metrics) batched(ctx context.Context, topic string, n int, committed bool) {
	outcome := "committed"
	if !committed {
		outcome = "failed"
	}
	m.batch.Record(ctx, int64(n), metric.WithAttributes(m.group, semconv.MessagingDestinationName(topic),
		attribute.String("outbox.inbox.batch.outcome", outcome)))
}

func (m *metrics) consumed(ctx context.Context, topic string) {
	m.consumedM.Add(ctx, 1, "process", messagingconv.SystemKafka, m.group, semconv.MessagingDestinationName(topic))
}

func (m *metrics) done(ctx context.Context, msg *sarama.ConsumerMessage, outcome string, d time.Duration) {
	topic := semconv.MessagingDestinationName(msg.Topic)
	m.processed.Add(ctx, 1, metric.WithAttributes(m.group, topic, attribute.String("outbox.inbox.outcome", outcome)))
	attrs := []attribute.KeyValue{m.group, topic, semconv.MessagingDestinationPartitionID(strconv.Itoa(int(msg.Partition)))}
	if outcome == OutcomeParked {
		attrs = append(attrs, semconv.ErrorTypeKey.String(OutcomeParked))
	}
	m.duration.Record(ctx, d.Seconds(), "process", messagingconv.SystemKafka, attrs...)
	if !msg.Timestamp.IsZero() {
		m.age.Record(ctx, time.Since(msg.Timestamp).Seconds(), metric.WithAttributes(m.group, topic))
	}
}

func (m *metrics) failed(ctx context.Context, topic string, err error, kind string) {
	m.errors.Add(ctx, 1, metric.WithAttributes(m.group, semconv.MessagingDestinationName(topic),
		semconv.ErrorTypeKey.String(errorType(err)), attribute.String("outbox.error.kind", kind)))
}
