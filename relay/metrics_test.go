package relay_test

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/fxoutbox/outbox/admin"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/relay/internal/failure"
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
			return fmt.Errorf("connect: %w", sarama.ErrOutOfBrokers)
		}
		return nil
	})
	s.write(t, "m.topic", 30, 3)
	r := s.relay(t, pub, relay.Config{MeterProvider: mp, PollInterval: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, StatsInterval: 20 * time.Millisecond})
	if err := r.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Stop(s.ctx) }()

	// The table-wide gauges are sampled every StatsInterval and the relay
	// retries on its backoff, both of which a loaded machine stretches: wait
	// for a reading with the oldest event at least 0.2s old and a failed
	// batch counted, then check the rest in that same reading.
	var m map[string]metricdata.Aggregation
	waitUntil(t, 10*time.Second, "a reading with the oldest event at least 0.2s old and a failed batch of 30 counted as broker_unreachable", func() bool {
		m = collect(t, reader)
		g, ok := m[relay.MetricOldestAge].(metricdata.Gauge[float64])
		return ok && len(g.DataPoints) == 1 && g.DataPoints[0].Value >= 0.2 &&
			sumInt(m[relay.MetricErrors], attribute.String("error.type", "broker_unreachable")) >= 30
	})
	if b := sumInt(m[relay.MetricBacklog], attribute.KeyValue{}); b != 30 {
		t.Errorf("backlog while down = %d, want 30", b)
	}
	if p := sumInt(m[relay.MetricPublished], attribute.KeyValue{}); p != 0 {
		t.Errorf("published while down = %d", p)
	}

	down.Store(false)
	waitUntil(t, 10*time.Second, "publishing after the broker returns", func() bool { return s.unpublished(t) == 0 })
	// The table-wide gauges are read every StatsInterval.
	waitUntil(t, 10*time.Second, "the backlog gauge to drop to 0", func() bool {
		return sumInt(collect(t, reader)[relay.MetricBacklog], attribute.KeyValue{}) == 0
	})
	m = collect(t, reader)
	if p := sumInt(m[relay.MetricPublished], attribute.String("messaging.destination.name", "m.topic")); p != 30 {
		t.Errorf("published = %d, want 30", p)
	}
	if h, ok := m[relay.MetricLatency].(metricdata.Histogram[float64]); !ok || h.DataPoints[0].Count != 30 {
		t.Errorf("latency histogram = %+v, want 30 observations", m[relay.MetricLatency])
	}
	if h, ok := m[relay.MetricBatchSize].(metricdata.Histogram[int64]); !ok || h.DataPoints[0].Sum < 30 {
		t.Errorf("batch size histogram = %+v", m[relay.MetricBatchSize])
	}
	if g, ok := m[relay.MetricParked].(metricdata.Gauge[int64]); ok && len(g.DataPoints) > 0 {
		t.Errorf("parked gauge without parked events: %+v", g.DataPoints)
	}
}

// newReader returns a meter provider read by a manual reader.
func newReader(t *testing.T) (*sdkmetric.ManualReader, *sdkmetric.MeterProvider) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	return reader, mp
}

// match reports whether set holds every attribute of want.
func match(set attribute.Set, want []attribute.KeyValue) bool {
	for _, kv := range want {
		if v, ok := set.Value(kv.Key); !ok || v != kv.Value {
			return false
		}
	}
	return true
}

// counter sums the points of an int64 counter that carry want.
func counter(a metricdata.Aggregation, want ...attribute.KeyValue) int64 {
	var n int64
	if d, ok := a.(metricdata.Sum[int64]); ok {
		for _, p := range d.DataPoints {
			if match(p.Attributes, want) {
				n += p.Value
			}
		}
	}
	return n
}

// observations counts what a float64 histogram recorded with want.
func observations(a metricdata.Aggregation, want ...attribute.KeyValue) uint64 {
	var n uint64
	if d, ok := a.(metricdata.Histogram[float64]); ok {
		for _, p := range d.DataPoints {
			if match(p.Attributes, want) {
				n += p.Count
			}
		}
	}
	return n
}

// gauge returns the points of a gauge (int64 values converted).
func gauge(a metricdata.Aggregation) []metricdata.DataPoint[float64] {
	switch d := a.(type) {
	case metricdata.Gauge[float64]:
		return d.DataPoints
	case metricdata.Gauge[int64]:
		out := make([]metricdata.DataPoint[float64], len(d.DataPoints))
		for i, p := range d.DataPoints {
			out[i] = metricdata.DataPoint[float64]{Attributes: p.Attributes, Value: float64(p.Value)}
		}
		return out
	}
	return nil
}

