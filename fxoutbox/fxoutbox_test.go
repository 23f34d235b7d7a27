package fxoutbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/propagation"
	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/fxoutbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/migrations"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestModuleEndToEnd(t *testing.T) {
	pool := testenv.Pool(t)
	brokers := testenv.Brokers(t)
	tbl := outbox.Table{Schema: testenv.Name("fx_")}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+tbl.Schema+" CASCADE") })
	topic := testenv.Topic(t, brokers, 3)
	cons := testenv.Consume(t, brokers, topic)

	var uow *unitofwork.UnitOfWork
	app := fxtest.New(t,
		fx.NopLogger,
		fx.Supply(pool, fxoutbox.Config{Table: tbl, Brokers: brokers, Migrate: true, Writer: unitofwork.Config{Service: "svc"}, Relay: relay.Config{PollInterval: time.Hour}}),
		fx.Supply(fx.Annotate(propagation.TraceContext{}, fx.As(new(propagation.TextMapPropagator)))),
		fxoutbox.Module,
		fx.Populate(&uow),
	)
	app.RequireStart()
	// The poll interval is an hour: only the commit's wake-up can publish this in time.
	err := uow.Do(context.Background(), func(ctx context.Context, tx unitofwork.Tx) error {
		return tx.Add(ctx, outbox.Event{AggregateType: "order", AggregateID: "o-1", Type: "order.created.v1", Topic: topic, Payload: map[string]int{"n": 1}})
	})
	if err != nil {
		t.Fatal(err)
	}
	msgs := cons.WaitFor(1, 20*time.Second)
	if string(msgs[0].Key) != "o-1" || testenv.Header(msgs[0], outbox.HeaderEventType) != "order.created.v1" {
		t.Errorf("consumed %+v", msgs[0])
	}
	app.RequireStop()
	cons.Close()
	// Migrate made the table, with the cursor migration, and the relay
	// (Progress auto) delivered with cursor progress: no row was marked.
	var hasCursor bool
	var marked int
	if err := pool.QueryRow(context.Background(), "SELECT to_regclass($1) IS NOT NULL, (SELECT count(*) FROM "+sqlname.Ident(tbl)+" WHERE published_at IS NOT NULL)",
		sqlname.Ident(sqlname.Cursor(tbl))).Scan(&hasCursor, &marked); err != nil {
		t.Fatal(err)
	}
	if !hasCursor || marked != 0 {
		t.Errorf("a table Migrate made: cursor migration %v, %d rows marked published; want the cursor migration and none marked", hasCursor, marked)
	}
}

func TestWriterModuleRunsNoRelay(t *testing.T) {
	pool := testenv.Pool(t)
	tbl := testenv.Table(t, pool)
	var uow *unitofwork.UnitOfWork
	var r *relay.Relay
	app := fxtest.New(t,
		fx.NopLogger,
		fx.Supply(pool, fxoutbox.Config{Table: tbl, Writer: unitofwork.Config{Service: "svc"}}), // no brokers: a writer needs none
		fxoutbox.WriterModule,
		fx.Populate(&uow),
		fx.Invoke(fx.Annotate(func(rr *relay.Relay) { r = rr }, fx.ParamTags(`optional:"true"`))),
	)
	app.RequireStart()
	if r != nil {
		t.Error("WriterModule provided a relay")
	}
	err := uow.Do(context.Background(), func(ctx context.Context, tx unitofwork.Tx) error {
		return tx.Add(ctx, outbox.Event{AggregateType: "order", AggregateID: "o-1", Type: "order.created.v1"})
	})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	var n int
	_ = pool.QueryRow(context.Background(), "SELECT count(*) FROM "+sqlname.Ident(tbl)+" WHERE published_at IS NULL").Scan(&n)
	if n != 1 {
		t.Errorf("unpublished = %d, want 1 (nothing publishes in a writer-only app)", n)
	}
	app.RequireStop()
}

