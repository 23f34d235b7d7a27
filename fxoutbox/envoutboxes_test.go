package fxoutbox_test

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"go.uber.org/fx"
	"go.uber.org/fx/fxevent"
	"go.uber.org/fx/fxtest"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/fxoutbox"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// setenv sets every variable of env for the test.
func setenv(t *testing.T, env map[string]string) {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
}

// Two outboxes from the environment declare their event types
// (OUTBOX_EVENT_TYPES, AUDIT_OUTBOX_EVENT_TYPES) and create their topics at
// start (OUTBOX_TOPICS=create) with no line of configuration in code; each
// relay then publishes to its own topic.
func TestNamedFromEnvCreatesDeclaredTopics(t *testing.T) {
	pool := testenv.Pool(t)
	brokers := testenv.Brokers(t)
	shipTbl, auditTbl := testenv.Table(t, pool), testenv.Table(t, pool)
	shipSvc, auditSvc := testenv.Name("ship"), testenv.Name("audit")
	setenv(t, map[string]string{
		"KAFKA_BROKERS":  strings.Join(brokers, ","),
		"OUTBOX_SERVICE": shipSvc, "OUTBOX_SCHEMA": shipTbl.Schema, "OUTBOX_POLL_INTERVAL": "1h",
		"OUTBOX_TOPICS": "create", "OUTBOX_TOPIC_PARTITIONS": "3",
		"OUTBOX_EVENT_TYPES":   "shipment:shipment.created.v1, shipment:shipment.delivered.v1,=" + shipSvc + ".manual",
		"AUDIT_OUTBOX_SERVICE": auditSvc, "AUDIT_OUTBOX_SCHEMA": auditTbl.Schema, "AUDIT_OUTBOX_POLL_INTERVAL": "1h",
		"AUDIT_OUTBOX_TOPIC_NAMING": "per-aggregate", "AUDIT_OUTBOX_TOPICS": "create", "AUDIT_OUTBOX_TOPIC_PARTITIONS": "2",
		"AUDIT_OUTBOX_EVENT_TYPES": "entry:entry.recorded.v1",
	})
	cfg, err := fxoutbox.ConfigFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{shipSvc + ".manual", shipSvc + ".shipment.created", shipSvc + ".shipment.delivered"}
	if got, err := cfg.TopicNames(); err != nil || !slices.Equal(got, want) {
		t.Fatalf("TopicNames from OUTBOX_EVENT_TYPES = %q, %v; want %q", got, err, want)
	}
	var h struct {
		fx.In
		Shipping *unitofwork.UnitOfWork `name:"shipping"`
		Audit    *unitofwork.UnitOfWork `name:"audit"`
	}
	app := fxtest.New(t, fx.NopLogger, fx.Supply(pool),
		fxoutbox.NamedFromEnv("shipping", ""),
		fxoutbox.NamedFromEnv("audit", "AUDIT_"),
		fx.Populate(&h))
	app.RequireStart()
	defer app.RequireStop()

	client, err := sarama.NewClient(brokers, sarama.NewConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	for topic, n := range map[string]int{want[0]: 3, want[1]: 3, want[2]: 3, auditSvc + ".entry": 2} {
		if ps, err := client.Partitions(topic); err != nil || len(ps) != n {
			t.Errorf("topic %s: %d partitions, %v; want it created with %d", topic, len(ps), err, n)
		}
	}
	cons := testenv.Consume(t, brokers, want[1], auditSvc+".entry")
	err = h.Shipping.Do(context.Background(), func(ctx context.Context, tx unitofwork.Tx) error {
		if err := tx.Add(ctx, outbox.Event{AggregateType: "shipment", AggregateID: "s-1", Type: "shipment.created.v1"}); err != nil {
			return err
		}
		return h.Audit.AddTx(ctx, unitofwork.PgxTx(tx), outbox.Event{AggregateType: "entry", AggregateID: "s-1", Type: "entry.recorded.v1"})
	})
	if err != nil {
		t.Fatal(err)
	}
	cons.WaitFor(2, 20*time.Second)
}

func TestEventTypesFromEnvErrors(t *testing.T) {
	for _, v := range []string{"shipment", "shipment:", ":shipment.created.v1", "shipment:created=not a topic", " , "} {
		t.Setenv("AUDIT_OUTBOX_EVENT_TYPES", v)
		_, err := fxoutbox.ConfigFromEnvPrefix("AUDIT_")
		if !errors.Is(err, outbox.ErrInvalidConfig) || !strings.Contains(err.Error(), "AUDIT_OUTBOX_EVENT_TYPES") {
			t.Errorf("AUDIT_OUTBOX_EVENT_TYPES=%q: %v, want an error naming the variable", v, err)
		}
	}
	// A declared type whose topic cannot be derived names the variable.
	t.Setenv("AUDIT_OUTBOX_EVENT_TYPES", "entry:entry.recorded.v1")
	t.Setenv("AUDIT_OUTBOX_TOPIC_NAMING", "explicit")
	cfg, err := fxoutbox.ConfigFromEnvPrefix("AUDIT_")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cfg.TopicNames(); err == nil || !strings.Contains(err.Error(), "EventTypes[0] [AUDIT_OUTBOX_EVENT_TYPES]") {
		t.Errorf("TopicNames of a type without a topic under explicit naming = %v, want an error naming AUDIT_OUTBOX_EVENT_TYPES (the variable as set)", err)
	}
}

// fxLog is an fx event logger printing as fx's default one does, into a
// buffer the test reads.
type fxLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *fxLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *fxLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (l *fxLog) option() fx.Option {
	return fx.WithLogger(func() fxevent.Logger { return &fxevent.ConsoleLogger{W: l} })
}

// A configuration error of a named outbox (the trial set AUDIT_SERVICE
// instead of AUDIT_OUTBOX_SERVICE) is reported once, in the start error
// and in fx's own log, prefixed with the outbox's name, and without the
// reflection frames of a constructor's error.
func TestNamedConfigErrorReportedOnce(t *testing.T) {
	pool := testenv.Pool(t)
	setenv(t, map[string]string{"KAFKA_BROKERS": "127.0.0.1:1", "AUDIT_SERVICE": "audit", "AUDIT_OUTBOX_TABLE": "audit_outbox"})
	for name, opt := range map[string]fx.Option{
		"env":     fxoutbox.NamedFromEnv("audit", "AUDIT_"),
		"literal": fxoutbox.Named("audit", fxoutbox.Config{Brokers: []string{"127.0.0.1:1"}, Table: outbox.Table{Name: "audit_outbox"}}),
	} {
		t.Run(name, func(t *testing.T) {
			log := &fxLog{}
			app := fx.New(log.option(), fx.Supply(pool), opt)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := app.Start(ctx)
			if !errors.Is(err, outbox.ErrInvalidConfig) {
				t.Fatalf("Start = %v, want the configuration error", err)
			}
			field := "Writer.Service [OUTBOX_SERVICE]"
			if name == "env" {
				field = "Writer.Service [AUDIT_OUTBOX_SERVICE]"
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, `fxoutbox "audit": outbox: config `+field+": is empty") || strings.Count(msg, "is empty") != 1 {
				t.Errorf("Start = %q, want the error once, prefixed with the outbox's name", msg)
			}
			printed := log.String()
			if n := strings.Count(printed, field+": is empty"); n != 1 {
				t.Errorf("fx's log prints the error %d times, want once:\n%s", n, printed)
			}
			for _, noise := range []string{"makeFuncStub", "could not build", "received non-nil error"} {
				if strings.Contains(msg+printed, noise) {
					t.Errorf("the error comes with fx's reflection frames (%q):\n%s\n%s", noise, msg, printed)
				}
			}
		})
	}
}

// The errors found at start name the outbox: a missing table of a named
// outbox, and of the unnamed module ("default").
func TestStartErrorNamesOutbox(t *testing.T) {
	pool := testenv.Pool(t)
	tbl := testenv.Table(t, pool)
	fresh := outbox.Table{Schema: tbl.Schema, Name: "fresh_outbox"}
	cfg := fxoutbox.Config{Table: fresh, Brokers: []string{"127.0.0.1:1"}, Writer: unitofwork.Config{Service: "svc"}}
	for _, tc := range []struct {
		want string
		opts []fx.Option
	}{
		{`fxoutbox "fresh": table does not exist: ` + fresh.String(), []fx.Option{fxoutbox.Named("fresh", cfg)}},
		{`fxoutbox "default": table does not exist: ` + fresh.String(), []fx.Option{fx.Supply(cfg), fxoutbox.Module}},
		{`fxoutbox "default": table does not exist: ` + fresh.String(), []fx.Option{fx.Supply(cfg), fxoutbox.WriterModule,
			fx.Invoke(func(*unitofwork.UnitOfWork) {})}},
	} {
		app := fx.New(append(tc.opts, fx.NopLogger, fx.Supply(pool))...)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := app.Start(ctx)
		cancel()
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) || strings.Count(err.Error(), "does not exist") != 1 {
			t.Errorf("Start = %v, want it to start with %q, once", err, tc.want)
		}
	}
}

