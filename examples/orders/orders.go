// Package orders is the example service of fxoutbox: an fx application that
// takes orders over HTTP and publishes their domain events to Kafka through
// the transactional outbox.
//
//	POST /orders               create an order; records order.created.v1
//	POST /orders/{id}/confirm  confirm it (404 missing, 409 not pending); records order.confirmed.v1
//	GET  /orders/{id}          read it
//	GET  /healthz              relay.Health with a backlog age threshold (503 with the reason)
//	GET  /metrics              the relay's OpenTelemetry metrics in Prometheus text format
//
// The handlers write the order and its event in one unitofwork.Do
// transaction, so an event exists if and only if its order change committed;
// the relay from fxoutbox.Module publishes it to
// "order-service.order.created" or "order-service.order.confirmed", keyed by
// the order id. The confirm handler locks the order row (SELECT ... FOR
// UPDATE) as the spec's ConfirmOrderHandler does, which also keeps one
// order's events in write order.
//
// Every request gets a server span whose parent is the W3C traceparent of
// the request (the response carries the span in a traceresponse header), so
// the trace context the outbox stores with an event, and the relay forwards
// in the Kafka headers, belongs to the request that wrote it.
//
// The module also runs a [Consumer] of those topics, standing in for a
// downstream service: it continues each event's trace in a consumer span,
// drops duplicates by x-event-id, and hands each event to a callback (by
// default, one log line).
//
// The application supplies a [Config]:
//
//	fx.New(
//		fx.Supply(orders.Config{DatabaseURL: url, Outbox: outboxCfg}),
//		orders.Module,
//	).Run()
package orders

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/fx"

	"github.com/fxoutbox/outbox/fxoutbox"
)

// ServiceName is the default outbox service name: topics are
// "order-service.order.created" and "order-service.order.confirmed".
const ServiceName = "order-service"

// Config configures the orders service.
type Config struct {
	// DatabaseURL is the PostgreSQL connection string. Required.
	DatabaseURL string
	// HTTPAddr is the address the HTTP API listens on. Default
	// "127.0.0.1:8080"; port 0 picks a free port (see Server.URL).
	HTTPAddr string
	// Outbox configures fxoutbox (usually fxoutbox.ConfigFromEnv()). The
	// service sets Service to ServiceName when it is empty and always sets
	// Migrate. The orders table lives in Outbox.Table.Schema (empty: the
	// search_path), next to the outbox table.
	Outbox fxoutbox.Config
	// MaxBacklogAge is the age of the oldest unpublished event above which
	// GET /healthz answers 503. Default 30s.
	MaxBacklogAge time.Duration
	// Logger receives the service's and the outbox's logs. Default
	// slog.Default().
	Logger *slog.Logger
	// SpanProcessors receive the service's spans (HTTP server, outbox
	// publish, consumer), e.g. an OTLP batch processor. Default none: spans
	// are created and propagated, but not exported.
	SpanProcessors []sdktrace.SpanProcessor
	// Consumer configures the example consumer.
	Consumer ConsumerConfig
}

func (c Config) withDefaults() (Config, error) {
	if c.DatabaseURL == "" {
		return c, errors.New("orders: DatabaseURL is empty: set DATABASE_URL to a PostgreSQL connection string")
	}
	if c.HTTPAddr == "" {
		c.HTTPAddr = "127.0.0.1:8080"
	}
	if c.Outbox.Writer.Service == "" {
		c.Outbox.Writer.Service = ServiceName
	}
	c.Outbox.Migrate = true
	if c.MaxBacklogAge == 0 {
		c.MaxBacklogAge = 30 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if len(c.Consumer.Brokers) == 0 {
		c.Consumer.Brokers = c.Outbox.Brokers
	}
	if c.Consumer.Group == "" {
		c.Consumer.Group = c.Outbox.Writer.Service + "-example-consumer"
	}
	return c, nil
}

// Module is the orders service: it needs a Config in the graph and provides
// the pool, tracing, metrics, the outbox (fxoutbox.Module), the HTTP
// *Server and the *Consumer.
var Module = fx.Module("orders",
	fx.Decorate(func(c Config) (Config, error) { return c.withDefaults() }),
	fx.Provide(
		func(c Config) fxoutbox.Config { return c.Outbox },
		func(c Config) *slog.Logger { return c.Logger },
		newPool,
		newPropagator,
		newTracing,
		newMetrics,
		newStore,
		newServer,
		newConsumer,
	),
	fxoutbox.Module,
	// Also the global propagator, for other instrumentation in the process
	// (otel's default global propagator is a no-op).
	fx.Invoke(otel.SetTextMapPropagator),
	// The consumer before the server: the server stops first.
	fx.Invoke(func(*Consumer, *Server) {}),
)

// newPropagator provides W3C trace context and baggage to the HTTP
// middleware, the consumer and fxoutbox (which takes an optional
// propagation.TextMapPropagator for both the unit of work and the relay), so
// that all of them read and write the same headers.
func newPropagator() propagation.TextMapPropagator {
	return propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
}

func newPool(lc fx.Lifecycle, c Config) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(c.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("orders: DATABASE_URL: %w", err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		return nil, err
	}
	lc.Append(fx.Hook{
		OnStart: func(ctx context.Context) error {
			if err := pool.Ping(ctx); err != nil {
				return fmt.Errorf("orders: connect to PostgreSQL: %w", err)
			}
			return nil
		},
		OnStop: func(context.Context) error { pool.Close(); return nil },
	})
	return pool, nil
}

// newTracing provides the SDK tracer provider the HTTP middleware, the relay
// (fxoutbox takes an optional trace.TracerProvider) and the consumer use.
func newTracing(lc fx.Lifecycle, c Config) trace.TracerProvider {
	opts := []sdktrace.TracerProviderOption{}
	for _, p := range c.SpanProcessors {
		opts = append(opts, sdktrace.WithSpanProcessor(p))
	}
	tp := sdktrace.NewTracerProvider(opts...)
	lc.Append(fx.StopHook(tp.Shutdown))
	return tp
}