// syncPublisher publishes through a sarama SyncProducer and reports where
// each message was stored, as a Publisher may (Message.Stored).
type syncPublisher struct {
	client sarama.Client
	prod   sarama.SyncProducer
}

func newSyncPublisher(t *testing.T, brokers []string) *syncPublisher {
	t.Helper()
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V2_8_0_0
	cfg.ClientID = "telemetry-test"
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Return.Successes = true
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	prod, err := sarama.NewSyncProducerFromClient(client)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = prod.Close(); _ = client.Close() })
	return &syncPublisher{client: client, prod: prod}
}

func (p *syncPublisher) Publish(_ context.Context, msgs []relay.Message) error {
	pms := make([]*sarama.ProducerMessage, len(msgs))
	for i, m := range msgs {
		pms[i] = &sarama.ProducerMessage{Topic: m.Topic, Key: sarama.ByteEncoder(m.Key), Value: sarama.ByteEncoder(m.Value)}
	}
	if err := p.prod.SendMessages(pms); err != nil {
		return err
	}
	for i, pm := range pms {
		msgs[i].Stored, msgs[i].Partition, msgs[i].Offset = true, pm.Partition, pm.Offset
		if b, err := p.client.Leader(pm.Topic, pm.Partition); err == nil {
			msgs[i].Broker = b.Addr()
		}
	}
	return nil
}

