// Package fxoutbox wires the transactional outbox into an uber-go/fx
// application: it provides a *unitofwork.UnitOfWork for handlers and runs a
// *relay.Relay with the application's lifecycle.
//
//	fx.New(
//		fx.Provide(newPool),                 // your *pgxpool.Pool
//		fx.Provide(fxoutbox.ConfigFromEnv),  // or fx.Supply(fxoutbox.Config{...})
//		fxoutbox.Module,
//		fx.Invoke(registerHandlers),         // handlers take *unitofwork.UnitOfWork
//	)
//
// [Module] provides both sides and wakes the relay as soon as a unit of work
// commits events. Across processes, writers send a coalesced NOTIFY after
// commits (at most one per 5ms per process, outside the business
// transaction) and relays LISTEN for it; Config.DisableNotify and
// Config.DisableListen turn these off. The relay's ticker stays as the safety
// net for lost signals. [WriterModule] provides only the unit of work, for pods
// that write but must not publish (a web tier with a separate relay
// deployment); [RelayModule] runs only the relay.
//
// The application supplies the *pgxpool.Pool and a [Config]. It may also
// supply a *slog.Logger, a trace.TracerProvider, a metric.MeterProvider, a
// propagation.TextMapPropagator and a relay.Publisher (instead of the sarama
// producer the module builds from Config); each is optional.
//
// Health: inject *relay.Relay and call its Health method from your
// readiness probe.
//
// The relay starts in OnStart without waiting for Kafka: a broker that is
// down does not keep the application from starting (writers do not need
// it); the relay logs the failure and retries with backoff. OnStop finishes
// the in-flight batch within the stop timeout, or abandons it with its rows
// left unpublished, and then closes the producer.
package fxoutbox

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/fx"

	"github.com/fxoutbox/outbox/migrations"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// Module provides *unitofwork.UnitOfWork and *relay.Relay and runs the relay
// with the application's lifecycle. Commits through the unit of work wake
// the relay at once.
var Module = fx.Module("fxoutbox",
	fx.Provide(NewUnitOfWork, NewRelay),
	fx.Invoke(func(*relay.Relay) {}),
)

// WriterModule provides only *unitofwork.UnitOfWork: a process that records
// events while a relay runs elsewhere.
var WriterModule = fx.Module("fxoutbox.writer",
	fx.Provide(NewUnitOfWork),
)

// RelayModule runs only the relay: a dedicated publishing process.
var RelayModule = fx.Module("fxoutbox.relay",
	fx.Provide(NewRelay),
	fx.Invoke(func(*relay.Relay) {}),
)

// WriterParams are NewUnitOfWork's dependencies.
type WriterParams struct {
	fx.In

	Lifecycle  fx.Lifecycle
	Pool       *pgxpool.Pool
	Config     Config
	Logger     *slog.Logger                  `optional:"true"`
	Propagator propagation.TextMapPropagator `optional:"true"`
	// Relay, when the same application runs one, is woken after each commit.
	Relay *relay.Relay `optional:"true"`
}

// NewUnitOfWork builds the unit of work from Config. At start it applies the
// migrations when Config.Migrate is set, and otherwise checks that the table
// exists, so a missing table fails the start with a clear error.
func NewUnitOfWork(p WriterParams) (*unitofwork.UnitOfWork, error) {
	cfg, err := p.Config.withDefaults()
	if err != nil {
		return nil, err
	}
	wc := &unitofwork.Config{
		Service:    cfg.Service,
		Table:      cfg.Table,
		Topics:     cfg.Topics,
		Limits:     cfg.Limits,
		Propagator: p.Propagator,
	}
	var notifier *unitofwork.Notifier
	if !cfg.DisableNotify {
		if notifier, err = unitofwork.NewNotifier(p.Pool, cfg.Table, 0, p.Logger); err != nil {
			return nil, err
		}
	}
	wake := func() {}
	if p.Relay != nil {
		wake = p.Relay.Wake
	}
	wc.OnCommit = func(int) {
		wake()
		if notifier != nil {
			notifier.Notify()
		}
	}
	u, err := unitofwork.New(p.Pool, wc)
	if err != nil {
		return nil, err
	}
	p.Lifecycle.Append(fx.Hook{
		OnStart: func(ctx context.Context) error {
			if p.Relay != nil && !cfg.DisableRelay {
				return nil // the relay's start hook, which runs first, did it
			}
			return ensureSchema(ctx, p.Pool, cfg)
		},
		OnStop: func(context.Context) error {
			if notifier != nil {
				notifier.Close()
			}
			return nil
		},
	})
	return u, nil
}

