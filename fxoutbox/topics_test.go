package fxoutbox_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/fxoutbox"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/outboxconfig"
	"github.com/fxoutbox/outbox/unitofwork"
)

var paymentEvents = []outboxconfig.EventType{
	{AggregateType: "payment", Type: "payment.created.v1"},
	{AggregateType: "payment", Type: "payment.authorized.v1"},
	{AggregateType: "payment", Type: "payment.created.v2"}, // same topic as v1
	{AggregateType: "refund", Type: "refund.issued.v1", Topic: "ledger.refunds"},
}

func TestTopicNames(t *testing.T) {
	for _, tc := range []struct {
		naming outbox.TopicFunc
		want   []string
	}{
		{nil, []string{"ledger.refunds", "pay.payment.authorized", "pay.payment.created"}},
		{outbox.TopicPerAggregate, []string{"ledger.refunds", "pay.payment"}},
	} {
		got, err := fxoutbox.Config{EventTypes: paymentEvents, Writer: unitofwork.Config{Service: "pay", Topics: tc.naming}}.TopicNames()
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("TopicNames = %q, %v; want %q", got, err, tc.want)
		}
	}
	_, err := fxoutbox.Config{EventTypes: paymentEvents}.TopicNames()
	if !errors.Is(err, outbox.ErrInvalidConfig) || !strings.Contains(err.Error(), "EventTypes[0]") {
		t.Errorf("TopicNames without a service = %v, want an error naming EventTypes[0]", err)
	}
}

// OUTBOX_TOPICS=check stops the start at once, naming the missing topic;
// OUTBOX_TOPICS=create creates it with the configured partitions, and the
// event then reaches it.
func TestTopicCheckAndCreate(t *testing.T) {
	pool := testenv.Pool(t)
	brokers := testenv.Brokers(t)
	tbl := testenv.Table(t, pool)
	svc := testenv.Name("svc")
	present := svc + ".payment.created"
	testenv.CreateTopic(t, brokers, present, 1)
	missing := svc + ".payment.authorized"
	cfg := fxoutbox.Config{Table: tbl, Brokers: brokers, TopicCheck: outboxconfig.TopicsCheck, EventTypes: []outboxconfig.EventType{{AggregateType: "payment", Type: "payment.created.v1"}, {AggregateType: "payment", Type: "payment.authorized.v1"}}, Writer: unitofwork.Config{Service: svc}}

	app := fx.New(fx.NopLogger, fx.Supply(pool, cfg), fxoutbox.Module)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := app.Start(ctx)
	if !errors.Is(err, fxoutbox.ErrMissingTopic) || !strings.Contains(err.Error(), missing) || strings.Contains(err.Error(), present+",") {
		t.Fatalf("Start = %v, want ErrMissingTopic naming %s only", err, missing)
	}
	if ctx.Err() != nil {
		t.Fatal("the check waited for the start timeout instead of failing fast")
	}
	_ = app.Stop(ctx)

	cfg.TopicCheck, cfg.TopicPartitions, cfg.Relay.PollInterval = outboxconfig.TopicsCreate, 3, time.Hour
	var uow *unitofwork.UnitOfWork
	app2 := fxtest.New(t, fx.NopLogger, fx.Supply(pool, cfg), fxoutbox.Module, fx.Populate(&uow))
	app2.RequireStart()
	defer app2.RequireStop()
	client, err := sarama.NewClient(brokers, sarama.NewConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	if ps, err := client.Partitions(missing); err != nil || len(ps) != 3 {
		t.Fatalf("created topic %s: %d partitions, %v; want 3", missing, len(ps), err)
	}
	cons := testenv.Consume(t, brokers, missing)
	err = uow.Do(context.Background(), func(ctx context.Context, tx unitofwork.Tx) error {
		return tx.Add(ctx, outbox.Event{AggregateType: "payment", AggregateID: "p-1", Type: "payment.authorized.v1"})
	})
	if err != nil {
		t.Fatal(err)
	}
	cons.WaitFor(1, 20*time.Second)
}

func TestTopicCheckNeedsDeclaredEventTypes(t *testing.T) {
	pool := testenv.Pool(t)
	app := fx.New(fx.NopLogger, fx.Supply(pool, fxoutbox.Config{Brokers: []string{"127.0.0.1:1"}, TopicCheck: outboxconfig.TopicsCheck, Writer: unitofwork.Config{Service: "svc"}}), fxoutbox.Module)
	if err := app.Err(); !errors.Is(err, outbox.ErrInvalidConfig) || !strings.Contains(err.Error(), "OUTBOX_TOPICS") || !strings.Contains(err.Error(), "EventTypes") {
		t.Errorf("app.Err() = %v, want ErrInvalidConfig naming OUTBOX_TOPICS and EventTypes", err)
	}
}
