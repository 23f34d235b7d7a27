package fxoutbox

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"strings"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/fx"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/envconfig"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/textcut"
	"github.com/fxoutbox/outbox/migrations"
	"github.com/fxoutbox/outbox/outboxconfig"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// Module provides *unitofwork.UnitOfWork and *relay.Relay and runs the relay
// with the application's lifecycle. Commits through the unit of work wake
// the relay at once.
var Module = fx.Module("fxoutbox",
	fx.Provide(newUnitOfWork, newRelay),
	fx.Invoke(configCheck{writes: true, publishes: true}.run, runRelay),
)

// WriterModule provides only *unitofwork.UnitOfWork: a process that records
// events while a relay runs elsewhere. It needs no brokers.
var WriterModule = fx.Module("fxoutbox.writer",
	fx.Provide(newUnitOfWork),
	fx.Invoke(configCheck{writes: true}.run),
)

// RelayModule runs only the relay: a dedicated publishing process.
var RelayModule = fx.Module("fxoutbox.relay",
	fx.Provide(newRelay),
	fx.Invoke(configCheck{publishes: true}.run, runRelay),
)

// configCheck is what the unnamed modules invoke first: a check of the
// Config from the graph, so that a configuration error fails the
// application as it is, prefixed fxoutbox "default", before a constructor
// returns it inside fx's frames ("could not build arguments ... received
// non-nil error from function ..."). writes and publishes say which sides
// the module builds.
type configCheck struct{ writes, publishes bool }

// checkParams are a configCheck's dependencies: the Config, and the
// publisher that makes brokers unnecessary.
type checkParams struct {
	fx.In

	Config    Config
	Publisher relay.Publisher `optional:"true"`
}

func (k configCheck) run(p checkParams) error {
	pub := publisherNone
	if p.Publisher != nil {
		pub = publisherGiven
	}
	in := &instance{cfg: p.Config}
	return in.fail(check(p.Config, k.writes, k.publishes, pub))
}

// publisherKnown says whether the application supplies a relay.Publisher,
// which makes the brokers unnecessary.
type publisherKnown int

const (
	publisherUnknown publisherKnown = iota // not yet: check only the brokers given
	publisherNone                          // no: the brokers are required
	publisherGiven                         // yes: the brokers are not used
)

// runRelay makes fx build the relay, whose constructor hooks it into the
// lifecycle, even when nothing else asks for it.
func runRelay(*relay.Relay) {}

// writerParams are newUnitOfWork's dependencies.
type writerParams struct {
	fx.In

	Lifecycle  fx.Lifecycle
	Pool       *pgxpool.Pool
	Config     Config
	Logger     *slog.Logger                  `optional:"true"`
	Propagator propagation.TextMapPropagator `optional:"true"`
	// Relay, when the same application runs one, is woken after each commit.
	Relay *relay.Relay `optional:"true"`
}

// newUnitOfWork builds the unit of work from Config. At start it applies the
// migrations when Config.Migrate is set, and otherwise checks that the table
// exists and has every migration's columns, so a missing or outdated table
// fails the start with a clear error. When the application stops it stops
// the unit of work's notifier and AddTx commit watcher.
func newUnitOfWork(p writerParams) (*unitofwork.UnitOfWork, error) {
	in := &instance{pool: p.Pool, log: logger(p.Logger), prop: p.Propagator}
	if err := in.configure(p.Config); err != nil {
		return nil, in.fail(err)
	}
	// The relay's start hook, which runs first, checks the table.
	u, err := in.writer(p.Lifecycle, p.Relay, p.Relay != nil)
	return u, in.fail(err)
}

// relayParams are newRelay's dependencies.
type relayParams struct {
	fx.In

	Lifecycle fx.Lifecycle
	Pool      *pgxpool.Pool
	Config    Config
	Logger    *slog.Logger `optional:"true"`
	// TracerProvider, or else SDKTracerProvider, creates the publish spans.
	// Default: otel.GetTracerProvider().
	TracerProvider    trace.TracerProvider     `optional:"true"`
	SDKTracerProvider *sdktrace.TracerProvider `optional:"true"`
	// MeterProvider, or else SDKMeterProvider, creates the relay's metrics.
	// Default: otel.GetMeterProvider().
	MeterProvider    metric.MeterProvider          `optional:"true"`
	SDKMeterProvider *sdkmetric.MeterProvider      `optional:"true"`
	Propagator       propagation.TextMapPropagator `optional:"true"`
	// Publisher replaces the sarama producer built from Config.
	Publisher relay.Publisher `optional:"true"`
}

