package fxoutbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/fx"
	"go.uber.org/fx/fxevent"
	"go.uber.org/fx/fxtest"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/fxoutbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/migrations"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// logs is a concurrency-safe buffer behind a *slog.Logger.
type logs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func newLogs() (*logs, *slog.Logger) {
	l := &logs{}
	return l, slog.New(slog.NewTextHandler(l, nil))
}

// unpublished counts table's rows not yet published.
func unpublished(t *testing.T, pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, tbl outbox.Table) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+sqlname.Ident(tbl)+" WHERE published_at IS NULL").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Two named outboxes and the unnamed Module in one application: each has
// its table, service, topics and relay, injected by name; one transaction
// writes to two tables and both relays publish at once (their poll
// interval is an hour: only the after-commit wake-up can do it).
func TestNamedInstancesSideBySide(t *testing.T) {
	pool := testenv.Pool(t)
	brokers := testenv.Brokers(t)
	payTbl, auditTbl, mainTbl := testenv.Table(t, pool), testenv.Table(t, pool), testenv.Table(t, pool)
	paySvc, auditSvc := testenv.Name("pay"), testenv.Name("audit")
	payTopic, auditTopic := paySvc+".payment.created", auditSvc+".entry.recorded"
	testenv.CreateTopic(t, brokers, payTopic, 2)
	testenv.CreateTopic(t, brokers, auditTopic, 1)
	mainTopic := testenv.Topic(t, brokers, 1)
	cons := testenv.Consume(t, brokers, payTopic, auditTopic, mainTopic)

	type handlers struct {
		fx.In
		Pay        *unitofwork.UnitOfWork `name:"payments"`
		Audit      *unitofwork.UnitOfWork `name:"audit"`
		Main       *unitofwork.UnitOfWork
		PayRelay   *relay.Relay `name:"payments"`
		AuditRelay *relay.Relay `name:"audit"`
	}
	var h handlers
	hour := time.Hour
	app := fxtest.New(t,
		fx.NopLogger,
		fx.Supply(pool),
		fxoutbox.Named("payments", fxoutbox.Config{Table: payTbl, Brokers: brokers, Writer: unitofwork.Config{Service: paySvc}, Relay: relay.Config{PollInterval: hour}}),
		fxoutbox.Named("audit", fxoutbox.Config{Table: auditTbl, Brokers: brokers, Writer: unitofwork.Config{Service: auditSvc}, Relay: relay.Config{PollInterval: hour}}),
		fx.Supply(fxoutbox.Config{Table: mainTbl, Brokers: brokers, Writer: unitofwork.Config{Service: "main"}, Relay: relay.Config{PollInterval: hour}}),
		fxoutbox.Module,
		fx.Populate(&h),
	)
	app.RequireStart()
	if h.Pay == h.Audit || h.PayRelay == h.AuditRelay || h.Main == h.Pay {
		t.Fatal("the instances share a unit of work or a relay")
	}
	if h.PayRelay.Config().Table.String() != payTbl.String() || h.AuditRelay.Config().Table.String() != auditTbl.String() {
		t.Fatalf("relay tables = %s, %s; want %s, %s", h.PayRelay.Config().Table, h.AuditRelay.Config().Table, payTbl, auditTbl)
	}
	ctx := context.Background()
	err := h.Pay.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		if err := tx.Add(ctx, outbox.Event{AggregateType: "payment", AggregateID: "p-1", Type: "payment.created.v1"}); err != nil {
			return err
		}
		return h.Audit.AddTx(ctx, unitofwork.PgxTx(tx), outbox.Event{AggregateType: "entry", AggregateID: "p-1", Type: "entry.recorded.v1"})
	})
	if err != nil {
		t.Fatal(err)
	}
	err = h.Main.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		return tx.Add(ctx, outbox.Event{AggregateType: "order", AggregateID: "o-1", Type: "order.created.v1", Topic: mainTopic})
	})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, m := range cons.WaitFor(3, 20*time.Second) {
		got[m.Topic] = testenv.Header(m, outbox.HeaderEventType)
	}
	want := map[string]string{payTopic: "payment.created.v1", auditTopic: "entry.recorded.v1", mainTopic: "order.created.v1"}
	for topic, typ := range want {
		if got[topic] != typ {
			t.Errorf("topic %s got %q, want %q (all: %v)", topic, got[topic], typ, got)
		}
	}
	// Each relay marks its own table (after the broker's ack, so a moment
	// after the consumer may have the record).
	for _, tbl := range []outbox.Table{payTbl, auditTbl, mainTbl} {
		testenv.Eventually(t, 20*time.Second, func() (bool, string) {
			n := unpublished(t, pool, tbl)
			return n == 0, fmt.Sprintf("%s: %d rows unpublished", tbl, n)
		})
	}
	app.RequireStop()
}

