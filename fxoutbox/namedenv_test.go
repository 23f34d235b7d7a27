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
	"github.com/fxoutbox/outbox/unitofwork"
)

// Two outboxes configured from the environment, the second under the
// prefix AUDIT_ and sharing KAFKA_BROKERS; one transaction writes to both
// and each relay publishes its own table's event to its own service's
// topic (the poll interval is an hour: only the wake-up after the commit
// can do it).
func TestNamedFromEnvTwoOutboxes(t *testing.T) {
	pool := testenv.Pool(t)
	brokers := testenv.Brokers(t)
	payTbl, auditTbl := testenv.Table(t, pool), testenv.Table(t, pool)
	paySvc, auditSvc := testenv.Name("pay"), testenv.Name("audit")
	payTopic, auditTopic := paySvc+".payment.created", auditSvc+".entry"
	testenv.CreateTopic(t, brokers, payTopic, 1)
	testenv.CreateTopic(t, brokers, auditTopic, 1)
	cons := testenv.Consume(t, brokers, payTopic, auditTopic)
	for k, v := range map[string]string{
		"KAFKA_BROKERS":  strings.Join(brokers, ","),
		"OUTBOX_SERVICE": paySvc, "OUTBOX_SCHEMA": payTbl.Schema, "OUTBOX_TABLE": payTbl.WithDefaults().Name, "OUTBOX_POLL_INTERVAL": "1h",
		"AUDIT_OUTBOX_SERVICE": auditSvc, "AUDIT_OUTBOX_SCHEMA": auditTbl.Schema, "AUDIT_OUTBOX_TABLE": auditTbl.WithDefaults().Name,
		"AUDIT_OUTBOX_POLL_INTERVAL": "1h", "AUDIT_OUTBOX_TOPIC_NAMING": "per-aggregate",
	} {
		t.Setenv(k, v)
	}
	var h struct {
		fx.In
		Payments *unitofwork.UnitOfWork `name:"payments"`
		Audit    *unitofwork.UnitOfWork `name:"audit"`
	}
	app := fxtest.New(t, fx.NopLogger, fx.Supply(pool),
		fxoutbox.NamedFromEnv("payments", ""),
		fxoutbox.NamedFromEnv("audit", "AUDIT_"),
		fx.Populate(&h))
	app.RequireStart()
	defer app.RequireStop()
	ctx := context.Background()
	err := h.Payments.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		if err := tx.Add(ctx, outbox.Event{AggregateType: "payment", AggregateID: "p-1", Type: "payment.created.v1"}); err != nil {
			return err
		}
		return h.Audit.AddTx(ctx, unitofwork.PgxTx(tx), outbox.Event{AggregateType: "entry", AggregateID: "p-1", Type: "entry.recorded.v1"})
	})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, m := range cons.WaitFor(2, 20*time.Second) {
		got[m.Topic] = testenv.Header(m, outbox.HeaderEventType)
	}
	if got[payTopic] != "payment.created.v1" || got[auditTopic] != "entry.recorded.v1" {
		t.Errorf("published %v, want payment.created.v1 on %s and entry.recorded.v1 on %s", got, payTopic, auditTopic)
	}
}