// newRelay builds the relay and its sarama publisher from Config, and hooks
// them into the lifecycle: in OnStart the table and topic checks, a log line
// with the relay's configuration, and Start; in OnStop, Stop and then the
// producer's Close. An invalid configuration fails here, before start.
func newRelay(p relayParams) (*relay.Relay, error) {
	in := &instance{pool: p.Pool, log: logger(p.Logger), prop: p.Propagator, pub: p.Publisher}
	in.telemetry(p.TracerProvider, p.SDKTracerProvider, p.MeterProvider, p.SDKMeterProvider)
	if err := in.configure(p.Config); err != nil {
		return nil, in.fail(err)
	}
	r, err := in.relay(p.Lifecycle)
	return r, in.fail(err)
}

// Named returns an fx option that runs one more outbox, named name, with
// its own Config (table, service, topics, relay settings): it provides
// *unitofwork.UnitOfWork and *relay.Relay tagged `name:"<name>"` and runs
// that relay with the application's lifecycle, with hooks of its own. It
// shares the application's *pgxpool.Pool (or uses one tagged with the same
// name, when the application provides it), logger, tracer and meter
// providers and propagator; a relay.Publisher tagged with the name replaces
// its sarama producer. Its internals are not in the graph, so Named
// instances live beside each other and beside the unnamed Module.
//
//	fx.New(
//		fx.Provide(newPool),
//		fxoutbox.Named("payments", fxoutbox.Config{Writer: unitofwork.Config{Service: "payment-service"}, Brokers: brokers}),
//		fxoutbox.Named("audit", fxoutbox.Config{Writer: unitofwork.Config{Service: "audit"}, Table: outbox.Table{Name: "audit_outbox"}, Brokers: brokers}),
//		fx.Invoke(fx.Annotate(newHandlers, fx.ParamTags(`name:"payments"`, `name:"audit"`))),
//	)
//
// To write to both tables in one transaction, run Do on one unit of work
// and AddTx on the other with unitofwork.PgxTx(tx); both relays are woken
// after the commit. A name is letters, digits, '-', '_' and '.'.
//
// Named checks cfg at once, as far as it can without the application's
// graph (every field, the service name, the relay's settings, the broker
// addresses, the declared topics): an error fails the application before
// any constructor runs, reported once by fx, prefixed with the outbox's
// name (fxoutbox "audit": ...). The errors of the constructor and of the
// start hooks carry the same prefix; those of the unnamed modules, which
// check their Config before building anything, fxoutbox "default".
func Named(name string, cfg Config) fx.Option {
	if !nameRE.MatchString(name) {
		return fx.Error(&outbox.ConfigError{Field: "Named", Reason: fmt.Sprintf("name %s is not usable: use 1-64 letters, digits, '-', '_' or '.'", textcut.Quote(name, 64))})
	}
	if err := check(cfg, true, true, publisherUnknown); err != nil {
		names, _ := namesOf(cfg)
		return fx.Error(fmt.Errorf("fxoutbox %q: %w", name, names.Rename(err)))
	}
	n := &named{name: name, cfg: cfg}
	tag := `name:"` + name + `"`
	opt := `name:"` + name + `" optional:"true"`
	return fx.Module("fxoutbox."+name,
		fx.Provide(fx.Annotate(n.provide,
			fx.ParamTags(``, ``, opt, `optional:"true"`, `optional:"true"`, `optional:"true"`, `optional:"true"`, `optional:"true"`, `optional:"true"`, opt),
			fx.ResultTags(tag, tag))),
		fx.Invoke(fx.Annotate(n.checkBrokers, fx.ParamTags(opt)), fx.Annotate(runRelay, fx.ParamTags(tag))),
	)
}