func TestNamedRejectsABadName(t *testing.T) {
	app := fx.New(fx.NopLogger, fxoutbox.Named("bad name", fxoutbox.Config{}))
	if err := app.Err(); !errors.Is(err, outbox.ErrInvalidConfig) || !strings.Contains(err.Error(), "bad name") {
		t.Errorf("app.Err() = %v, want ErrInvalidConfig naming the name", err)
	}
}

// Events written with AddTx in the application's own transaction are
// published after its commit without waiting for the poll (an hour here):
// in process, and in a relay of another application (process) through the
// writer's NOTIFY after the commit.
func TestAddTxWakesTheRelay(t *testing.T) {
	for _, mode := range []string{"same process", "other process"} {
		t.Run(mode, func(t *testing.T) {
			pool := testenv.Pool(t)
			brokers := testenv.Brokers(t)
			tbl := testenv.Table(t, pool)
			topic := testenv.Topic(t, brokers, 1)
			cons := testenv.Consume(t, brokers, topic)
			cfg := fxoutbox.Config{Table: tbl, Brokers: brokers, Writer: unitofwork.Config{Service: "svc"}, Relay: relay.Config{PollInterval: time.Hour}}
			var uow *unitofwork.UnitOfWork
			var app *fxtest.App
			if mode == "same process" {
				app = fxtest.New(t, fx.NopLogger, fx.Supply(pool, cfg), fxoutbox.Module, fx.Populate(&uow))
			} else {
				relayApp := fxtest.New(t, fx.NopLogger, fx.Supply(pool, cfg), fxoutbox.RelayModule)
				relayApp.RequireStart()
				defer relayApp.RequireStop()
				app = fxtest.New(t, fx.NopLogger, fx.Supply(pool, cfg), fxoutbox.WriterModule, fx.Populate(&uow))
			}
			app.RequireStart()
			defer app.RequireStop()
			time.Sleep(200 * time.Millisecond) // the relay's first poll and LISTEN are done: only a wake-up helps now
			ctx := context.Background()
			for i := range 3 {
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					return uow.AddTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: fmt.Sprint("o-", i), Type: "order.created.v1", Topic: topic})
				})
				if err != nil {
					t.Fatal(err)
				}
				cons.WaitFor(i+1, 20*time.Second)
			}
		})
	}
}

// A concrete SDK TracerProvider or MeterProvider supplied to fx (not the
// interface) is the one the relay uses: publish spans and metrics arrive.
func TestConcreteSDKProvidersAreUsed(t *testing.T) {
	pool := testenv.Pool(t)
	brokers := testenv.Brokers(t)
	tbl := testenv.Table(t, pool)
	topic := testenv.Topic(t, brokers, 1)
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	l, log := newLogs()
	var uow *unitofwork.UnitOfWork
	app := fxtest.New(t, fx.NopLogger,
		fx.Supply(pool, tp, mp, log, fxoutbox.Config{Table: tbl, Brokers: brokers, Writer: unitofwork.Config{Service: "svc"}}),
		fxoutbox.Module, fx.Populate(&uow))
	app.RequireStart()
	defer app.RequireStop()
	ctx := context.Background()
	err := uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		return tx.Add(ctx, outbox.Event{AggregateType: "order", AggregateID: "o-1", Type: "order.created.v1", Topic: topic})
	})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		return len(spans.Ended()) > 0, "no span ended yet: want the relay's publish span on the supplied *sdktrace.TracerProvider"
	})
	if s := spans.Ended(); s[0].Name() != "publish "+topic {
		t.Fatalf("span %q, want the relay's publish span on the supplied *sdktrace.TracerProvider", s[0].Name())
	}
	// The counter follows the mark, a moment after the span.
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(ctx, &rm); err != nil {
			t.Fatal(err)
		}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if m.Name == relay.MetricPublished {
					return true, ""
				}
			}
		}
		return false, "no " + relay.MetricPublished + " on the supplied *sdkmetric.MeterProvider"
	})
	if s := l.String(); !strings.Contains(s, `tracer="fx *sdktrace.TracerProvider"`) || !strings.Contains(s, `meter="fx *sdkmetric.MeterProvider"`) {
		t.Errorf("start-up line does not say where the providers come from:\n%s", s)
	}
}