// Publishing through a real broker records the messaging conventions'
// client metrics, every step's duration and the time since the last
// publish; the publish spans say where each event was stored. Against a
// broker that refuses connections, the same instruments and the spans name
// the cause: broker_unreachable.
func TestMessagingMetricsAndSpans(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	brokers := s.kafka(t)
	topic := testenv.Topic(t, brokers, 3)
	reader, mp := newReader(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer func() { _ = tp.Shutdown(context.Background()) }()

	s.write(t, topic, 10, 5)
	r := s.relay(t, newSyncPublisher(t, brokers), relay.Config{MeterProvider: mp, TracerProvider: tp})
	for i := 0; s.unpublished(t) > 0; i++ {
		if _, err := r.RunOnce(s.ctx); err != nil || i > 20 {
			t.Fatalf("RunOnce: %v (round %d)", err, i)
		}
	}
	m := collect(t, reader)
	sendAttrs := []attribute.KeyValue{attribute.String("messaging.system", "kafka"), attribute.String("messaging.operation.name", "publish"),
		attribute.String("messaging.destination.name", topic)}
	if n := counter(m[relay.MetricSentMessages], sendAttrs...); n != 10 {
		t.Errorf("%s = %d, want 10", relay.MetricSentMessages, n)
	}
	if n := counter(m[relay.MetricSentMessages], attribute.String("error.type", "_OTHER")); n != 0 {
		t.Errorf("sent messages with an error type: %d", n)
	}
	if n := observations(m[relay.MetricOperationDuration], append(sendAttrs, attribute.String("messaging.operation.type", "send"))...); n < 1 {
		t.Errorf("%s has no observation of the sends: %+v", relay.MetricOperationDuration, m[relay.MetricOperationDuration])
	}
	for _, step := range []string{relay.StepClaim, relay.StepPublish, relay.StepMark, relay.StepCommit} {
		if n := observations(m[relay.MetricStepDuration], relay.AttrStep.String(step)); n < 1 {
			t.Errorf("%s has no %s observation", relay.MetricStepDuration, step)
		}
	}
	spans := exp.GetSpans()
	if len(spans) != 10 {
		t.Fatalf("%d spans, want 10", len(spans))
	}
	offsets := map[string]bool{}
	for _, sp := range spans {
		set := attribute.NewSet(sp.Attributes...)
		part, okP := set.Value("messaging.destination.partition.id")
		off, okO := set.Value("messaging.kafka.offset")
		_, okA := set.Value("server.address")
		_, okS := set.Value("server.port")
		if !okP || !okO || !okA || !okS {
			t.Fatalf("span %s lacks where it was stored: %v", sp.Name, sp.Attributes)
		}
		// A publisher of one's own has no way to name its client.
		if id, ok := set.Value("messaging.client.id"); ok {
			t.Errorf("span %s of a publisher of one's own has messaging.client.id %q", sp.Name, id.AsString())
		}
		offsets[part.AsString()+"/"+off.Emit()] = true
	}
	if len(offsets) != 10 {
		t.Errorf("spans name %d distinct partition/offset pairs, want 10: %v", len(offsets), offsets)
	}

	// The broker is unreachable: a real publisher to a port nobody listens on.
	s2 := newSetup(t)
	reader2, mp2 := newReader(t)
	exp2 := tracetest.NewInMemoryExporter()
	tp2 := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp2))
	defer func() { _ = tp2.Shutdown(context.Background()) }()
	sc := relay.DefaultSaramaConfig()
	sc.Metadata.Retry.Max, sc.Metadata.Retry.Backoff = 1, 10*time.Millisecond
	down, err := relay.NewSaramaPublisher([]string{closedAddr(t)}, sc)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = down.Close() }()
	s2.write(t, "down.topic", 3, 3)
	r2 := s2.relay(t, down, relay.Config{MeterProvider: mp2, TracerProvider: tp2})
	_, err = r2.RunOnce(s.ctx)
	if got := failure.Type(err); got != failure.BrokerUnreachable {
		t.Fatalf("RunOnce error %v has error.type %q, want broker_unreachable", err, got)
	}
	m = collect(t, reader2)
	bu := attribute.String("error.type", failure.BrokerUnreachable)
	if n := counter(m[relay.MetricSentMessages], bu, attribute.String("messaging.destination.name", "down.topic")); n != 3 {
		t.Errorf("%s{error.type=broker_unreachable} = %d, want 3", relay.MetricSentMessages, n)
	}
	if n := observations(m[relay.MetricOperationDuration], bu); n < 1 {
		t.Errorf("%s has no failed observation", relay.MetricOperationDuration)
	}
	if n := counter(m[relay.MetricErrors], bu, relay.AttrErrorKind.String("transient")); n != 3 {
		t.Errorf("%s{error.type=broker_unreachable,kind=transient} = %d, want 3", relay.MetricErrors, n)
	}
	if n := counter(m[relay.MetricStepErrors], bu, relay.AttrStep.String(relay.StepPublish)); n != 1 {
		t.Errorf("%s{step=publish,error.type=broker_unreachable} = %d, want 1", relay.MetricStepErrors, n)
	}
	for _, sp := range exp2.GetSpans() {
		set := attribute.NewSet(sp.Attributes...)
		if v, _ := set.Value("error.type"); v.AsString() != failure.BrokerUnreachable || sp.Status.Code != codes.Error {
			t.Errorf("failed span %s: error.type %q, status %v", sp.Name, v.AsString(), sp.Status)
		}
		// SaramaPublisher names its client: its sarama configuration's ClientID.
		if id, _ := set.Value("messaging.client.id"); id.AsString() != "fxoutbox" {
			t.Errorf("span %s of a SaramaPublisher: messaging.client.id %q, want fxoutbox", sp.Name, id.AsString())
		}
	}
}

