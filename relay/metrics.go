package relay

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/semconv/v1.40.0/messagingconv"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/locks"
	"github.com/fxoutbox/outbox/internal/tablesql"
	"github.com/fxoutbox/outbox/relay/internal/claim"
	"github.com/fxoutbox/outbox/relay/internal/eo"
	"github.com/fxoutbox/outbox/relay/internal/failure"
	"github.com/fxoutbox/outbox/relay/internal/tablestats"
)

// Metric names (OpenTelemetry; unit in brackets; the name a Prometheus
// exporter shows after the arrow). Every instrument carries outbox.table.
//
// Per relay, in memory (reported while the database is down):
//
//	outbox.events.published  counter   [{event}]   -> outbox_events_published_total
//	    events acknowledged by the broker and marked; messaging.destination.name
//	outbox.publish.errors    counter   [{event}]   -> outbox_publish_errors_total
//	    events that failed to publish; messaging.destination.name, error.type (the cause,
//	    see docs/operating.md), outbox.error.kind (transient: retried, not charged | permanent: charged)
//	outbox.errors            counter   [{error}]   -> outbox_errors_total
//	    failed steps: one per failed claim, publish (a batch with failed events; the first
//	    one's error.type), mark, commit, cleanup or table statistics read; outbox.step, error.type
//	outbox.step.duration     histogram [s]         -> outbox_step_duration_seconds
//	    duration of each step of a batch: outbox.step = claim (begin, lock lanes, read rows),
//	    publish (all sends of the batch), mark (mark published, charge failures), commit; and
//	    cleanup (one deletion of old rows); error.type when it failed
//	outbox.batch.size        histogram [{event}]   -> outbox_batch_size
//	    events per claimed batch
//	outbox.publish.latency   histogram [s]         -> outbox_publish_latency_seconds
//	    from the event's created_at to the broker's acknowledgement
//	outbox.last_publish.age  gauge     [s]         -> outbox_last_publish_age_seconds
//	    time since this relay last committed a published event (since Start before its
//	    first); take the min over replicas
//	messaging.client.sent.messages      counter   [{message}] -> messaging_client_sent_messages_total
//	    messages handed to the broker; messaging.system=kafka, messaging.operation.name=publish,
//	    messaging.destination.name, error.type when not acknowledged
//	messaging.client.operation.duration histogram [s] -> messaging_client_operation_duration_seconds
//	    one observation per destination per Publisher call (a call sends one batch);
//	    messaging.system, messaging.operation.name=publish, messaging.operation.type=send,
//	    messaging.destination.name, error.type when a message to it failed
//
// Per relay with Delivery ExactlyOnce:
//
//	outbox.transactions      counter   [{transaction}] -> outbox_transactions_total
//	    Kafka transactions the relay's workers ended (batches and lane takeovers);
//	    outbox.transaction.outcome = committed | aborted | unknown (a commit whose answer
//	    was lost: the next InitProducerId decides it); error.type unless committed
//	outbox.transaction.duration histogram [s]  -> outbox_transaction_duration_seconds
//	    from a batch's claim to the end of its Kafka transaction; outbox.transaction.outcome
//	outbox.fences            counter   [{fence}]   -> outbox_fences_total
//	    lanes changing owner: outbox.fence.side = fencing (this relay's worker took lanes
//	    over, fencing their owner) | fenced (this relay's worker found it was fenced)
//
// Per relay with Progress ProgressCursor, on a partitioned table (after its first upkeep round):
//
//	outbox.partitions.kept   gauge     [{partition}] -> outbox_partitions_kept
//	    partitions past their upper bound that the last upkeep kept, by
//	    outbox.partition.reason = retention | undelivered | parked | older | lock_timeout | ahead
//
// Per relay in Stream mode:
//
//	outbox.stream.lag        gauge     [By]        -> outbox_stream_lag_bytes
//	    WAL between the server's end and the position this relay confirmed (0 unless it
//	    streams): what the slot pins on the server
//	outbox.stream.delay      gauge     [s]         -> outbox_stream_delay_seconds
//	    age of the oldest transaction received and not yet published (0 unless it streams)
//	outbox.stream.state      gauge     [{relay}]   -> outbox_stream_state
//	    1 for the relay's state (outbox.stream.state = starting, streaming, standby,
//	    fallback or retrying), 0 for the others
//	outbox.stream.slots_lost counter   [{slot}]    -> outbox_stream_slots_lost_total
//	    times this relay found its slot lost and resumed from the table while it made
//	    a new one: outbox.stream.slot.loss = invalidated (wal_status lost: past
//	    max_slot_wal_keep_size) | missing (gone after this relay had used it: dropped,
//	    or a promoted standby that never had it); each loss once, however often the
//	    relay meets the lost slot again before it has a usable one
//
// Per table, reported by one replica only (see below):
//
//	outbox.backlog           gauge     [{event}]   -> outbox_backlog
//	    unpublished, unparked events (counted up to 1,000,000)
//	outbox.oldest.age        gauge     [s]         -> outbox_oldest_age_seconds
//	    age of the oldest unpublished, unparked event; 0 when none (never negative: an
//	    event whose created_at is in the future counts as 0 and is logged)
//	outbox.parked            gauge     [{event}]   -> outbox_parked
//	    parked events by messaging.destination.name and error.type (the reason they were
//	    parked, read from the start of last_error; _OTHER for rows parked before it was stored)
//
// Per process, when the DB is a *pgxpool.Pool (its pgxpool.Stat):
//
//	db.client.connection.count     updowncounter [{connection}] -> db_client_connection_count
//	    db.client.connection.state = idle | used, db.client.connection.pool.name (host:port/database)
//	db.client.connection.max       updowncounter [{connection}] -> db_client_connection_max
//	outbox.db.acquire.wait         counter [s]   -> outbox_db_acquire_wait_seconds_total
//	    total time acquires waited for a free connection (Stat.EmptyAcquireWaitTime)
//
// The table-wide gauges describe the table, not the replica, so exactly one
// relay reports them: the one holding a session-level advisory lock
// (pg_try_advisory_lock) on a connection it takes out of the pool for that.
// When that connection fails, the relay drops it and any replica may take
// the lock over at its next try. The reporter reads the statistics once per
// StatsInterval, or less often when a read is slow: it waits at least ten
// times as long as the last read took (two statements on the partial
// indexes: unpublished and parked rows), and scrapes read its cached
// result, so scrapes cost no query.
// Other replicas try the lock once per StatsInterval. With a DB that is not
// a *pgxpool.Pool every relay reports them: aggregate with max, not sum.
// While the database is unreachable nothing table-wide is reported;
// outbox.errors and outbox.last_publish.age keep alerts firing.
const (
	MetricPublished         = "outbox.events.published"
	MetricErrors            = "outbox.publish.errors"
	MetricStepErrors        = "outbox.errors"
	MetricStepDuration      = "outbox.step.duration"
	MetricBatchSize         = "outbox.batch.size"
	MetricLatency           = "outbox.publish.latency"
	MetricLastPublishAge    = "outbox.last_publish.age"
	MetricSentMessages      = "messaging.client.sent.messages"
	MetricOperationDuration = "messaging.client.operation.duration"
	MetricBacklog           = "outbox.backlog"
	MetricOldestAge         = "outbox.oldest.age"
	MetricParked            = "outbox.parked"
	MetricPoolConnections   = "db.client.connection.count"
	MetricPoolMax           = "db.client.connection.max"
	MetricPoolAcquireWait   = "outbox.db.acquire.wait"
	MetricStreamLag         = "outbox.stream.lag"
	MetricStreamDelay       = "outbox.stream.delay"
	MetricStreamState       = "outbox.stream.state"
	MetricStreamSlotsLost   = "outbox.stream.slots_lost"
	MetricTransactions      = "outbox.transactions"
	MetricTxnDuration       = "outbox.transaction.duration"
	MetricFences            = "outbox.fences"
	MetricPartitionsKept    = "outbox.partitions.kept"
)

