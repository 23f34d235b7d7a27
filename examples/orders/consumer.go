package orders

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/fx"

	"github.com/fxoutbox/outbox"
)

// ConsumerConfig configures the example consumer.
type ConsumerConfig struct {
	// Disabled turns the consumer off.
	Disabled bool
	// Brokers are the Kafka bootstrap addresses. Default: Outbox.Brokers.
	Brokers []string
	// Group is the consumer group id. Default "<service>-example-consumer".
	// A new group starts at the oldest records of the topics.
	Group string
	// Handle is called for each record, duplicates included (see
	// Delivery.Duplicate), one at a time per partition; the record is
	// marked consumed when it returns. Default: one log line per event.
	Handle func(ctx context.Context, d Delivery)
}

// Delivery is one consumed record.
type Delivery struct {
	Topic     string
	Partition int32
	Offset    int64
	Key       string            // the order id
	Headers   map[string]string // every record header
	EventID   string            // x-event-id
	EventType string            // x-event-type
	Payload   []byte
	Event     OrderEvent // Payload decoded; zero when it is not an OrderEvent
	// TraceID is the trace the consumer span continues: the trace of the
	// HTTP request that recorded the event. Zero when the record carried no
	// traceparent.
	TraceID trace.TraceID
	// Parent is the span context the record carried (the relay's publish span).
	Parent trace.SpanContext
	// Duplicate is true when this consumer has seen the x-event-id before.
	Duplicate bool
	Timestamp time.Time // the record's timestamp
	Received  time.Time
}

// Consumer consumes the order-service topics in a sarama consumer group, as
// a downstream service would: for each record it extracts the W3C trace
// context from the Kafka headers and starts a consumer span that continues
// the trace, recognises duplicates by x-event-id, and calls
// ConsumerConfig.Handle. It joins the group in the background and rejoins
// after broker failures; the application starts without Kafka.
type Consumer struct {
	cfg    ConsumerConfig
	topics []string
	sarama *sarama.Config
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	log    *slog.Logger
	seen   *dedup

	ready     chan struct{}
	readyOnce sync.Once
	failing   atomic.Bool
	cancel    context.CancelFunc
	done      chan struct{}
}

// Topics returns the topics the consumer reads.
func (c *Consumer) Topics() []string { return slices.Clone(c.topics) }

// Ready is closed once the consumer has joined its group and been assigned
// its partitions for the first time.
func (c *Consumer) Ready() <-chan struct{} { return c.ready }

// EventTopics returns the topics of the service's two event types under cfg
// (the same derivation as the unit of work's).
func EventTopics(cfg Config) ([]string, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	derive := cfg.Outbox.Writer.Topics
	if derive == nil {
		derive = outbox.TopicPerEvent
	}
	var topics []string
	for _, typ := range []string{EventOrderCreated, EventOrderConfirmed} {
		t, err := derive(cfg.Outbox.Writer.Service, outbox.Event{AggregateType: AggregateOrder, AggregateID: "-", Type: typ})
		if err != nil {
			return nil, err
		}
		if !slices.Contains(topics, t) {
			topics = append(topics, t)
		}
	}
	return topics, nil
}

func newConsumer(lc fx.Lifecycle, c Config, tp trace.TracerProvider, prop propagation.TextMapPropagator, log *slog.Logger) (*Consumer, error) {
	topics, err := EventTopics(c)
	if err != nil {
		return nil, err
	}
	cc := c.Consumer
	con := &Consumer{
		cfg: cc, topics: topics, tracer: tp.Tracer(instrumentation), prop: prop, log: log,
		seen: newDedup(100_000), ready: make(chan struct{}), done: make(chan struct{}),
	}
	if con.cfg.Handle == nil {
		con.cfg.Handle = con.logDelivery
	}
	if cc.Disabled {
		return con, nil
	}
	if len(cc.Brokers) == 0 {
		return nil, errors.New("orders: the consumer has no Kafka brokers: set KAFKA_BROKERS (or Consumer.Disabled)")
	}
	sc := sarama.NewConfig()
	sc.ClientID = "orders-example-consumer"
	sc.Version = sarama.V2_8_0_0
	sc.Consumer.Return.Errors = true
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	// Read committed: with OUTBOX_DELIVERY=exactly-once the relay publishes
	// in Kafka transactions, and an aborted one's records must not count.
	// Without transactions it reads the same records.
	sc.Consumer.IsolationLevel = sarama.ReadCommitted
	sc.Consumer.Retry.Backoff = 250 * time.Millisecond
	sc.Consumer.Group.Rebalance.Retry.Backoff = 500 * time.Millisecond
	sc.Net.DialTimeout = 3 * time.Second
	if err := sc.Validate(); err != nil {
		return nil, err
	}
	con.sarama = sc
	lc.Append(fx.Hook{
		OnStart: func(context.Context) error {
			// A service creates the topics it owns: brokers with
			// auto-creation off (Apache Kafka's recommended setting) would
			// otherwise reject its events. A broker that is down is not an
			// error here: the relay retries until it is back.
			if err := ensureTopics(cc.Brokers, sc, topics, 12); err != nil {
				log.Warn("orders: could not create the event topics; the relay retries publishing until they exist", "topics", topics, "error", err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			con.cancel = cancel
			go con.run(ctx)
			return nil
		},
		OnStop: func(ctx context.Context) error {
			con.cancel()
			select {
			case <-con.done:
				return nil
			case <-ctx.Done():
				return fmt.Errorf("orders: consumer stop: %w", ctx.Err())
			}
		},
	})
	return con, nil
}

// run joins the group and consumes until ctx ends, rejoining after
// failures (a broker that is down or restarted ends the group session).
func (c *Consumer) run(ctx context.Context) {
	defer close(c.done)
	var (
		group sarama.ConsumerGroup
		errs  sync.WaitGroup
	)
	defer func() {
		if group != nil {
			_ = group.Close()
		}
		errs.Wait()
	}()
	for ctx.Err() == nil {
		if group == nil {
			g, err := sarama.NewConsumerGroup(c.cfg.Brokers, c.cfg.Group, c.sarama)
			if err != nil {
				c.fail(err)
				sleep(ctx, time.Second)
				continue
			}
			group = g
			errs.Go(func() {
				for err := range g.Errors() {
					c.fail(err)
				}
			})
		}
		began := time.Now()
		err := group.Consume(ctx, c.topics, groupHandler{c})
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, sarama.ErrClosedConsumerGroup):
			group = nil
		case err != nil:
			c.fail(err)
			sleep(ctx, 500*time.Millisecond)
		case time.Since(began) < 100*time.Millisecond:
			sleep(ctx, 100*time.Millisecond) // a session that ended at once: do not spin
		}
	}
}