// closedAddr returns a local address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// A database that refuses connections fails every batch: the relay counts
// the failures as error.type=database.connection, keeps reporting the time
// since its last publish, and reports no table-wide gauge it cannot read.
// A missing table is a different cause: database.schema.
func TestDatabaseErrorsAreCounted(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	reader, mp := newReader(t)
	dead, err := pgxpool.New(s.ctx, "postgres://postgres@"+closedAddr(t)+"/outbox?sslmode=disable&connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	pub := relay.PublisherFunc(func(context.Context, []relay.Message) error { return nil })
	r, err := relay.New(dead, pub, &relay.Config{Table: s.table, MeterProvider: mp, PollInterval: 10 * time.Millisecond,
		MaxBackoff: 20 * time.Millisecond, StatsInterval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.RunOnce(s.ctx); failure.Type(err) != "database.connection" {
		t.Fatalf("RunOnce against a closed port: %v, error.type %q, want database.connection", err, failure.Type(err))
	}
	if err := r.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Stop(s.ctx) }()
	conn := attribute.String("error.type", "database.connection")
	waitUntil(t, 20*time.Second, "failed claims and statistics reads to be counted", func() bool {
		m := collect(t, reader)
		return counter(m[relay.MetricStepErrors], conn, relay.AttrStep.String(relay.StepClaim)) >= 3 &&
			counter(m[relay.MetricStepErrors], conn, relay.AttrStep.String(relay.StepStats)) >= 1
	})
	m := collect(t, reader)
	if p := gauge(m[relay.MetricLastPublishAge]); len(p) != 1 || p[0].Value < 0 {
		t.Errorf("%s during the outage = %+v, want one point", relay.MetricLastPublishAge, p)
	}
	for _, name := range []string{relay.MetricBacklog, relay.MetricOldestAge} {
		if p := gauge(m[name]); len(p) != 0 {
			t.Errorf("%s reported while the database is unreachable: %+v", name, p)
		}
	}
	if n := observations(m[relay.MetricStepDuration], relay.AttrStep.String(relay.StepClaim), conn); n < 3 {
		t.Errorf("%s{step=claim,error.type=database.connection} = %d", relay.MetricStepDuration, n)
	}

	// The table renamed away (migrations missing): database.schema.
	reader2, mp2 := newReader(t)
	r2 := s.relay(t, pub, relay.Config{MeterProvider: mp2})
	if _, err := s.pool.Exec(s.ctx, "ALTER TABLE "+sqlname.Ident(s.table)+" RENAME TO gone"); err != nil {
		t.Fatal(err)
	}
	if _, err := r2.RunOnce(s.ctx); failure.Type(err) != "database.schema" {
		t.Errorf("RunOnce without its table: %v, error.type %q, want database.schema", err, failure.Type(err))
	}
	if n := counter(collect(t, reader2)[relay.MetricStepErrors], attribute.String("error.type", "database.schema"), relay.AttrStep.String(relay.StepClaim)); n != 1 {
		t.Errorf("%s{step=claim,error.type=database.schema} = %d, want 1", relay.MetricStepErrors, n)
	}
}

// Two relays on one table: exactly one reports the table-wide gauges, so
// summing over replicas is right; when it stops, the other takes over.
func TestTableGaugesReportedByOneRelay(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	down := relay.PublisherFunc(func(context.Context, []relay.Message) error { return sarama.ErrOutOfBrokers })
	s.write(t, "two.topic", 5, 5)
	readers := make([]*sdkmetric.ManualReader, 2)
	relays := make([]*relay.Relay, 2)
	for i := range relays {
		var mp *sdkmetric.MeterProvider
		readers[i], mp = newReader(t)
		relays[i] = s.relay(t, down, relay.Config{MeterProvider: mp, PollInterval: 20 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
			StatsInterval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
		if err := relays[i].Start(s.ctx); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = relays[i].Stop(s.ctx) }()
	}
	reporters := func() (who []int) {
		for i, rd := range readers {
			m := collect(t, rd)
			if p := gauge(m[relay.MetricBacklog]); len(p) > 0 {
				if p[0].Value != 5 {
					t.Errorf("relay %d reports backlog %v, want 5", i, p[0].Value)
				}
				who = append(who, i)
			}
		}
		return who
	}
	waitUntil(t, 10*time.Second, "a relay to report the backlog", func() bool { return len(reporters()) > 0 })
	var leader int
	for range 10 {
		who := reporters()
		if len(who) != 1 {
			t.Fatalf("relays reporting the table-wide gauges: %v, want exactly one", who)
		}
		leader = who[0]
		time.Sleep(30 * time.Millisecond)
	}
	if err := relays[leader].Stop(s.ctx); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "the other relay to take over", func() bool {
		who := reporters()
		return len(who) == 1 && who[0] == 1-leader
	})
}

// An event whose created_at is in the future (a writer's clock ahead) has
// age 0, never a negative age that would keep an age alert from firing.
func TestOldestAgeNeverNegative(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	s.insertRaw(t, "future.topic", "k", []byte(`{}`))
	if _, err := s.pool.Exec(s.ctx, "UPDATE "+sqlname.Ident(s.table)+" SET created_at = now() + interval '1 hour'"); err != nil {
		t.Fatal(err)
	}
	reader, mp := newReader(t)
	down := relay.PublisherFunc(func(context.Context, []relay.Message) error { return sarama.ErrOutOfBrokers })
	r := s.relay(t, down, relay.Config{MeterProvider: mp, StatsInterval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	st, err := r.Stats(s.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.OldestAge != 0 || st.Backlog != 1 {
		t.Errorf("Stats = %+v, want backlog 1, oldest age 0", st)
	}
	if err := r.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Stop(s.ctx) }()
	waitUntil(t, 10*time.Second, "the oldest age gauge", func() bool { return len(gauge(collect(t, reader)[relay.MetricOldestAge])) == 1 })
	if p := gauge(collect(t, reader)[relay.MetricOldestAge]); p[0].Value != 0 {
		t.Errorf("%s = %v, want 0", relay.MetricOldestAge, p[0].Value)
	}
}

// Parked events are reported by topic and by the reason they were parked,
// read back from the error type the relay stores with them; rows parked
// before the reason was stored count as _OTHER.
func TestParkedGaugeByTopicAndReason(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	big := s.insertRaw(t, "big.topic", "k1", []byte(`{"blob":"`+strings.Repeat("x", 2000)+`"}`))
	s.insertRaw(t, "old.topic", "k2", []byte(`{}`))
	if _, err := s.pool.Exec(s.ctx, "UPDATE "+sqlname.Ident(s.table)+" SET parked_at = now(), last_error = 'permanent: parked by an older relay' WHERE topic = 'old.topic'"); err != nil {
		t.Fatal(err)
	}
	reader, mp := newReader(t)
	ok := relay.PublisherFunc(func(context.Context, []relay.Message) error { return nil })
	r := s.relay(t, ok, relay.Config{MeterProvider: mp, MaxMessageBytes: 1000, StatsInterval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if _, err := r.RunOnce(s.ctx); err != nil {
		t.Fatal(err)
	}
	parked, err := admin.ListParked(s.ctx, s.pool, s.table, admin.Filter{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range parked {
		if p.EventID == big && !strings.HasPrefix(p.LastError, "[message_too_large] ") {
			t.Errorf("last_error of the big event = %q, want it to start with its error type", p.LastError)
		}
	}
	if err := r.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Stop(s.ctx) }()
	want := map[string]float64{"big.topic/message_too_large": 1, "old.topic/_OTHER": 1}
	var got map[string]float64
	waitUntil(t, 10*time.Second, "the parked gauge", func() bool {
		got = map[string]float64{}
		for _, p := range gauge(collect(t, reader)[relay.MetricParked]) {
			topic, _ := p.Attributes.Value("messaging.destination.name")
			reason, _ := p.Attributes.Value("error.type")
			got[topic.AsString()+"/"+reason.AsString()] = p.Value
		}
		return len(got) > 0
	})
	if !maps.Equal(got, want) {
		t.Errorf("parked by topic/reason = %v, want %v", got, want)
	}
	if n := counter(collect(t, reader)[relay.MetricErrors], attribute.String("error.type", failure.MessageTooLarge), relay.AttrErrorKind.String("permanent")); n != 1 {
		t.Errorf("%s{error.type=message_too_large,kind=permanent} = %d, want 1", relay.MetricErrors, n)
	}
}

// promName is the name the OpenTelemetry Prometheus exporter gives an
// instrument (default translation, UnderscoreEscapingWithSuffixes): dots to
// underscores, _seconds for seconds, annotation units such as {event}
// dropped, _total on counters. The orders example's test reads the real
// exporter's output for the same names.
func promName(name, unit, kind string) string {
	n := strings.ReplaceAll(name, ".", "_")
	switch unit {
	case "s":
		n += "_seconds"
	case "By":
		n += "_bytes"
	}
	if kind == "counter" {
		n += "_total"
	}
	return n
}

type exported struct {
	kind, unit string
	attrs      map[string]bool
}

// exportAll runs relays through success, refusal, parking and a database
// outage, so that every instrument has a point, and returns what the
// reader collected.
func exportAll(t *testing.T) map[string]exported {
	t.Helper()
	s := newSetup(t)
	brokers := s.kafka(t)
	topic := testenv.Topic(t, brokers, 2)
	reader, mp := newReader(t)
	s.write(t, topic, 3, 3)
	s.insertRaw(t, topic, "big", []byte(`{"blob":"`+strings.Repeat("x", 2000)+`"}`))
	r := s.relay(t, newSyncPublisher(t, brokers), relay.Config{MeterProvider: mp, MaxMessageBytes: 1000, PollInterval: 10 * time.Millisecond,
		StatsInterval: 20 * time.Millisecond, Retention: time.Millisecond, CleanupInterval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err := r.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Stop(s.ctx) }()
	waitUntil(t, 20*time.Second, "publishing, parking and the table-wide gauges", func() bool {
		m := collect(t, reader)
		return s.unpublished(t) == 1 && len(gauge(m[relay.MetricParked])) > 0 && len(gauge(m[relay.MetricBacklog])) > 0 &&
			counter(m[relay.MetricPublished]) == 3 && observations(m[relay.MetricStepDuration], relay.AttrStep.String(relay.StepCleanup)) > 0
	})
	down, err := relay.NewSaramaPublisher([]string{closedAddr(t)}, func() *sarama.Config {
		c := relay.DefaultSaramaConfig()
		c.Metadata.Retry.Max = 0
		return c
	}())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = down.Close() }()
	s2 := newSetup(t)
	s2.write(t, "down.topic", 1, 1)
	if _, err := s2.relay(t, down, relay.Config{MeterProvider: mp}).RunOnce(s.ctx); err == nil {
		t.Fatal("publishing to a closed port succeeded")
	}
	dead, err := pgxpool.New(s.ctx, "postgres://postgres@"+closedAddr(t)+"/outbox?sslmode=disable&connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	rd, err := relay.New(dead, down, &relay.Config{Table: s.table, MeterProvider: mp})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rd.RunOnce(s.ctx); err == nil {
		t.Fatal("a relay on a closed database port succeeded")
	}
	// A streaming relay: the stream's gauges.
	s3 := newSetup(t)
	s3.streaming(t)
	sc := streamConfig()
	sc.MeterProvider = mp
	rs := s3.relay(t, newSyncPublisher(t, brokers), sc)
	if err := rs.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rs.Stop(s.ctx) }()
	waitUntil(t, 20*time.Second, "streaming", func() bool { return rs.StreamStatus().State == relay.Streaming })

	// Exactly once: a transaction each, and the second relay takes the
	// lane over from the first, fencing it.
	s4 := newSetup(t)
	topic4 := testenv.Topic(t, brokers, 1)
	for i := range 2 {
		s4.write(t, topic4, 2, 1)
		eo := s4.relay(t, s4.publisher(t), relay.Config{Delivery: relay.ExactlyOnce, MeterProvider: mp, Logger: slog.New(slog.DiscardHandler)})
		n, err := eo.RunOnce(s.ctx)
		_ = eo.Stop(s.ctx) // closes its Kafka client
		if err != nil || n != 2 {
			t.Fatalf("exactly-once relay %d: RunOnce = %d, %v; want 2 published", i, n, err)
		}
	}

	// A cursor relay on a partitioned table, after one upkeep round: the
	// partitions kept.
	s5 := newPartitionedSetup(t)
	rp := s5.relay(t, relay.PublisherFunc(func(context.Context, []relay.Message) error { return nil }), relay.Config{Progress: relay.ProgressCursor, MeterProvider: mp})
	if err := rp.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rp.Stop(s.ctx) }()
	if _, err := rp.MaintainPartitions(s.ctx); err != nil {
		t.Fatal(err)
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(s.ctx, &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]exported{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			e := exported{unit: m.Unit, attrs: map[string]bool{}}
			var sets []attribute.Set
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				e.kind = map[bool]string{true: "counter", false: "updowncounter"}[d.IsMonotonic]
				for _, p := range d.DataPoints {
					sets = append(sets, p.Attributes)
				}
			case metricdata.Sum[float64]:
				e.kind = map[bool]string{true: "counter", false: "updowncounter"}[d.IsMonotonic]
				for _, p := range d.DataPoints {
					sets = append(sets, p.Attributes)
				}
			case metricdata.Histogram[int64]:
				e.kind = "histogram"
				for _, p := range d.DataPoints {
					sets = append(sets, p.Attributes)
				}
			case metricdata.Histogram[float64]:
				e.kind = "histogram"
				for _, p := range d.DataPoints {
					sets = append(sets, p.Attributes)
				}
			case metricdata.Gauge[int64]:
				e.kind = "gauge"
				for _, p := range d.DataPoints {
					sets = append(sets, p.Attributes)
				}
			case metricdata.Gauge[float64]:
				e.kind = "gauge"
				for _, p := range d.DataPoints {
					sets = append(sets, p.Attributes)
				}
			default:
				t.Fatalf("%s: unexpected aggregation %T", m.Name, m.Data)
			}
			for _, set := range sets {
				for _, kv := range set.ToSlice() {
					e.attrs[string(kv.Key)] = true
				}
			}
			out[m.Name] = e
		}
	}
	return out
}

// The operator's documentation cannot drift from the code: the metrics
// table in docs/operating.md lists exactly what a relay exports (name,
// kind, unit, attributes, Prometheus name), every Metric constant is
// exported, and every metric and label the alert rules and the dashboard
// use exists.
func TestDocumentedMetricsMatchExports(t *testing.T) {
	t.Parallel()
	got := exportAll(t)

	doc, err := os.ReadFile("../docs/operating.md")
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		prom, kind, unit string
		attrs            map[string]bool
	}
	documented := map[string]row{}
	cell := regexp.MustCompile("`([^`]+)`")
	for _, line := range strings.Split(string(doc), "\n") {
		cols := strings.Split(line, "|")
		if len(cols) != 8 || !strings.HasPrefix(strings.TrimSpace(cols[1]), "`") {
			continue
		}
		r := row{prom: strings.Trim(strings.TrimSpace(cols[1]), "`"), kind: strings.TrimSpace(cols[3]),
			unit: strings.Trim(strings.TrimSpace(cols[4]), "`"), attrs: map[string]bool{}}
		for _, m := range cell.FindAllStringSubmatch(cols[5], -1) {
			r.attrs[m[1]] = true
		}
		documented[strings.Trim(strings.TrimSpace(cols[2]), "`")] = r
	}
	labels := map[string]bool{}
	promNames := map[string]string{} // Prometheus name -> kind
	for name, e := range got {
		d, ok := documented[name]
		if !ok {
			t.Errorf("%s is exported but not documented in docs/operating.md", name)
			continue
		}
		if d.kind != e.kind || d.unit != e.unit {
			t.Errorf("%s: documented as %s [%s], exported as %s [%s]", name, d.kind, d.unit, e.kind, e.unit)
		}
		if p := promName(name, e.unit, e.kind); d.prom != p {
			t.Errorf("%s: documented Prometheus name %s, the exporter names it %s", name, d.prom, p)
		}
		for a := range e.attrs {
			if !d.attrs[a] {
				t.Errorf("%s: attribute %s is exported but not documented", name, a)
			}
		}
	}
	for name, d := range documented {
		if _, ok := got[name]; !ok {
			t.Errorf("%s is documented but not exported", name)
		}
		promNames[d.prom] = d.kind
		for a := range d.attrs {
			labels[strings.ReplaceAll(a, ".", "_")] = true
		}
	}
	for _, name := range []string{relay.MetricPublished, relay.MetricErrors, relay.MetricStepErrors, relay.MetricStepDuration,
		relay.MetricBatchSize, relay.MetricLatency, relay.MetricLastPublishAge, relay.MetricSentMessages, relay.MetricOperationDuration,
		relay.MetricBacklog, relay.MetricOldestAge, relay.MetricParked, relay.MetricPoolConnections, relay.MetricPoolMax, relay.MetricPoolAcquireWait,
		relay.MetricStreamLag, relay.MetricStreamDelay, relay.MetricStreamState, relay.MetricStreamSlotsLost, relay.MetricTransactions, relay.MetricTxnDuration, relay.MetricFences, relay.MetricPartitionsKept} {
		if _, ok := got[name]; !ok {
			t.Errorf("constant %s is not exported", name)
		}
	}
	if len(got) != 23 {
		t.Errorf("%d metrics exported, the constants list 23: add the new one to the constants, the package doc and docs/operating.md", len(got))
	}

	token := regexp.MustCompile(`\b(?:outbox|messaging|db)_[a-z_]+\b`)
	for _, file := range []string{"../docs/alerts.yaml", "../docs/dashboard.json"} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		used := 0
		for _, tok := range token.FindAllString(string(b), -1) {
			if labels[tok] {
				continue
			}
			if _, ok := promNames[tok]; ok {
				used++
				continue
			}
			base, _ := strings.CutSuffix(tok, "_bucket")
			base, _ = strings.CutSuffix(base, "_sum")
			base, _ = strings.CutSuffix(base, "_count")
			if promNames[base] == "histogram" {
				used++
				continue
			}
			t.Errorf("%s uses %s: neither an exported metric nor a label", file, tok)
		}
		if used == 0 {
			t.Errorf("%s uses no metric", file)
		}
	}
}