// The steps of outbox.step.duration and outbox.errors (attribute outbox.step).
const (
	StepClaim   = "claim"
	StepPublish = "publish"
	StepMark    = "mark"
	StepCommit  = "commit"
	StepCleanup = "cleanup"
	StepStats   = "stats"
)

// Attribute keys of the outbox's own metrics.
const (
	AttrTable     = attribute.Key("outbox.table")
	AttrStep      = attribute.Key("outbox.step")
	AttrErrorKind = attribute.Key("outbox.error.kind")
	// AttrTxnOutcome is committed, aborted or unknown (outbox.transactions,
	// outbox.transaction.duration).
	AttrTxnOutcome = attribute.Key("outbox.transaction.outcome")
	// AttrFenceSide is fencing or fenced (outbox.fences).
	AttrFenceSide = attribute.Key("outbox.fence.side")
	// AttrSlotLoss is how the stream's slot was lost (outbox.stream.slots_lost):
	// invalidated or missing.
	AttrSlotLoss = attribute.Key("outbox.stream.slot.loss")
	// AttrPartitionReason is why partitions stay (outbox.partitions.kept):
	// retention, undelivered, parked, older, lock_timeout or ahead.
	AttrPartitionReason = attribute.Key("outbox.partition.reason")
)

// durationBuckets are the semantic conventions' boundaries for messaging
// durations; stepBuckets reach lower (statements take microseconds) and
// up to BatchTimeout's range.
var (
	durationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}
	stepBuckets     = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}
)