// A relay that cannot reach Kafka says which variable named the brokers,
// with its value: the prefixed one when the outbox has Kafka settings of
// its own.
func TestRelayUnreachableNamesBrokersVariable(t *testing.T) {
	pool := testenv.Pool(t)
	tbl := testenv.Table(t, pool)
	setenv(t, map[string]string{
		"KAFKA_BROKERS":        "127.0.0.1:2",
		"AUDIT_KAFKA_BROKERS":  "127.0.0.1:1",
		"AUDIT_OUTBOX_SERVICE": "audit", "AUDIT_OUTBOX_SCHEMA": tbl.Schema,
	})
	var h struct {
		fx.In
		Relay *relay.Relay `name:"audit"`
	}
	app := fxtest.New(t, fx.NopLogger, fx.Supply(pool), fxoutbox.NamedFromEnv("audit", "AUDIT_"), fx.Populate(&h))
	app.RequireStart()
	defer app.RequireStop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := h.Relay.Health(ctx, time.Hour)
	if err == nil || !strings.Contains(err.Error(), "connect to Kafka at AUDIT_KAFKA_BROKERS=127.0.0.1:1") {
		t.Fatalf("Health = %v, want the broker check naming AUDIT_KAFKA_BROKERS=127.0.0.1:1", err)
	}
}

