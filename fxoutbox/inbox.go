package fxoutbox

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/fx"

	"github.com/fxoutbox/outbox/inbox"
	"github.com/fxoutbox/outbox/migrations"
	"github.com/fxoutbox/outbox/unitofwork"
)

// InboxRoutes is the fx value group the inbox's routes are collected from.
const InboxRoutes = `group:"fxoutbox.inbox.routes"`

// InboxModule runs an *inbox.Consumer with the application's lifecycle: a
// Kafka consumer group that applies each record once, in a transaction of
// the application's unit of work. It needs an [InboxConfig] and routes,
// each provided by its own constructor through [InboxRoute]:
//
//	fx.New(
//		fx.Provide(newPool),
//		fx.Provide(fxoutbox.ConfigFromEnv),   // brokers, TLS, SASL; the writer's table and service
//		fx.Supply(fxoutbox.InboxConfig{Consumer: inbox.Config{Group: "billing"}}),
//		fxoutbox.Module,                      // or WriterModule: handlers' events go through the outbox
//		fxoutbox.InboxModule,
//		fx.Provide(fxoutbox.InboxRoute(newOrderConfirmedHandler)), // func(...) inbox.Route
//	)
//
// The consumer starts in OnStart without waiting for Kafka (it joins the
// group in the background and retries); a missing inbox table fails the
// start unless InboxConfig.Migrate is set. OnStop lets records in progress
// finish within the stop timeout (at most inbox.Config.DrainTimeout), rolls
// back the rest, commits the marked offsets and leaves the group.
//
// Health: inject *inbox.Consumer and call its Health method from your
// readiness probe; its List, Retry and Delete methods handle parked records.
var InboxModule = fx.Module("fxoutbox.inbox",
	fx.Provide(newInbox),
	fx.Invoke(func(*inbox.Consumer) {}),
)

// InboxRoute annotates a constructor of an inbox.Route (any function
// returning inbox.Route, and optionally an error, with fx-provided
// parameters) so that its route joins the [InboxRoutes] group:
//
//	fx.Provide(fxoutbox.InboxRoute(func(q *billing.Queries) inbox.Route {
//		return inbox.Route{Topic: "order-service.order.confirmed", Handler: ...}
//	}))
func InboxRoute(constructor any) any {
	return fx.Annotate(constructor, fx.ResultTags(InboxRoutes))
}

// inboxParams are newInbox's dependencies.
type inboxParams struct {
	fx.In

	Lifecycle   fx.Lifecycle
	Pool        *pgxpool.Pool
	InboxConfig InboxConfig
	// Config, when the application has one, gives the brokers and their
	// security.
	Config Config `optional:"true"`
	// UnitOfWork runs the handlers' transactions, so events they add use
	// the application's outbox table and service. Default: a unit of work
	// on Pool with the default table, whose events must name their Topic.
	UnitOfWork     *unitofwork.UnitOfWork        `optional:"true"`
	Routes         []inbox.Route                 `group:"fxoutbox.inbox.routes"`
	Logger         *slog.Logger                  `optional:"true"`
	TracerProvider trace.TracerProvider          `optional:"true"`
	MeterProvider  metric.MeterProvider          `optional:"true"`
	Propagator     propagation.TextMapPropagator `optional:"true"`
}

// newInbox builds the consumer from InboxConfig and the routes and hooks it
// into the lifecycle. An invalid configuration fails here, before start.
func newInbox(p inboxParams) (*inbox.Consumer, error) {
	ic := p.InboxConfig
	cfg, err := ic.ConsumerConfig(p.Config)
	if err != nil {
		return nil, err
	}
	cfg.Routes = append(append([]inbox.Route(nil), cfg.Routes...), p.Routes...)
	if cfg.Logger == nil {
		cfg.Logger = p.Logger
	}
	if cfg.TracerProvider == nil {
		cfg.TracerProvider = p.TracerProvider
	}
	if cfg.MeterProvider == nil {
		cfg.MeterProvider = p.MeterProvider
	}
	if cfg.Propagator == nil {
		cfg.Propagator = p.Propagator
	}
	c, err := inbox.New(p.Pool, p.UnitOfWork, &cfg)
	if err != nil {
		return nil, err
	}
	p.Lifecycle.Append(fx.Hook{
		OnStart: func(ctx context.Context) error {
			if ic.Migrate {
				if err := migrations.Inbox.Up(ctx, p.Pool, cfg.Table); err != nil {
					return err
				}
			}
			return c.Start(ctx)
		},
		OnStop: c.Stop,
	})
	return c, nil
}
