// Package billing is the second example service of fxoutbox: an fx
// application that consumes the orders service's order.confirmed.v1 events
// through the inbox (fxoutbox.InboxModule), writes one invoice per order and
// records an invoice.created.v1 event in the same transaction, which its
// own relay publishes to "billing-service.invoice.created".
//
// The inbox applies each event once for the consumer name (the group): the
// invoice, the inbox row that marks the event applied and the outbox row of
// invoice.created.v1 commit together, so a redelivered record (an offset
// reset, a rebalance, the same event produced twice) is skipped and counted
// as outbox.inbox.processed{outbox.inbox.outcome="duplicate"}. The inbox's
// process span continues the trace the record carries (the HTTP request
// that confirmed the order), and invoice.created.v1 is recorded in that
// span's context, so it carries the same trace to its consumers.
//
//	fx.New(
//		fx.Supply(billing.Config{DatabaseURL: url, Outbox: outboxCfg}),
//		billing.Module,
//	).Run()
package billing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/fxoutbox/outbox/outboxconfig"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/fx"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/fxoutbox"
	"github.com/fxoutbox/outbox/inbox"
	"github.com/fxoutbox/outbox/unitofwork"
)

// ServiceName is the default outbox service name: invoice.created.v1 goes
// to "billing-service.invoice.created".
const ServiceName = "billing-service"

// Event types and the topic the service consumes by default.
const (
	// OrdersTopic is where the orders service publishes order.confirmed.v1.
	OrdersTopic = "order-service.order.confirmed"
	// EventOrderConfirmed is the event type the service applies.
	EventOrderConfirmed = "order.confirmed.v1"
	// EventInvoiceCreated is the event it records for each invoice.
	EventInvoiceCreated = "invoice.created.v1"
	// AggregateInvoice is the aggregate type of its events.
	AggregateInvoice = "invoice"
)

// Config configures the billing service.
type Config struct {
	// DatabaseURL is the PostgreSQL connection string. Required.
	DatabaseURL string
	// Outbox configures fxoutbox (usually fxoutbox.ConfigFromEnv()): the
	// brokers, and the schema of the outbox, inbox and invoices tables
	// (Outbox.Table.Schema; empty: the search_path). The service sets
	// Service to ServiceName when it is empty, always sets Migrate, and
	// declares invoice.created.v1 in EventTypes.
	Outbox fxoutbox.Config
	// Group is the inbox's Kafka consumer group and consumer name. Default
	// ServiceName.
	Group string
	// Topic is the topic of order.confirmed.v1 events. Default OrdersTopic.
	Topic string
	// Inbox tunes the consumer (Concurrency, MaxAttempts, ...); its Group,
	// Routes and Table are set by the service. Default: inbox's defaults.
	Inbox inbox.Config
	// Logger receives the service's logs. Default slog.Default().
	Logger *slog.Logger
	// SpanProcessors receive the service's spans (the inbox's process
	// spans, the relay's publish spans). Default none.
	SpanProcessors []sdktrace.SpanProcessor
	// MetricReaders read the inbox's and the relay's metrics (e.g. a
	// Prometheus exporter, or a sdkmetric.ManualReader). Default none.
	MetricReaders []sdkmetric.Reader
}