type metrics struct {
	table     attribute.KeyValue
	published metric.Int64Counter
	errors    metric.Int64Counter
	failures  metric.Int64Counter
	steps     metric.Float64Histogram
	batch     metric.Int64Histogram
	latency   metric.Float64Histogram
	sent      messagingconv.ClientSentMessages
	opDur     messagingconv.ClientOperationDuration
	// ExactlyOnce only (nil otherwise).
	txns   metric.Int64Counter
	txnDur metric.Float64Histogram
	fences metric.Int64Counter

	lastPublish atomic.Int64 // unix nanoseconds of the last commit of a published event, or of Start

	// register starts the observable instruments' callback (at Start; Stop
	// unregisters it).
	register func() (metric.Registration, error)
}

// newMetrics creates the relay's instruments. It is a flat list of
// instrument declarations (name, unit, description) and their one
// callback, kept together so that the metric names read as a table.
func newMetrics(r *Relay, mp metric.MeterProvider) (*metrics, error) {
	meter := mp.Meter("github.com/fxoutbox/outbox/relay")
	ms := &metrics{
		table: AttrTable.String(r.cfg.Table.String()),
	}
	var errs []error
	add := func(err error) { errs = append(errs, err) }
	var err error
	ms.published, err = meter.Int64Counter(MetricPublished, metric.WithUnit("{event}"), metric.WithDescription("Events acknowledged by the broker and marked published."))
	add(err)
	ms.errors, err = meter.Int64Counter(MetricErrors, metric.WithUnit("{event}"), metric.WithDescription("Events that failed to publish, by error.type (cause) and outbox.error.kind (transient or permanent)."))
	add(err)
	ms.failures, err = meter.Int64Counter(MetricStepErrors, metric.WithUnit("{error}"), metric.WithDescription("Failed relay steps (claim, publish, mark, commit, cleanup, stats), by outbox.step and error.type."))
	add(err)
	ms.steps, err = meter.Float64Histogram(MetricStepDuration, metric.WithUnit("s"), metric.WithDescription("Duration of a relay step (claim, publish, mark, commit, cleanup), by outbox.step; error.type when it failed."),
		metric.WithExplicitBucketBoundaries(stepBuckets...))
	add(err)
	ms.batch, err = meter.Int64Histogram(MetricBatchSize, metric.WithUnit("{event}"), metric.WithDescription("Events per claimed batch."),
		metric.WithExplicitBucketBoundaries(1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000))
	add(err)
	ms.latency, err = meter.Float64Histogram(MetricLatency, metric.WithUnit("s"), metric.WithDescription("Time from the event's created_at to the broker's acknowledgement."),
		metric.WithExplicitBucketBoundaries(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300))
	add(err)
	ms.sent, err = messagingconv.NewClientSentMessages(meter)
	add(err)
	ms.opDur, err = messagingconv.NewClientOperationDuration(meter, metric.WithExplicitBucketBoundaries(durationBuckets...))
	add(err)
	if r.cfg.Delivery == ExactlyOnce {
		ms.txns, err = meter.Int64Counter(MetricTransactions, metric.WithUnit("{transaction}"), metric.WithDescription("Kafka transactions ended by the relay's workers, by outbox.transaction.outcome (committed, aborted, unknown)."))
		add(err)
		ms.txnDur, err = meter.Float64Histogram(MetricTxnDuration, metric.WithUnit("s"), metric.WithDescription("From a batch's claim to the end of its Kafka transaction, by outbox.transaction.outcome."),
			metric.WithExplicitBucketBoundaries(stepBuckets...))
		add(err)
		ms.fences, err = meter.Int64Counter(MetricFences, metric.WithUnit("{fence}"), metric.WithDescription("Lanes changing owner: outbox.fence.side = fencing (a worker took lanes over) or fenced (a worker found it was fenced)."))
		add(err)
	}
	lastAge, err := meter.Float64ObservableGauge(MetricLastPublishAge, metric.WithUnit("s"), metric.WithDescription("Time since this relay last committed a published event (since its start before the first)."))
	add(err)
	backlog, err := meter.Int64ObservableGauge(MetricBacklog, metric.WithUnit("{event}"), metric.WithDescription("Unpublished, unparked events (counted up to 1,000,000); reported by one relay per table."))
	add(err)
	age, err := meter.Float64ObservableGauge(MetricOldestAge, metric.WithUnit("s"), metric.WithDescription("Age of the oldest unpublished, unparked event; 0 when there is none; reported by one relay per table."))
	add(err)
	parked, err := meter.Int64ObservableGauge(MetricParked, metric.WithUnit("{event}"), metric.WithDescription("Parked events by topic and error.type; reported by one relay per table."))
	add(err)
	observed := []metric.Observable{lastAge, backlog, age, parked}
	var partsKept metric.Int64ObservableGauge
	if p, fixed := r.cfg.fixedProgress(); !fixed || p == ProgressCursor {
		partsKept, err = meter.Int64ObservableGauge(MetricPartitionsKept, metric.WithUnit("{partition}"), metric.WithDescription("Partitions of a partitioned table past their upper bound that the relay's last upkeep kept, by outbox.partition.reason."))
		add(err)
		observed = append(observed, partsKept)
	}
	var lag metric.Int64ObservableGauge
	var delay metric.Float64ObservableGauge
	var state metric.Int64ObservableGauge
	var slotsLost metric.Int64ObservableCounter
	if r.cfg.Mode == Stream {
		lag, err = meter.Int64ObservableGauge(MetricStreamLag, metric.WithUnit("By"), metric.WithDescription("WAL between the server's end and the position the streaming relay confirmed: what its slot pins."))
		add(err)
		delay, err = meter.Float64ObservableGauge(MetricStreamDelay, metric.WithUnit("s"), metric.WithDescription("Age of the oldest transaction the streaming relay received and has not published."))
		add(err)
		state, err = meter.Int64ObservableGauge(MetricStreamState, metric.WithUnit("{relay}"), metric.WithDescription("1 for the stream's state (outbox.stream.state), 0 for the others."))
		add(err)
		slotsLost, err = meter.Int64ObservableCounter(MetricStreamSlotsLost, metric.WithUnit("{slot}"), metric.WithDescription("Times the streaming relay found its slot lost (outbox.stream.slot.loss: invalidated, missing) and resumed from the table while it made a new one."))
		add(err)
		observed = append(observed, lag, delay, state, slotsLost)
	}
	pool, _ := r.db.(*pgxpool.Pool)
	var conns, maxConns metric.Int64ObservableUpDownCounter
	var wait metric.Float64ObservableCounter
	var poolName attribute.KeyValue
	if pool != nil {
		conns, err = meter.Int64ObservableUpDownCounter(MetricPoolConnections, metric.WithUnit("{connection}"), metric.WithDescription("Connections of the relay's pgxpool.Pool, by db.client.connection.state (idle, used)."))
		add(err)
		maxConns, err = meter.Int64ObservableUpDownCounter(MetricPoolMax, metric.WithUnit("{connection}"), metric.WithDescription("The most connections the relay's pgxpool.Pool opens."))
		add(err)
		wait, err = meter.Float64ObservableCounter(MetricPoolAcquireWait, metric.WithUnit("s"), metric.WithDescription("Total time acquires from the relay's pgxpool.Pool waited for a free connection."))
		add(err)
		observed = append(observed, conns, maxConns, wait)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	ms.register = func() (metric.Registration, error) {
		ms.lastPublish.Store(time.Now().UnixNano())
		if pool != nil { // not in New, which must not touch the pool
			cc := pool.Config().ConnConfig
			poolName = attribute.String("db.client.connection.pool.name", cc.Host+":"+strconv.Itoa(int(cc.Port))+"/"+cc.Database)
		}
		return meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
			table := metric.WithAttributes(ms.table)
			o.ObserveFloat64(lastAge, max(0, time.Since(time.Unix(0, ms.lastPublish.Load())).Seconds()), table)
			if st, ok := r.stats.Snapshot(); ok {
				o.ObserveInt64(backlog, st.Backlog, table)
				o.ObserveFloat64(age, st.Age, table)
				for _, p := range st.Parked {
					o.ObserveInt64(parked, p.N, metric.WithAttributes(ms.table, semconv.MessagingDestinationName(p.Topic), semconv.ErrorTypeKey.String(p.Reason)))
				}
			}
			if kept, ok := r.keptByReason(); ok && partsKept != nil {
				for reason, n := range kept {
					o.ObserveInt64(partsKept, n, metric.WithAttributes(ms.table, AttrPartitionReason.String(reason)))
				}
			}
			if r.cfg.Mode == Stream {
				st := r.stream.status()
				o.ObserveInt64(lag, st.LagBytes, table)
				o.ObserveFloat64(delay, st.Lag.Seconds(), table)
				for _, s := range []StreamState{StreamStarting, Streaming, StreamStandby, StreamFallback, StreamRetrying} {
					v := int64(0)
					if s == st.State {
						v = 1
					}
					o.ObserveInt64(state, v, metric.WithAttributes(ms.table, attribute.String("outbox.stream.state", s.String())))
				}
				o.ObserveInt64(slotsLost, r.stream.slotInvalidated.Load(), metric.WithAttributes(ms.table, AttrSlotLoss.String(slotInvalidated)))
				o.ObserveInt64(slotsLost, r.stream.slotMissing.Load(), metric.WithAttributes(ms.table, AttrSlotLoss.String(slotMissing)))
			}
			if pool != nil {
				s := pool.Stat()
				o.ObserveInt64(conns, int64(s.IdleConns()), metric.WithAttributes(ms.table, poolName, attribute.String("db.client.connection.state", "idle")))
				o.ObserveInt64(conns, int64(s.AcquiredConns()), metric.WithAttributes(ms.table, poolName, attribute.String("db.client.connection.state", "used")))
				o.ObserveInt64(maxConns, int64(s.MaxConns()), metric.WithAttributes(ms.table, poolName))
				o.ObserveFloat64(wait, s.EmptyAcquireWaitTime().Seconds(), metric.WithAttributes(ms.table, poolName))
			}
			return nil
		}, observed...)
	}
	return ms, nil
}

