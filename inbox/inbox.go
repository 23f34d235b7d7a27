package inbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/backoff"
	"github.com/fxoutbox/outbox/internal/parklog"
	"github.com/fxoutbox/outbox/migrations"
	"github.com/fxoutbox/outbox/unitofwork"
)

// DB is what the consumer needs of the database beside the unit of work:
// a *pgxpool.Pool.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Consumer runs a Kafka consumer group whose records are applied once per
// consumer name, each in its own transaction. It is safe for concurrent
// use; Start and Stop run once.
type Consumer struct {
	cfg    Config
	db     DB
	uow    *unitofwork.UnitOfWork
	topics []string
	routes map[[2]string]Handler
	sql    statements
	tracer trace.Tracer
	ms     *metrics
	// parkLog: the lines of parked records, the first per cause one by
	// one, then summaries (see newParkLog).
	parkLog *parklog.Log

	mu      sync.Mutex
	started bool
	cancel  context.CancelFunc // ends the consume loop (soft stop)
	hard    context.Context    // cancelled when Stop runs out of time
	kill    context.CancelFunc
	done    chan struct{}

	lag     sync.Map // topic/partition -> *atomic.Int64
	joined  atomic.Bool
	lastErr atomic.Pointer[errAt]
}

type errAt struct {
	err error
	at  time.Time
}

// New returns a consumer of the configured topics that applies records
// through uow (the application's unit of work, so the events handlers add
// use its outbox table and service name) and keeps its inbox on db. A nil
// uow means unitofwork.New(db, nil): handlers' events must then name their
// Topic. New does no I/O; Start joins the group.
func New(db DB, uow *unitofwork.UnitOfWork, cfg *Config) (*Consumer, error) {
	if db == nil {
		return nil, &outbox.ConfigError{Field: "db", Reason: "is nil: pass the application's *pgxpool.Pool"}
	}
	if cfg == nil {
		return nil, &outbox.ConfigError{Field: "Config", Reason: "is nil: Group, Brokers and Routes are required"}
	}
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	var err error
	if uow == nil {
		if uow, err = unitofwork.New(db, &unitofwork.Config{Propagator: c.Propagator}); err != nil {
			return nil, err
		}
	}
	tp := c.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	mp := c.MeterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	in := &Consumer{
		cfg:    c,
		db:     db,
		uow:    uow,
		routes: map[[2]string]Handler{},
		sql:    newStatements(c.Table),
		tracer: tp.Tracer("github.com/fxoutbox/outbox/inbox"),
	}
	in.parkLog = newParkLog(c.Logger, c.Name)
	for _, r := range c.Routes {
		in.routes[[2]string{r.Topic, r.Type}] = r.Handler
		if !slices.Contains(in.topics, r.Topic) {
			in.topics = append(in.topics, r.Topic)
		}
	}
	if in.ms, err = newMetrics(mp.Meter("github.com/fxoutbox/outbox/inbox"), in); err != nil {
		return nil, err
	}
	return in, nil
}

// route returns the handler for a record's topic and event type.
func (c *Consumer) route(topic, typ string) Handler {
	if h, ok := c.routes[[2]string{topic, typ}]; ok {
		return h
	}
	return c.routes[[2]string{topic, ""}]
}

// Start checks that the inbox table exists and starts consuming in the
// background: it joins the group and rejoins after failures with backoff,
// so a broker that is down does not fail the start. Stop ends it.
func (c *Consumer) Start(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started {
		return errors.New("inbox: Start called twice")
	}
	if err := migrations.Inbox.Check(ctx, c.db, c.cfg.Table); err != nil {
		return fmt.Errorf("inbox: %w", err)
	}
	c.started = true
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c.hard, c.kill = context.WithCancel(context.WithoutCancel(ctx))
	c.cancel = cancel
	c.done = make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { c.run(runCtx) })
	if c.cfg.Retention > 0 {
		wg.Go(func() { c.cleanupLoop(runCtx) })
	}
	wg.Go(func() { c.parkLog.Run(runCtx) })
	// The last summary of parked records follows the last record.
	go func() { wg.Wait(); c.parkLog.Flush(); close(c.done) }()
	c.cfg.Logger.Info("outbox inbox: started", "consumer", c.cfg.Name, "group", c.cfg.Group, "topics", c.topics, "table", c.cfg.Table.String(),
		"concurrency", c.cfg.Concurrency, "batch_size", c.cfg.BatchSize, "poison", c.cfg.Poison.String(), "dead_letter_topic", c.cfg.DeadLetterTopic)
	return nil
}