// The relay's start logs one line with its table, service, ordering,
// brokers, mode and telemetry, and the warnings of ConfigFromEnv.
func TestStartUpLine(t *testing.T) {
	pool := testenv.Pool(t)
	brokers := testenv.Brokers(t)
	tbl := testenv.Table(t, pool)
	t.Setenv("OUTBOX_SERVICE", "pay-svc")
	t.Setenv("KAFKA_BROKERS", strings.Join(brokers, ","))
	t.Setenv("OUTBOX_SCHEMA", tbl.Schema)
	t.Setenv("OUTBOX_ORDERING", "unordered")
	t.Setenv("KAFKA_OPTS", "-Xmx1g") // another tool's (the JVM's): a warning, not an error
	cfg, err := fxoutbox.ConfigFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	l, log := newLogs()
	app := fxtest.New(t, fx.NopLogger, fx.Supply(pool, log, cfg), fxoutbox.Module)
	app.RequireStart()
	app.RequireStop()
	var line string
	for _, s := range strings.Split(l.String(), "\n") {
		if strings.Contains(s, "outbox relay starting") {
			line = s
		}
	}
	for _, want := range []string{"table=" + tbl.String(), "service=pay-svc", "ordering=unordered", "brokers=" + strings.Join(brokers, ","),
		"mode=", "LISTEN", "tracer=", "meter="} {
		if !strings.Contains(line, want) {
			t.Errorf("start-up line lacks %q:\n%s", want, l.String())
		}
	}
	if !strings.Contains(l.String(), "KAFKA_OPTS") {
		t.Errorf("no warning about KAFKA_OPTS:\n%s", l.String())
	}
}