// Stats is a snapshot of a table's state.
type Stats struct {
	Backlog   int64         // unpublished, unparked events, counted up to 1,000,000
	OldestAge time.Duration // age of the oldest of them; 0 when there is none or its created_at is in the future
	Parked    int64         // parked events
}

// Stats reads the backlog, the age of its oldest event and the number of
// parked events in one statement that reads only the partial indexes.
func (r *Relay) Stats(ctx context.Context) (Stats, error) {
	tx, err := r.db.Begin(ctx)
	if err != nil {
		return Stats{}, fmt.Errorf("relay: stats: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	c, err := tablesql.ReadCounts(ctx, tx, r.cfg.Table)
	if err != nil {
		return Stats{}, fmt.Errorf("relay: stats: %w", err)
	}
	return Stats{Backlog: c.Backlog, OldestAge: c.OldestAge, Parked: c.Parked}, nil
}

// lap records the duration of a database step that began at start and,
// when it failed, counts the error; it returns the time it ended and err,
// marked so that failure.Type names its database cause.
func (m *metrics) lap(ctx context.Context, step string, start time.Time, err error) (time.Time, error) {
	now := time.Now()
	if err != nil && !errors.As(err, new(*failure.DBStep)) && !errors.As(err, new(*kafkaStepError)) {
		err = &failure.DBStep{Err: err}
	}
	m.step(ctx, step, now.Sub(start), err)
	return now, err
}

// step records one step's duration and its failure.
func (m *metrics) step(ctx context.Context, step string, d time.Duration, err error) {
	if err == nil {
		m.steps.Record(ctx, d.Seconds(), metric.WithAttributes(m.table, AttrStep.String(step)))
		return
	}
	attrs := metric.WithAttributes(m.table, AttrStep.String(step), semconv.ErrorTypeKey.String(failure.Type(err)))
	m.steps.Record(ctx, d.Seconds(), attrs)
	m.failures.Add(ctx, 1, attrs)
}

// publishLap records the publish step of a batch (its sends, from start)
// and counts the events that failed; it returns the time it ended.
func (m *metrics) publishLap(ctx context.Context, start time.Time, rows []claim.Row, errs []error) time.Time {
	now := time.Now()
	type key struct{ topic, typ, kind string }
	failed := map[key]int64{}
	var first error
	for i, err := range errs {
		if err == nil || errors.Is(err, ErrHeld) {
			continue
		}
		if first == nil {
			first = err
		}
		kind := "transient"
		if outbox.IsPermanent(err) {
			kind = "permanent"
		}
		failed[key{rows[i].Topic, failure.Type(err), kind}]++
	}
	for k, n := range failed {
		m.errors.Add(ctx, n, metric.WithAttributes(m.table, semconv.MessagingDestinationName(k.topic), semconv.ErrorTypeKey.String(k.typ), AttrErrorKind.String(k.kind)))
	}
	m.step(ctx, StepPublish, now.Sub(start), first)
	return now
}

// sendDone records one Publisher call: the messages msgs[idx...] it sent,
// their outcomes in errs, and its duration, as the messaging semantic
// conventions' client metrics.
func (m *metrics) sendDone(ctx context.Context, msgs []Message, idx []int, errs []error, d time.Duration) {
	type key struct{ topic, typ string }
	counts := map[key]int64{}
	failedType := map[string]string{} // topic -> error.type of its first failure
	for _, i := range idx {
		t := failure.Type(errs[i])
		counts[key{msgs[i].Topic, t}]++
		if _, seen := failedType[msgs[i].Topic]; !seen || failedType[msgs[i].Topic] == "" {
			failedType[msgs[i].Topic] = t
		}
	}
	for k, n := range counts {
		attrs := []attribute.KeyValue{m.table, semconv.MessagingDestinationName(k.topic)}
		if k.typ != "" {
			attrs = append(attrs, semconv.ErrorTypeKey.String(k.typ))
		}
		m.sent.Add(ctx, n, "publish", messagingconv.SystemKafka, attrs...)
	}
	for topic, typ := range failedType {
		attrs := []attribute.KeyValue{m.table, semconv.MessagingDestinationName(topic), semconv.MessagingOperationTypeSend}
		if typ != "" {
			attrs = append(attrs, semconv.ErrorTypeKey.String(typ))
		}
		m.opDur.Record(ctx, d.Seconds(), "publish", messagingconv.SystemKafka, attrs...)
	}
}

// record updates the per-batch instruments after a commit.
func (m *metrics) record(ctx context.Context, rows []claim.Row, errs []error, acked time.Time) {
	table := metric.WithAttributes(m.table)
	m.batch.Record(ctx, int64(len(rows)), table)
	perTopic := map[string]int64{}
	for i, err := range errs {
		if err == nil {
			perTopic[rows[i].Topic]++
			m.latency.Record(ctx, max(0, acked.Sub(rows[i].CreatedAt).Seconds()), table)
		}
	}
	for topic, n := range perTopic {
		m.published.Add(ctx, n, metric.WithAttributes(m.table, semconv.MessagingDestinationName(topic)))
	}
	if len(perTopic) > 0 {
		m.lastPublish.Store(time.Now().UnixNano())
	}
}

// newStatsReporter returns the reporter of the table-wide gauges: the
// relay that holds the session-level advisory lock (the table's namespace,
// locks.StatsReporter; lanes use keys 0 and up) reads them once per
// StatsInterval.
func newStatsReporter(r *Relay) *tablestats.Reporter {
	// Before the relay chose its progress (ProgressAuto, the database
	// not reached yet), the settings of marks, as a marks relay's.
	tx, session, idle := txSettings(r.cfg, ProgressMarks)
	return tablestats.New(tablestats.Config{
		DB:            r.db,
		Table:         r.cfg.Table,
		LockNamespace: r.q.ns,
		LockKey:       locks.StatsReporter,
		Interval:      r.cfg.StatsInterval,
		Logger:        r.cfg.Logger,
		Failed: func(ctx context.Context, err error) {
			r.metrics.failures.Add(ctx, 1, metric.WithAttributes(r.metrics.table, AttrStep.String(StepStats), semconv.ErrorTypeKey.String(failure.Type(&failure.DBStep{Err: err}))))
		},
		ErrorType: func(err error) string { return failure.Type(&failure.DBStep{Err: err}) },
		// The batches' settings, their arguments alike.
		Settings: func() (string, string, []any) {
			if r.settled.Load() {
				return r.txSettings, r.sessionSettings, []any{r.idleMillis}
			}
			return tx, session, []any{idle}
		},
	})
}

// spanOutcome returns the attributes a publish span gets once its message's
// outcome is known: error.type on a failure; where the broker stored it,
// when the publisher reported that.
func spanOutcome(pub Publisher, m Message, err error) []attribute.KeyValue {
	var attrs []attribute.KeyValue
	if ci, ok := pub.(clientIdentifier); ok {
		if id := ci.clientID(); id != "" {
			attrs = append(attrs, semconv.MessagingClientID(id))
		}
	}
	if err != nil {
		return append(attrs, semconv.ErrorTypeKey.String(failure.Type(err)))
	}
	if m.Stored {
		attrs = append(attrs, semconv.MessagingDestinationPartitionID(strconv.Itoa(int(m.Partition))), semconv.MessagingKafkaOffset(int(m.Offset)))
		if host, port, err := net.SplitHostPort(m.Broker); err == nil {
			attrs = append(attrs, semconv.ServerAddress(host))
			if p, err := strconv.Atoi(port); err == nil {
				attrs = append(attrs, semconv.ServerPort(p))
			}
		}
	}
	return attrs
}

// The ways a stream's slot is lost (outbox.stream.slots_lost).
const (
	slotInvalidated = "invalidated"
	slotMissing     = "missing"
)

// TxnEnded counts a Kafka transaction that ended with outcome (err when
// not committed), and, when started is not zero, its duration.
func (ms *metrics) TxnEnded(ctx context.Context, outcome string, started time.Time, err error) {
	if ms.txns == nil {
		return
	}
	attrs := []attribute.KeyValue{ms.table, AttrTxnOutcome.String(outcome)}
	if outcome != eo.TxnCommitted && err != nil {
		attrs = append(attrs, semconv.ErrorTypeKey.String(failure.Type(err)))
	}
	set := metric.WithAttributes(attrs...)
	ms.txns.Add(ctx, 1, set)
	if !started.IsZero() {
		ms.txnDur.Record(ctx, time.Since(started).Seconds(), metric.WithAttributes(ms.table, AttrTxnOutcome.String(outcome)))
	}
}

// Fenced counts lanes changing owner: side fencing (n lanes taken over) or
// fenced (a worker that found it was fenced, n = 1).
func (ms *metrics) Fenced(ctx context.Context, side string, n int) {
	if ms.fences == nil || n == 0 {
		return
	}
	ms.fences.Add(ctx, int64(n), metric.WithAttributes(ms.table, AttrFenceSide.String(side)))
}