// checkBrokers is the part of Named's check that needs the graph: brokers,
// unless the application supplies the instance's relay.Publisher. It runs
// (an fx.Invoke) before the instance is built, for the reason of
// configCheck.
func (n *named) checkBrokers(pub relay.Publisher) error {
	if pub != nil {
		return nil
	}
	in := &instance{name: n.name, cfg: n.cfg}
	return in.fail(envconfig.ValidateBrokers(n.cfg.Brokers, "Brokers [KAFKA_BROKERS]"))
}

// NamedFromEnv is Named with the Config read by ConfigFromEnvPrefix(prefix):
// each outbox of a service configured from its own variables, the Kafka
// ones shared unless set with the prefix. A configuration error fails the
// application's start, naming the outbox and the variable.
//
//	fxoutbox.NamedFromEnv("payments", ""),      // OUTBOX_SERVICE=payment-service KAFKA_BROKERS=kafka:9092
//	fxoutbox.NamedFromEnv("audit", "AUDIT_"),   // AUDIT_OUTBOX_SERVICE=audit AUDIT_OUTBOX_TABLE=audit_outbox
func NamedFromEnv(name, prefix string) fx.Option {
	cfg, err := ConfigFromEnvPrefix(prefix)
	if err != nil {
		return fx.Error(fmt.Errorf("fxoutbox %q: %w", name, err))
	}
	return Named(name, cfg)
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

type named struct {
	name string
	cfg  Config
}

// provide builds a named instance: its relay, then its unit of work, which
// wakes that relay.
func (n *named) provide(lc fx.Lifecycle, pool, ownPool *pgxpool.Pool, log *slog.Logger,
	tp trace.TracerProvider, sdkTP *sdktrace.TracerProvider, mp metric.MeterProvider, sdkMP *sdkmetric.MeterProvider,
	prop propagation.TextMapPropagator, pub relay.Publisher,
) (*unitofwork.UnitOfWork, *relay.Relay, error) {
	if ownPool != nil {
		pool = ownPool
	}
	in := &instance{name: n.name, pool: pool, log: logger(log).With("outbox", n.name), prop: prop, pub: pub}
	in.telemetry(tp, sdkTP, mp, sdkMP)
	if err := in.configure(n.cfg); err != nil {
		return nil, nil, in.fail(err)
	}
	r, err := in.relay(lc)
	if err != nil {
		return nil, nil, in.fail(err)
	}
	u, err := in.writer(lc, r, true)
	if err != nil {
		return nil, nil, in.fail(err)
	}
	return u, r, nil
}

// instance is one outbox: the dependencies it was given and what it built.
type instance struct {
	name string // "" for the unnamed modules
	pool *pgxpool.Pool
	log  *slog.Logger
	prop propagation.TextMapPropagator
	pub  relay.Publisher

	tp             trace.TracerProvider
	mp             metric.MeterProvider
	tpFrom, mpFrom string // where they came from, for the start-up line

	cfg Config // defaults filled in
}

func logger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.Default()
	}
	return l
}

// telemetry picks the tracer and meter providers: the interfaces the
// application provided, else the SDK's concrete types (which fx does not
// match to the interfaces), else otel's globals.
func (in *instance) telemetry(tp trace.TracerProvider, sdkTP *sdktrace.TracerProvider, mp metric.MeterProvider, sdkMP *sdkmetric.MeterProvider) {
	switch {
	case tp != nil:
		in.tp, in.tpFrom = tp, "fx trace.TracerProvider"
	case sdkTP != nil:
		in.tp, in.tpFrom = sdkTP, "fx *sdktrace.TracerProvider"
	default:
		in.tpFrom = "otel global"
		if fmt.Sprintf("%T", otel.GetTracerProvider()) == "*global.tracerProvider" {
			in.tpFrom = "otel global (not set: no spans until otel.SetTracerProvider)"
		}
	}
	switch {
	case mp != nil:
		in.mp, in.mpFrom = mp, "fx metric.MeterProvider"
	case sdkMP != nil:
		in.mp, in.mpFrom = sdkMP, "fx *sdkmetric.MeterProvider"
	default:
		in.mpFrom = "otel global"
		if fmt.Sprintf("%T", otel.GetMeterProvider()) == "*global.meterProvider" {
			in.mpFrom = "otel global (not set: no metrics until otel.SetMeterProvider)"
		}
	}
}

func (in *instance) configure(c Config) error {
	in.cfg = c
	cfg, err := c.WithDefaults()
	if err != nil {
		return err
	}
	in.cfg = cfg
	return nil
}