// Stop leaves the group: records in progress get until ctx's deadline (at
// most DrainTimeout) to commit; the rest roll back and are left to the next
// owner, their offsets uncommitted. It then commits the marked offsets and
// closes the group. After ctx is done it cancels whatever still runs and
// returns ctx's error once everything has stopped.
func (c *Consumer) Stop(ctx context.Context) error {
	c.mu.Lock()
	started := c.started
	c.mu.Unlock()
	if !started {
		return nil
	}
	c.cancel()
	select {
	case <-c.done:
		c.kill()
		return nil
	case <-ctx.Done():
		c.kill()
		<-c.done
		return fmt.Errorf("inbox: stop: %w", ctx.Err())
	}
}

// Health reports whether the consumer works: nil while it is in a group
// session, or before its first failure; otherwise the last error joining
// the group or consuming, with the time failures began.
func (c *Consumer) Health(context.Context) error {
	c.mu.Lock()
	started := c.started
	c.mu.Unlock()
	if !started {
		return errors.New("inbox: not started")
	}
	if c.joined.Load() {
		return nil
	}
	if e := c.lastErr.Load(); e != nil {
		return fmt.Errorf("inbox: not consuming since %s: %w", e.at.Format(time.RFC3339), e.err)
	}
	return nil
}

// fail records err as the last failure, keeping the time of the first
// failure of the current run of failures.
func (c *Consumer) fail(err error) {
	at := time.Now()
	if prev := c.lastErr.Load(); prev != nil {
		at = prev.at
	}
	c.lastErr.Store(&errAt{err: err, at: at})
}

// run joins the group and consumes until ctx ends.
func (c *Consumer) run(ctx context.Context) {
	b := backoff.Backoff{Initial: c.cfg.MinBackoff * 10, Max: c.cfg.MaxBackoff}
	for ctx.Err() == nil {
		group, err := sarama.NewConsumerGroup(c.cfg.Brokers, c.cfg.Group, c.cfg.Sarama)
		if err != nil {
			c.fail(err)
			c.cfg.Logger.Warn("outbox inbox: cannot reach the brokers; retrying with backoff", "consumer", c.cfg.Name, "group", c.cfg.Group, "error", err)
			if !b.Wait(ctx, nil, nil) {
				return
			}
			continue
		}
		c.consume(ctx, group, &b)
		return
	}
}

func (c *Consumer) consume(ctx context.Context, group sarama.ConsumerGroup, b *backoff.Backoff) {
	var wg sync.WaitGroup
	defer wg.Wait()
	errs := group.Errors()
	wg.Go(func() {
		for err := range errs {
			if errors.Is(err, context.Canceled) {
				continue
			}
			c.cfg.Logger.Warn("outbox inbox: consumer group error", "consumer", c.cfg.Name, "group", c.cfg.Group, "error", err)
		}
	})
	defer func() { // commits the marked offsets, leaves the group, ends the errors loop
		if err := group.Close(); err != nil {
			c.cfg.Logger.Warn("outbox inbox: closing the consumer group failed", "consumer", c.cfg.Name, "group", c.cfg.Group, "error", err)
		}
	}()
	h := &groupHandler{c: c}
	for ctx.Err() == nil {
		err := group.Consume(ctx, c.topics, h)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			c.joined.Store(false)
			c.fail(err)
			c.cfg.Logger.Warn("outbox inbox: joining the group failed; retrying with backoff", "consumer", c.cfg.Name, "group", c.cfg.Group, "error", err)
			if !b.Wait(ctx, nil, nil) {
				return
			}
			continue
		}
		b.Reset()
	}
}

// groupHandler is the sarama ConsumerGroupHandler.
type groupHandler struct{ c *Consumer }

func (h *groupHandler) Setup(s sarama.ConsumerGroupSession) error {
	h.c.joined.Store(true)
	h.c.lastErr.Store(nil)
	h.c.cfg.Logger.Info("outbox inbox: joined the group", "consumer", h.c.cfg.Name, "group", h.c.cfg.Group,
		"member", s.MemberID(), "generation", s.GenerationID(), "claims", s.Claims())
	return nil
}

func (h *groupHandler) Cleanup(sarama.ConsumerGroupSession) error {
	h.c.joined.Store(false)
	return nil
}

func (h *groupHandler) ConsumeClaim(s sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	return newPartition(h.c, s, claim).run()
}

func (c *Consumer) isStarted() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.started
}