func (c Config) withDefaults() (Config, error) {
	if c.DatabaseURL == "" {
		return c, errors.New("billing: DatabaseURL is empty: set DATABASE_URL to a PostgreSQL connection string")
	}
	if c.Outbox.Writer.Service == "" {
		c.Outbox.Writer.Service = ServiceName
	}
	c.Outbox.Migrate = true
	c.Outbox.EventTypes = append(append([]outboxconfig.EventType(nil), c.Outbox.EventTypes...),
		outboxconfig.EventType{AggregateType: AggregateInvoice, Type: EventInvoiceCreated})
	if c.Group == "" {
		c.Group = ServiceName
	}
	if c.Topic == "" {
		c.Topic = OrdersTopic
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}

// Module is the billing service: it needs a Config in the graph and
// provides the pool, tracing, metrics, the outbox (fxoutbox.Module), the
// inbox consumer (fxoutbox.InboxModule, *inbox.Consumer) with its route, and
// the *Invoices store.
var Module = fx.Module("billing",
	fx.Decorate(func(c Config) (Config, error) { return c.withDefaults() }),
	fx.Provide(
		func(c Config) fxoutbox.Config { return c.Outbox },
		func(c Config) *slog.Logger { return c.Logger },
		func(c Config) fxoutbox.InboxConfig {
			ic := c.Inbox
			ic.Group, ic.Name, ic.Routes = c.Group, "", nil
			ic.Table = outbox.Table{Schema: c.Outbox.Table.Schema}
			return fxoutbox.InboxConfig{Consumer: ic, Migrate: true}
		},
		newPool,
		newTelemetry,
		newInvoices,
		fxoutbox.InboxRoute(newRoute),
	),
	fxoutbox.Module,
	fxoutbox.InboxModule,
)

func newPool(lc fx.Lifecycle, c Config) (*pgxpool.Pool, error) {
	pool, err := pgxpool.New(context.Background(), c.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("billing: DATABASE_URL: %w", err)
	}
	lc.Append(fx.Hook{
		OnStart: func(ctx context.Context) error {
			if err := pool.Ping(ctx); err != nil {
				return fmt.Errorf("billing: connect to PostgreSQL: %w", err)
			}
			return nil
		},
		OnStop: func(context.Context) error { pool.Close(); return nil },
	})
	return pool, nil
}

type telemetry struct {
	fx.Out

	Tracer     trace.TracerProvider
	Meter      metric.MeterProvider
	Propagator propagation.TextMapPropagator
}

// newTelemetry provides the tracer and meter providers and the W3C
// propagator that the inbox and the relay use.
func newTelemetry(lc fx.Lifecycle, c Config) telemetry {
	var topts []sdktrace.TracerProviderOption
	for _, p := range c.SpanProcessors {
		topts = append(topts, sdktrace.WithSpanProcessor(p))
	}
	tp := sdktrace.NewTracerProvider(topts...)
	var mopts []sdkmetric.Option
	for _, r := range c.MetricReaders {
		mopts = append(mopts, sdkmetric.WithReader(r))
	}
	mp := sdkmetric.NewMeterProvider(mopts...)
	lc.Append(fx.StopHook(func(ctx context.Context) error {
		return errors.Join(tp.Shutdown(ctx), mp.Shutdown(ctx))
	}))
	return telemetry{
		Tracer:     tp,
		Meter:      mp,
		Propagator: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
	}
}

// OrderConfirmed is the part of the order.confirmed.v1 payload billing
// reads.
type OrderConfirmed struct {
	EventID     string `json:"eventId"`
	AggregateID string `json:"aggregateId"` // the order id
	CustomerID  string `json:"customerId"`
	TotalAmount string `json:"totalAmount"`
}

// InvoiceCreated is the payload of invoice.created.v1.
type InvoiceCreated struct {
	InvoiceID  string `json:"invoiceId"`
	OrderID    string `json:"orderId"`
	CustomerID string `json:"customerId"`
	Amount     string `json:"amount"`
}

// newRoute is the inbox route of order.confirmed.v1: an invoice and its
// invoice.created.v1 event, in the inbox's transaction.
func newRoute(c Config, inv *Invoices) inbox.Route {
	return inbox.Route{
		Topic: c.Topic,
		Type:  EventOrderConfirmed,
		Handler: func(ctx context.Context, tx unitofwork.Tx, m *inbox.Message) error {
			var o OrderConfirmed
			if err := json.Unmarshal(m.Value, &o); err != nil {
				return outbox.Permanent(fmt.Errorf("billing: decode %s: %w", EventOrderConfirmed, err))
			}
			if o.AggregateID == "" {
				return outbox.Permanent(fmt.Errorf("billing: %s without aggregateId", EventOrderConfirmed))
			}
			id, err := inv.create(ctx, tx, o)
			if err != nil {
				return err
			}
			// ctx carries the inbox's process span: the event continues
			// the order's trace.
			return tx.Add(ctx, outbox.Event{
				AggregateType: AggregateInvoice,
				AggregateID:   o.AggregateID, // keyed by order: one order's events stay in order
				Type:          EventInvoiceCreated,
				Payload:       InvoiceCreated{InvoiceID: id, OrderID: o.AggregateID, CustomerID: o.CustomerID, Amount: o.TotalAmount},
			})
		},
	}
}

// Invoices is the invoices table, in the outbox table's schema.
type Invoices struct {
	table string // quoted, schema-qualified
	pool  *pgxpool.Pool
}

func newInvoices(lc fx.Lifecycle, c Config, pool *pgxpool.Pool) *Invoices {
	inv := &Invoices{table: pgx.Identifier{"invoices"}.Sanitize(), pool: pool}
	schema := c.Outbox.Table.Schema
	if schema != "" {
		inv.table = pgx.Identifier{schema, "invoices"}.Sanitize()
	}
	lc.Append(fx.StartHook(func(ctx context.Context) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			// Serializes replicas that start together.
			if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext($1))", "billing-example-schema:"+schema); err != nil {
				return err
			}
			if schema != "" {
				if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize()); err != nil {
					return fmt.Errorf("billing: create schema: %w", err)
				}
			}
			// order_id is unique: were an event applied twice, the second
			// insert would fail (and the record be parked) instead of
			// billing the customer twice.
			_, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+inv.table+` (
				id          uuid          PRIMARY KEY DEFAULT gen_random_uuid(),
				order_id    text          NOT NULL UNIQUE,
				customer_id text          NOT NULL,
				amount      numeric(12,2) NOT NULL,
				event_id    text          NOT NULL,
				created_at  timestamptz   NOT NULL DEFAULT now()
			)`)
			if err != nil {
				return fmt.Errorf("billing: create table %s: %w", inv.table, err)
			}
			return nil
		})
	}))
	return inv
}

func (inv *Invoices) create(ctx context.Context, tx unitofwork.Tx, o OrderConfirmed) (string, error) {
	var id string
	err := tx.QueryRow(ctx, `INSERT INTO `+inv.table+` (order_id, customer_id, amount, event_id)
		VALUES ($1, $2, $3::numeric, $4) RETURNING id::text`, o.AggregateID, o.CustomerID, o.TotalAmount, o.EventID).Scan(&id)
	if err != nil {
		return "", fmt.Errorf("billing: insert the invoice of order %.64q: %w", o.AggregateID, err)
	}
	return id, nil
}

// Invoice is a stored invoice.
type Invoice struct {
	ID, OrderID, CustomerID, Amount, EventID string
}

// ByOrders returns the invoices of the given orders, in order id order.
func (inv *Invoices) ByOrders(ctx context.Context, orderIDs []string) ([]Invoice, error) {
	rows, err := inv.pool.Query(ctx, `SELECT id::text, order_id, customer_id, amount::text, event_id FROM `+inv.table+`
		WHERE order_id = ANY($1) ORDER BY order_id`, orderIDs)
	if err != nil {
		return nil, fmt.Errorf("billing: read invoices: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Invoice, error) {
		var i Invoice
		err := r.Scan(&i.ID, &i.OrderID, &i.CustomerID, &i.Amount, &i.EventID)
		return i, err
	})
}