// fail is how the outbox reports err, a configuration or start error:
// once, prefixed with its name ("default" for the unnamed modules), naming
// the variables as they are set.
func (in *instance) fail(err error) error {
	if err == nil {
		return nil
	}
	name := in.name
	if name == "" {
		name = "default"
	}
	names, _ := namesOf(in.cfg)
	return fmt.Errorf("fxoutbox %q: %w", name, names.Rename(err))
}

// check returns the first configuration error of c for a module that
// builds the writer, the relay or both: a field's, the writer's (a service
// name to derive topics from), the broker addresses' (required unless the
// application supplies a relay.Publisher), the declared topics' when
// checked, the relay settings'. Named runs it when the option is built, so
// that fx reports the error once, as it is (fx.Error), instead of as a
// constructor's, in reflection frames; the unnamed modules run it first
// thing (configCheck).
func check(c Config, writes, publishes bool, pub publisherKnown) error {
	if _, err := c.WithDefaults(); err != nil {
		return err
	}
	if writes {
		if _, err := c.UnitOfWork(); err != nil {
			return err
		}
	}
	if !publishes {
		return nil
	}
	if pub == publisherNone || (pub == publisherUnknown && len(c.Brokers) > 0) {
		if err := envconfig.ValidateBrokers(c.Brokers, "Brokers [KAFKA_BROKERS]"); err != nil {
			return err
		}
	}
	if c.TopicCheck != outboxconfig.TopicsOff {
		if _, err := declaredTopics(c); err != nil {
			return err
		}
	}
	_, err := c.RelayConfig()
	return err
}

// writer builds the unit of work; it wakes r, if any, after commits.
// relayChecks says r's start hook checks the table, so this one need not.
func (in *instance) writer(lc fx.Lifecycle, r *relay.Relay, relayChecks bool) (*unitofwork.UnitOfWork, error) {
	cfg := in.cfg
	uc, err := cfg.UnitOfWork()
	if err != nil {
		return nil, err
	}
	var notifier *unitofwork.Notifier
	if !cfg.DisableNotify {
		if notifier, err = unitofwork.NewNotifier(in.pool, cfg.Table, cfg.NotifyInterval, in.log); err != nil {
			return nil, err
		}
	}
	w := &writerHooks{in: in, relay: r, notifier: notifier, relayChecks: relayChecks, onCommitted: uc.OnCommit}
	uc.OnCommit = w.onCommit
	if uc.Propagator == nil {
		uc.Propagator = in.prop
	}
	if uc.Logger == nil {
		uc.Logger = in.log
	}
	u, err := unitofwork.New(in.pool, &uc)
	if err != nil {
		return nil, err
	}
	w.uow = u
	lc.Append(fx.Hook{OnStart: w.start, OnStop: w.stop})
	return u, nil
}

type writerHooks struct {
	in          *instance
	relay       *relay.Relay
	notifier    *unitofwork.Notifier
	uow         *unitofwork.UnitOfWork
	relayChecks bool
	onCommitted func(events int) // Config.Writer.OnCommit
}

// onCommit wakes the relay of this process and, through a NOTIFY after
// the commit, those of other processes.
func (w *writerHooks) onCommit(events int) {
	if w.relay != nil {
		w.relay.Wake()
	}
	if w.notifier != nil {
		w.notifier.Notify()
	}
	if w.onCommitted != nil {
		w.onCommitted(events)
	}
}

func (w *writerHooks) start(ctx context.Context) error {
	if w.relayChecks {
		return nil // the relay's start hook, which runs first, did it
	}
	w.in.warnings()
	return w.in.fail(ensureSchema(ctx, w.in.pool, w.in.cfg))
}

func (w *writerHooks) stop(context.Context) error {
	w.uow.Close()
	if w.notifier != nil {
		w.notifier.Close()
	}
	return nil
}