// RelayParams are NewRelay's dependencies.
type RelayParams struct {
	fx.In

	Lifecycle      fx.Lifecycle
	Pool           *pgxpool.Pool
	Config         Config
	Logger         *slog.Logger                  `optional:"true"`
	TracerProvider trace.TracerProvider          `optional:"true"`
	MeterProvider  metric.MeterProvider          `optional:"true"`
	Propagator     propagation.TextMapPropagator `optional:"true"`
	// Publisher replaces the sarama producer built from Config.
	Publisher relay.Publisher `optional:"true"`
}

// NewRelay builds the relay and its sarama publisher from Config, and hooks
// them into the lifecycle: Start in OnStart, Stop and then the producer's
// Close in OnStop. An invalid configuration fails here, before start.
func NewRelay(p RelayParams) (*relay.Relay, error) {
	cfg, err := p.Config.withDefaults()
	if err != nil {
		return nil, err
	}
	pub := p.Publisher
	var owned *relay.SaramaPublisher
	if pub == nil {
		sc, err := cfg.saramaConfig()
		if err != nil {
			return nil, err
		}
		// The one size rule: sarama, which counts a record without its
		// batch header, takes every record the relay sends.
		sc.Producer.MaxMessageBytes = cfg.Limits.MaxRecordBytes
		if owned, err = relay.NewSaramaPublisher(cfg.Brokers, sc); err != nil {
			return nil, err
		}
		pub = owned
	}
	r, err := relay.New(p.Pool, pub, &relay.Config{
		Table:             cfg.Table,
		PollInterval:      cfg.PollInterval,
		BatchSize:         cfg.BatchSize,
		MaxBatchSize:      cfg.MaxBatchSize,
		Workers:           cfg.Workers,
		SynchronousCommit: cfg.SynchronousCommit,
		BatchTimeout:      cfg.BatchTimeout,
		MaxBackoff:        cfg.MaxBackoff,
		Ordering:          cfg.Ordering,
		Lanes:             cfg.Lanes,
		Retention:         cfg.Retention,
		Listen:            !cfg.DisableListen,
		MaxAttempts:       cfg.MaxAttempts,
		Poison:            cfg.Poison,
		MaxMessageBytes:   cfg.Limits.MaxRecordBytes, // what the writers accept
		Logger:            p.Logger,
		TracerProvider:    p.TracerProvider,
		MeterProvider:     p.MeterProvider,
		Propagator:        p.Propagator,
	})
	if err != nil {
		return nil, err
	}
	if cfg.DisableRelay {
		return r, nil
	}
	p.Lifecycle.Append(fx.Hook{
		OnStart: func(ctx context.Context) error {
			if err := ensureSchema(ctx, p.Pool, cfg); err != nil {
				return err
			}
			return r.Start(ctx)
		},
		OnStop: func(ctx context.Context) error {
			err := r.Stop(ctx)
			if owned != nil {
				_ = owned.Close()
			}
			return err
		},
	})
	return r, nil
}

func ensureSchema(ctx context.Context, pool *pgxpool.Pool, cfg Config) error {
	if cfg.Migrate {
		return migrations.Up(ctx, pool, cfg.Table)
	}
	return migrations.CheckTable(ctx, pool, cfg.Table)
}
