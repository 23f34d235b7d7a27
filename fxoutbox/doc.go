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
// commits events, through Do or through AddTx in a transaction of the
// application's own (see unitofwork.UnitOfWork.AddTx). Across processes,
// writers send a coalesced NOTIFY after commits (at most one per
// Config.NotifyInterval per process, outside the business transaction) and
// relays LISTEN for it; Config.DisableNotify and Config.DisableListen turn
// these off. The relay's ticker stays as the safety net for lost signals.
//
// Which module: [Module] in a service that writes and publishes.
// [WriterModule] provides only the unit of work, for pods that write but
// never publish (a web tier with a separate relay deployment): it needs no
// brokers and builds no producer. [RelayModule] runs only the relay.
// Config.DisableRelay (OUTBOX_RELAY=off) is for one image deployed both
// ways: it keeps Module's wiring (and its need for brokers) and only does
// not start the relay, so the same binary turns publishing off by
// environment.
//
// Several outboxes in one application (two tables, each with its own
// service name, topics and relay): [Named] provides each instance's unit of
// work and relay under its name, beside the unnamed Module or without it;
// [NamedFromEnv] reads its Config from variables with a prefix of its own
// ([ConfigFromEnvPrefix]).
//
// The application supplies the *pgxpool.Pool and a [Config]. It may also
// supply a *slog.Logger, a trace.TracerProvider or *sdktrace.TracerProvider,
// a metric.MeterProvider or *sdkmetric.MeterProvider, a
// propagation.TextMapPropagator and a relay.Publisher (instead of the sarama
// producer the module builds from Config); each is optional. Without a
// tracer or meter provider the relay uses otel's global ones; the start-up
// log line says which it uses.
//
// Start: the relay's start hook checks the table (or migrates it, with
// Config.Migrate), checks or creates the declared topics when
// Config.TopicCheck asks for it, logs one line with its configuration, and
// starts publishing. It does not wait for Kafka otherwise: a broker that is
// down does not keep the application from starting (writers do not need
// it); the relay logs the failure and retries with backoff. OnStop finishes
// the in-flight batch within the stop timeout, or abandons it with its rows
// left unpublished, and then closes the producer.
//
// Health: inject *relay.Relay and call its Health method from your
// readiness probe.
//
// Every setting, with its field, variable, default and range: [Configuration].
//
// [Configuration]: https://github.com/fxoutbox/outbox/blob/main/docs/configuration.md
package fxoutbox