// relay builds the relay and its publisher and hooks them into lc.
func (in *instance) relay(lc fx.Lifecycle) (*relay.Relay, error) {
	cfg := in.cfg
	h := &relayHooks{in: in}
	pub := in.pub
	if pub != nil && cfg.Partitioner != 0 {
		return nil, &outbox.ConfigError{Field: "Partitioner [OUTBOX_PARTITIONER]", Reason: "is " + cfg.Partitioner.String() +
			", but the relay publishes through a relay.Publisher from fx, which chooses partitions itself: configure the partitioner there, or unset this"}
	}
	names, _ := namesOf(cfg)
	if pub == nil {
		if err := envconfig.ValidateBrokers(cfg.Brokers, "Brokers [KAFKA_BROKERS]"); err != nil {
			return nil, err
		}
		sc, err := cfg.SaramaConfig()
		if err != nil {
			return nil, err
		}
		if h.owned, err = relay.NewSaramaPublisher(cfg.Brokers, sc); err != nil {
			return nil, err
		}
		h.owned.NameBrokers(names.Name("KAFKA_BROKERS"))
		pub, h.sarama = h.owned, sc
	}
	if cfg.TopicCheck != outboxconfig.TopicsOff {
		if h.sarama == nil {
			return nil, &outbox.ConfigError{Field: "TopicCheck [OUTBOX_TOPICS]", Reason: "needs the sarama producer the module builds from Brokers; " +
				"with a relay.Publisher of your own, check topics yourself or set OUTBOX_TOPICS=off"}
		}
		topics, err := declaredTopics(cfg)
		if err != nil {
			return nil, err
		}
		h.topics = topics
	}
	rc, err := cfg.RelayConfig()
	if err == nil {
		rc.Logger, rc.TracerProvider, rc.MeterProvider, rc.Propagator = orElse(rc.Logger, in.log), orElse(rc.TracerProvider, in.tp),
			orElse(rc.MeterProvider, in.mp), orElse(rc.Propagator, in.prop)
		var r *relay.Relay
		if r, err = relay.New(in.pool, pub, &rc); err == nil {
			h.relay = r
		}
	}
	if err != nil {
		if h.owned != nil {
			_ = h.owned.Close()
		}
		return nil, err
	}
	lc.Append(fx.Hook{OnStart: h.start, OnStop: h.stop})
	return h.relay, nil
}

// orElse is v, or else (v is nil) from fx.
func orElse[T comparable](v, fromFx T) T {
	var zero T
	if v == zero {
		return fromFx
	}
	return v
}

type relayHooks struct {
	in     *instance
	relay  *relay.Relay
	owned  *relay.SaramaPublisher
	sarama *sarama.Config // of owned, for the topic check
	topics []string       // to check or create at start
}

func (h *relayHooks) start(ctx context.Context) error {
	in, cfg := h.in, h.in.cfg
	in.warnings()
	if err := ensureSchema(ctx, in.pool, cfg); err != nil {
		return in.fail(err)
	}
	if cfg.DisableRelay {
		names, _ := namesOf(cfg)
		in.log.Info("outbox relay not started ("+names.Name("OUTBOX_RELAY")+"=off); this process only writes", "table", cfg.Table.String())
		return nil
	}
	if len(h.topics) > 0 {
		if err := ensureTopics(ctx, cfg, h.sarama, h.topics, in.log); err != nil {
			return in.fail(err)
		}
	}
	in.log.Info("outbox relay starting", append(in.summary(h), "partitioner", h.partitioner())...)
	return in.fail(h.relay.Start(ctx))
}

// partitioner names how the relay's producer maps keys to partitions.
func (h *relayHooks) partitioner() string {
	if h.sarama == nil {
		return "relay.Publisher from fx"
	}
	return partitionerName(h.sarama)
}

func (h *relayHooks) stop(ctx context.Context) error {
	if h.in.cfg.DisableRelay {
		if h.owned != nil {
			_ = h.owned.Close()
		}
		return nil
	}
	err := h.relay.Stop(ctx)
	if h.owned != nil {
		_ = h.owned.Close()
	}
	return err
}