// fail logs the first error of a run of failures. Errors that only say a
// rebalance overtook the session (its offset commits or heartbeats carry
// an old generation) are expected after a rejoin and logged at debug level.
func (c *Consumer) fail(err error) {
	if errors.Is(err, sarama.ErrIllegalGeneration) || errors.Is(err, sarama.ErrUnknownMemberId) || errors.Is(err, sarama.ErrRebalanceInProgress) {
		c.log.Debug("orders consumer: rebalance", "group", c.cfg.Group, "error", err)
		return
	}
	if !c.failing.Swap(true) {
		c.log.Warn("orders consumer: Kafka failing; rejoining the group with backoff", "group", c.cfg.Group, "error", err)
	}
}

type groupHandler struct{ c *Consumer }

func (h groupHandler) Setup(s sarama.ConsumerGroupSession) error {
	if h.c.failing.Swap(false) {
		h.c.log.Info("orders consumer: rejoined the group", "group", h.c.cfg.Group, "generation", s.GenerationID())
	}
	h.c.readyOnce.Do(func() { close(h.c.ready) })
	return nil
}

func (groupHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (h groupHandler) ConsumeClaim(s sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for {
		select {
		case m, ok := <-claim.Messages():
			if !ok {
				return nil
			}
			h.c.process(s.Context(), m)
			s.MarkMessage(m, "")
		case <-s.Context().Done():
			return nil
		}
	}
}

// process continues the record's trace in a consumer span and hands the
// record to Handle.
func (c *Consumer) process(ctx context.Context, m *sarama.ConsumerMessage) {
	d := Delivery{
		Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Key: string(m.Key),
		Headers: make(map[string]string, len(m.Headers)), Payload: m.Value,
		Timestamp: m.Timestamp, Received: time.Now(),
	}
	for _, h := range m.Headers {
		d.Headers[string(h.Key)] = string(h.Value)
	}
	d.EventID, d.EventType = d.Headers[outbox.HeaderEventID], d.Headers[outbox.HeaderEventType]
	if err := json.Unmarshal(m.Value, &d.Event); err != nil {
		d.Event = OrderEvent{}
	}
	ctx = c.prop.Extract(ctx, propagation.MapCarrier(d.Headers))
	d.Parent = trace.SpanContextFromContext(ctx)
	ctx, span := c.tracer.Start(ctx, "process "+m.Topic,
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			semconv.MessagingSystemKafka,
			semconv.MessagingOperationName("process"),
			semconv.MessagingOperationTypeProcess,
			semconv.MessagingDestinationName(m.Topic),
			semconv.MessagingDestinationPartitionID(strconv.Itoa(int(m.Partition))),
			semconv.MessagingKafkaOffset(int(m.Offset)),
			semconv.MessagingKafkaMessageKey(d.Key),
			semconv.MessagingMessageID(d.EventID),
			semconv.MessagingConsumerGroupName(c.cfg.Group),
		))
	defer span.End()
	if d.Parent.IsValid() {
		d.TraceID = d.Parent.TraceID()
	}
	d.Duplicate = d.EventID != "" && !c.seen.add(d.EventID)
	c.cfg.Handle(ctx, d)
}

// logDelivery is the default Handle: one line per event.
func (c *Consumer) logDelivery(_ context.Context, d Delivery) {
	c.log.Info("orders consumer: event", "type", d.EventType, "order", d.Key, "event_id", d.EventID,
		"trace_id", d.TraceID.String(), "topic", d.Topic, "duplicate", d.Duplicate)
}

// dedup remembers the last n event ids.
type dedup struct {
	mu   sync.Mutex
	ids  map[string]struct{}
	ring []string
	next int
}

func newDedup(n int) *dedup {
	return &dedup{ids: make(map[string]struct{}, n), ring: make([]string, n)}
}

// add records id and reports whether it was new.
func (d *dedup) add(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.ids[id]; ok {
		return false
	}
	if old := d.ring[d.next]; old != "" {
		delete(d.ids, old)
	}
	d.ring[d.next] = id
	d.next = (d.next + 1) % len(d.ring)
	d.ids[id] = struct{}{}
	return true
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// ensureTopics creates the topics that do not exist yet, with the given
// partitions and replication factor 1 (a development setting: production
// topics belong to your platform's tooling).
func ensureTopics(brokers []string, sc *sarama.Config, topics []string, partitions int32) error {
	admin, err := sarama.NewClusterAdmin(brokers, sc)
	if err != nil {
		return err
	}
	defer admin.Close()
	for _, t := range topics {
		err := admin.CreateTopic(t, &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: 1}, false)
		if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
			return fmt.Errorf("create topic %s: %w", t, err)
		}
	}
	return nil
}