// The unnamed modules check their Config first, so a configuration error
// is the start error as it is, named "default", not wrapped in fx's
// frames; so is a named outbox's missing brokers (checked with the
// graph, which may supply its publisher).
func TestModuleConfigErrorClean(t *testing.T) {
	pool := testenv.Pool(t)
	for _, tc := range []struct {
		want string
		opts []fx.Option
	}{
		{`fxoutbox "default": outbox: config Writer.Service [OUTBOX_SERVICE]: is empty`,
			[]fx.Option{fx.Supply(fxoutbox.Config{Brokers: []string{"127.0.0.1:1"}}), fxoutbox.Module}},
		{`fxoutbox "default": outbox: config Writer.Service [OUTBOX_SERVICE]: is empty`,
			[]fx.Option{fx.Supply(fxoutbox.Config{}), fxoutbox.WriterModule, fx.Invoke(func(*unitofwork.UnitOfWork) {})}},
		{`fxoutbox "default": outbox: config Brokers [KAFKA_BROKERS]: is empty`,
			[]fx.Option{fx.Supply(fxoutbox.Config{Writer: unitofwork.Config{Service: "svc"}}), fxoutbox.RelayModule}},
		{`fxoutbox "default": outbox: config Relay.BatchSize [OUTBOX_BATCH_SIZE]`,
			[]fx.Option{fx.Supply(fxoutbox.Config{Brokers: []string{"127.0.0.1:1"}, Writer: unitofwork.Config{Service: "svc"}, Relay: relay.Config{BatchSize: 20000}}), fxoutbox.Module}},
		{`fxoutbox "audit": outbox: config Brokers [KAFKA_BROKERS]: is empty`,
			[]fx.Option{fxoutbox.Named("audit", fxoutbox.Config{Writer: unitofwork.Config{Service: "audit"}})}},
	} {
		log := &fxLog{}
		app := fx.New(append(tc.opts, log.option(), fx.Supply(pool))...)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := app.Start(ctx)
		cancel()
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) || !errors.Is(err, outbox.ErrInvalidConfig) {
			t.Errorf("Start = %v, want an error starting with %q", err, tc.want)
			continue
		}
		for _, noise := range []string{"could not build", "received non-nil error", "makeFuncStub"} {
			if strings.Contains(err.Error(), noise) || strings.Contains(log.String(), noise) {
				t.Errorf("the error of %q comes with fx's frames (%q):\n%v\n%s", tc.want, noise, err, log.String())
			}
		}
	}
	// A publisher from fx makes the brokers unnecessary, named or not.
	pub := relay.PublisherFunc(func(context.Context, []relay.Message) error { return nil })
	for _, opts := range [][]fx.Option{
		{fx.Supply(fxoutbox.Config{Table: testenv.Table(t, pool), Writer: unitofwork.Config{Service: "svc"}}), fx.Provide(func() relay.Publisher { return pub }), fxoutbox.Module},
		{fxoutbox.Named("audit", fxoutbox.Config{Table: testenv.Table(t, pool), Writer: unitofwork.Config{Service: "audit"}}),
			fx.Provide(fx.Annotate(func() relay.Publisher { return pub }, fx.ResultTags(`name:"audit"`)))},
	} {
		app := fxtest.New(t, append(opts, fx.NopLogger, fx.Supply(pool))...)
		app.RequireStart()
		app.RequireStop()
	}
}