// summary is the start-up line's attributes: what the relay publishes from
// where to where, how, and with which telemetry.
func (in *instance) summary(h *relayHooks) []any {
	cfg, rc := in.cfg, h.relay.Config()
	brokers := "relay.Publisher from fx"
	if h.owned != nil {
		brokers = strings.Join(cfg.Brokers, ",")
	}
	var mode string
	var stream []any // the stream's keys, after mode
	if rc.Mode == relay.Stream {
		// The relay follows the slot, not a ticker or LISTEN; it claims only
		// what the stream is behind (requeued events, retries) every sweep.
		slot := cfg.Table.Slot(in.streamDatabase(rc.Stream))
		mode = fmt.Sprintf("stream, lag limits %v and %s, sweep %v",
			rc.Stream.MaxLag, lagBytes(rc.Stream.MaxLagBytes), rc.Stream.SweepInterval)
		stream = []any{"slot", slot, "publication", cfg.Table.Publication()}
	} else {
		mode = fmt.Sprintf("poll %v, wake-ups in process", rc.PollInterval)
		if rc.Listen {
			mode += " and by LISTEN " + sqlname.Channel(cfg.Table)
		}
	}
	mode += fmt.Sprintf(", %d worker(s), batch %d-%d", rc.Workers, rc.BatchSize, rc.MaxBatchSize)
	ordering := "per-key"
	if rc.Ordering == relay.Unordered {
		ordering = "unordered"
	}
	service := cfg.Writer.Service
	if service == "" {
		service = "(none: events name their topics)"
	}
	topics := "off"
	if len(h.topics) > 0 {
		topics = fmt.Sprintf("%s, %d topic(s)", cfg.TopicCheck, len(h.topics))
	}
	delivery := rc.Delivery.String()
	if rc.Delivery == relay.ExactlyOnce {
		delivery += fmt.Sprintf(", progress topic %s, transactional ids %s.<relay>.<n>, transaction timeout %v", rc.ProgressTopic, rc.TransactionalID, rc.TransactionTimeout)
	}
	attrs := []any{"table", cfg.Table.String(), "service", service, "ordering", ordering, "delivery", delivery, "brokers", brokers, "mode", mode}
	attrs = append(attrs, stream...)
	cloudEvents := rc.CloudEvents.Mode.String()
	if rc.CloudEvents.Mode == outbox.CloudEventsBinary {
		cloudEvents += ", source " + rc.CloudEvents.Source
	}
	return append(attrs, "topic_check", topics, "tracer", in.tpFrom, "meter", in.mpFrom, "cloudevents", cloudEvents)
}

// streamDatabase is the database the streaming relay's replication
// connection opens (its slot's name includes it): that of
// StreamConfig.ConnConfig, else the pool's; PostgreSQL's default, the
// user's name, when the configuration names none.
func (in *instance) streamDatabase(sc relay.StreamConfig) string {
	var cc *pgconn.Config
	switch {
	case sc.ConnConfig != nil:
		cc = sc.ConnConfig
	case in.pool != nil:
		cc = &in.pool.Config().ConnConfig.Config
	default:
		return ""
	}
	if cc.Database != "" {
		return cc.Database
	}
	return cc.User
}

// lagBytes prints a byte count in the largest binary unit that divides it
// (1 GiB, 512 MiB), else in bytes.
func lagBytes(n int64) string {
	for _, u := range []struct {
		shift uint
		name  string
	}{{30, "GiB"}, {20, "MiB"}, {10, "KiB"}} {
		if n >= 1<<u.shift && n%(1<<u.shift) == 0 {
			return fmt.Sprintf("%d %s", n>>u.shift, u.name)
		}
	}
	return fmt.Sprintf("%d bytes", n)
}

// warnings logs, once per start, what ConfigFromEnv found doubtful but not
// wrong enough to fail on.
func (in *instance) warnings() {
	_, warnings := namesOf(in.cfg)
	for _, w := range warnings {
		in.log.Warn("outbox config: " + w)
	}
}

func ensureSchema(ctx context.Context, pool *pgxpool.Pool, cfg Config) error {
	if cfg.Migrate {
		if cfg.Relay.ProgressFollowsTable() {
			// A table made now gets the cursor migration with it, and its
			// relays (ProgressAuto) cursor progress; one that exists
			// keeps its progress.
			_, err := migrations.Install(ctx, pool, cfg.Table)
			return err
		}
		if err := migrations.Outbox.Up(ctx, pool, cfg.Table); err != nil {
			return err
		}
		if cfg.Relay.Progress == relay.ProgressCursor {
			return migrations.Cursor.Up(ctx, pool, cfg.Table)
		}
		return nil
	}
	return migrations.Outbox.Check(ctx, pool, cfg.Table)
}