// Every relay setting of Config reaches the relay the module builds, set
// and left at its default.
func TestConfigReachesTheRelay(t *testing.T) {
	pool := testenv.Pool(t)
	tbl := testenv.Table(t, pool)
	sc := relay.DefaultSaramaConfig()
	sc.Producer.MaxMessageBytes = 12345
	for _, tc := range []struct {
		name string
		cfg  fxoutbox.Config
		want relay.Config
	}{
		{"set", fxoutbox.Config{Sarama: sc, Relay: relay.Config{PollInterval: 7 * time.Second, BatchSize: 30, MaxBatchSize: 300, Workers: 3, SynchronousCommit: true, BatchTimeout: 9 * time.Second, MaxBackoff: 11 * time.Second, Ordering: relay.Unordered, Lanes: 128, Retention: time.Hour, MaxAttempts: 4, Poison: outbox.Hold}},
			relay.Config{PollInterval: 7 * time.Second, BatchSize: 30, MaxBatchSize: 300, Workers: 3, SynchronousCommit: true,
				BatchTimeout: 9 * time.Second, MaxBackoff: 11 * time.Second, Ordering: relay.Unordered, Lanes: 128,
				Retention: time.Hour, MaxAttempts: 4, Poison: outbox.Hold, Listen: true, MaxMessageBytes: 12345}},
		{"defaults", fxoutbox.Config{DisableListen: true},
			relay.Config{PollInterval: 500 * time.Millisecond, BatchSize: 50, MaxBatchSize: 500, Workers: 1,
				BatchTimeout: 30 * time.Second, MaxBackoff: 30 * time.Second, Ordering: relay.PerKey, Lanes: 64,
				Retention: 72 * time.Hour, MaxAttempts: 5, Poison: outbox.Park, MaxMessageBytes: outbox.DefaultMaxRecordBytes}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Writer.Service, cfg.Table, cfg.Brokers, cfg.DisableRelay = "svc", tbl, []string{"127.0.0.1:1"}, true
			var r *relay.Relay
			app := fxtest.New(t, fx.NopLogger, fx.Supply(pool, cfg), fxoutbox.Module, fx.Populate(&r))
			app.RequireStart()
			defer app.RequireStop()
			got, want := r.Config(), tc.want
			for _, f := range []struct {
				name      string
				got, want any
			}{
				{"Table", got.Table.String(), tbl.String()}, {"PollInterval", got.PollInterval, want.PollInterval},
				{"BatchSize", got.BatchSize, want.BatchSize}, {"MaxBatchSize", got.MaxBatchSize, want.MaxBatchSize},
				{"Workers", got.Workers, want.Workers}, {"SynchronousCommit", got.SynchronousCommit, want.SynchronousCommit},
				{"BatchTimeout", got.BatchTimeout, want.BatchTimeout}, {"MaxBackoff", got.MaxBackoff, want.MaxBackoff},
				{"Ordering", got.Ordering, want.Ordering}, {"Lanes", got.Lanes, want.Lanes}, {"Retention", got.Retention, want.Retention},
				{"MaxAttempts", got.MaxAttempts, want.MaxAttempts}, {"Poison", got.Poison, want.Poison}, {"Listen", got.Listen, want.Listen},
				{"MaxMessageBytes", got.MaxMessageBytes, want.MaxMessageBytes},
			} {
				if f.got != f.want {
					t.Errorf("relay %s = %v, want %v from fxoutbox.Config", f.name, f.got, f.want)
				}
			}
		})
	}
}

func TestStartFailsClearlyWithoutTable(t *testing.T) {
	pool := testenv.Pool(t)
	app := fx.New(
		fx.NopLogger,
		fx.Supply(pool, fxoutbox.Config{Table: outbox.Table{Schema: testenv.Name("missing_")}, Brokers: []string{"127.0.0.1:1"}, Writer: unitofwork.Config{Service: "svc"}}),
		fxoutbox.Module,
	)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := app.Start(ctx)
	if !errors.Is(err, migrations.ErrNoTable) || !strings.Contains(err.Error(), "migrations") {
		t.Fatalf("Start = %v, want ErrNoTable telling to apply migrations", err)
	}
	_ = app.Stop(ctx)
}

func TestBadConfigFailsAtConstruction(t *testing.T) {
	pool := &pgxpool.Pool{}
	for name, cfg := range map[string]fxoutbox.Config{
		"no brokers":  {Writer: unitofwork.Config{Service: "svc"}},
		"bad table":   {Brokers: []string{"x:1"}, Table: outbox.Table{Name: "a;b"}},
		"bad batch":   {Brokers: []string{"x:1"}, Relay: relay.Config{BatchSize: -5}},
		"bad service": {Brokers: []string{"x:1"}, Writer: unitofwork.Config{Service: "white space"}},
	} {
		app := fx.New(fx.NopLogger, fx.Supply(pool, cfg), fxoutbox.Module, fx.Invoke(func(*unitofwork.UnitOfWork) {}))
		if err := app.Err(); !errors.Is(err, outbox.ErrInvalidConfig) {
			t.Errorf("%s: app.Err() = %v, want ErrInvalidConfig", name, err)
		}
	}
}