// Each start-up trap stops the application with an error that names the
// variable (or field) to fix.
func TestStartUpTrapsNameTheVariable(t *testing.T) {
	pool := testenv.Pool(t)
	tbl := testenv.Table(t, pool)
	env := func(t *testing.T, kv ...string) (fxoutbox.Config, error) {
		t.Setenv("KAFKA_BROKERS", "127.0.0.1:9092")
		t.Setenv("OUTBOX_SERVICE", "svc")
		for i := 0; i < len(kv); i += 2 {
			t.Setenv(kv[i], kv[i+1])
		}
		return fxoutbox.ConfigFromEnv()
	}
	for _, tc := range []struct {
		name  string
		env   []string
		names []string // in the error
	}{
		{"broker without port", []string{"KAFKA_BROKERS", "localhost"}, []string{"KAFKA_BROKERS", `"localhost"`, "localhost:9092"}},
		{"broker with a bad port", []string{"KAFKA_BROKERS", "k1:9092,k2:x"}, []string{"KAFKA_BROKERS", `"k2:x"`}},
		{"typo", []string{"OUTBOX_BATCHSIZE", "100"}, []string{"OUTBOX_BATCHSIZE", "OUTBOX_BATCH_SIZE"}},
		{"kafka typo", []string{"KAFKA_BROKER", "k:9092"}, []string{"KAFKA_BROKER", "KAFKA_BROKERS"}},
		{"bad topics mode", []string{"OUTBOX_TOPICS", "yes"}, []string{"OUTBOX_TOPICS", `"check"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := env(t, tc.env...)
			if !errors.Is(err, outbox.ErrInvalidConfig) {
				t.Fatalf("ConfigFromEnv = %v, want ErrInvalidConfig", err)
			}
			for _, n := range tc.names {
				if !strings.Contains(err.Error(), n) {
					t.Errorf("error %q does not name %s", err, n)
				}
			}
		})
	}
	t.Run("empty service", func(t *testing.T) {
		t.Setenv("OUTBOX_SERVICE", "")
		cfg, err := env(t, "OUTBOX_SERVICE", "", "OUTBOX_SCHEMA", tbl.Schema)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range []fx.Option{fxoutbox.Module, fxoutbox.WriterModule} {
			app := fx.New(fx.NopLogger, fx.Supply(pool, cfg), m, fx.Invoke(func(*unitofwork.UnitOfWork) {}))
			if err := app.Err(); !errors.Is(err, outbox.ErrInvalidConfig) || !strings.Contains(err.Error(), "OUTBOX_SERVICE") ||
				!strings.Contains(err.Error(), "OUTBOX_TOPIC_NAMING=explicit") {
				t.Errorf("app.Err() = %v, want ErrInvalidConfig naming OUTBOX_SERVICE", err)
			}
		}
		// Explicit topics need no service; a relay-only process none either.
		cfg, err = env(t, "OUTBOX_SERVICE", "", "OUTBOX_SCHEMA", tbl.Schema, "OUTBOX_TOPIC_NAMING", "explicit")
		if err != nil {
			t.Fatal(err)
		}
		app := fxtest.New(t, fx.NopLogger, fx.Supply(pool, cfg), fxoutbox.WriterModule, fx.Invoke(func(*unitofwork.UnitOfWork) {}))
		app.RequireStart().RequireStop()
	})
	t.Run("config broker without port", func(t *testing.T) {
		app := fx.New(fx.NopLogger, fx.Supply(pool, fxoutbox.Config{Table: tbl, Brokers: []string{"localhost"}, Writer: unitofwork.Config{Service: "svc"}}), fxoutbox.Module)
		if err := app.Err(); !errors.Is(err, outbox.ErrInvalidConfig) || !strings.Contains(err.Error(), "KAFKA_BROKERS") {
			t.Errorf("app.Err() = %v, want ErrInvalidConfig naming Brokers [KAFKA_BROKERS]", err)
		}
	})
	t.Run("table behind the latest migration", func(t *testing.T) {
		old := outbox.Table{Schema: testenv.Name("old_")}
		t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+old.Schema+" CASCADE") })
		ctx := context.Background()
		if err := migrations.Outbox.Up(ctx, pool, old); err != nil {
			t.Fatal(err)
		}
		if err := migrations.Outbox.Down(ctx, pool, old, 2); err != nil {
			t.Fatal(err)
		}
		for _, m := range []fx.Option{fxoutbox.Module, fxoutbox.WriterModule} {
			app := fx.New(fx.NopLogger, fx.Supply(pool, fxoutbox.Config{Table: old, Brokers: []string{"127.0.0.1:1"}, Writer: unitofwork.Config{Service: "svc"}}), m,
				fx.Invoke(func(*unitofwork.UnitOfWork) {}))
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := app.Start(sctx)
			cancel()
			if !errors.Is(err, migrations.ErrOutdatedTable) || !strings.Contains(err.Error(), "attempts") || !strings.Contains(err.Error(), "000003") {
				t.Errorf("Start = %v, want ErrOutdatedTable naming the column and migration", err)
			}
			_ = app.Stop(ctx)
		}
	})
}

// fx's own output names the module's functions, not init.func1.
func TestFxOutputNamesFunctions(t *testing.T) {
	pool := testenv.Pool(t)
	tbl := testenv.Table(t, pool)
	var mu sync.Mutex
	var names []string
	logger := fxevent.Logger(eventFunc(func(e fxevent.Event) {
		mu.Lock()
		defer mu.Unlock()
		switch e := e.(type) {
		case *fxevent.Provided:
			names = append(names, e.ConstructorName)
		case *fxevent.Invoking:
			names = append(names, e.FunctionName)
		case *fxevent.OnStartExecuting:
			names = append(names, e.FunctionName)
		case *fxevent.OnStopExecuting:
			names = append(names, e.FunctionName)
		}
	}))
	cfg := fxoutbox.Config{Table: tbl, Brokers: []string{"127.0.0.1:1"}, Writer: unitofwork.Config{Service: "svc"}}
	app := fxtest.New(t, fx.WithLogger(func() fxevent.Logger { return logger }),
		fx.Supply(pool, cfg), fxoutbox.Module, fxoutbox.Named("audit", cfg))
	app.RequireStart().RequireStop()
	mu.Lock()
	defer mu.Unlock()
	seen := 0
	for _, n := range names {
		if !strings.Contains(n, "fxoutbox") || strings.Contains(n, "fxoutbox_test") {
			continue
		}
		seen++
		if strings.Contains(n, "init.func") || strings.Contains(n, ".func") {
			t.Errorf("fx names an anonymous function: %s", n)
		}
	}
	if seen < 6 {
		t.Errorf("only %d fxoutbox names in fx's events: %q", seen, names)
	}
}

type eventFunc func(fxevent.Event)

func (f eventFunc) LogEvent(e fxevent.Event) { f(e) }
