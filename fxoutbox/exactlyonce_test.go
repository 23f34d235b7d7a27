package fxoutbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/fxoutbox"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// TestExactlyOnceFromEnv: OUTBOX_DELIVERY=exactly-once and its settings
// reach the relay the module runs, which publishes in transactions that a
// read_committed consumer sees committed.
func TestExactlyOnceFromEnv(t *testing.T) {
	pool := testenv.Pool(t)
	brokers := testenv.Brokers(t)
	tbl := outbox.Table{Schema: testenv.Name("fx_")}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+tbl.Schema+" CASCADE") })
	topic := testenv.Topic(t, brokers, 3)
	cons := testenv.ConsumeCommitted(t, brokers, topic)
	progress := "fxoutbox.progress.test." + tbl.Schema
	env := map[string]string{
		"OUTBOX_SERVICE": "svc", "OUTBOX_SCHEMA": tbl.Schema, "KAFKA_BROKERS": strings.Join(brokers, ","), "OUTBOX_MIGRATE": "on",
		"OUTBOX_DELIVERY": "exactly-once", "OUTBOX_TRANSACTION_TIMEOUT": "5s", "OUTBOX_PROGRESS_TOPIC": progress,
		"OUTBOX_TRANSACTIONAL_ID": "fxoutbox.test." + tbl.Schema, "OUTBOX_PROGRESS": "auto",
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
	cfg, err := fxoutbox.ConfigFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	var uow *unitofwork.UnitOfWork
	var r *relay.Relay
	app := fxtest.New(t,
		fx.NopLogger,
		fx.Supply(pool, cfg),
		fxoutbox.Module,
		fx.Populate(&uow, &r),
	)
	app.RequireStart()
	rc := r.Config()
	if rc.Delivery != relay.ExactlyOnce || rc.TransactionTimeout != 5*time.Second || rc.ProgressTopic != progress ||
		rc.TransactionalID != "fxoutbox.test."+tbl.Schema {
		t.Fatalf("relay config: delivery %v, timeout %v, progress topic %q, transactional id %q", rc.Delivery, rc.TransactionTimeout, rc.ProgressTopic, rc.TransactionalID)
	}
	// OUTBOX_MIGRATE made the table, with the cursor migration: the relay
	// (Progress auto) records cursor progress.
	if rc.Progress != relay.ProgressAuto || r.Progress() != relay.ProgressCursor {
		t.Errorf("Progress: configured %v, chosen %v; want auto, and cursor on the table OUTBOX_MIGRATE made", rc.Progress, r.Progress())
	}
	for i := range 10 {
		err := uow.Do(context.Background(), func(ctx context.Context, tx unitofwork.Tx) error {
			return tx.Add(ctx, outbox.Event{AggregateType: "order", AggregateID: "o-1", Type: "order.created.v1", Topic: topic, Payload: map[string]int{"n": i}})
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	cons.WaitFor(10, 30*time.Second)
	app.RequireStop()
	if n := testenv.RecordCount(t, brokers, progress); n == 0 {
		t.Errorf("the progress topic %s holds no record", progress)
	}
}
