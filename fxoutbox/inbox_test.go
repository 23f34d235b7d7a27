package fxoutbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/fxoutbox"
	"github.com/fxoutbox/outbox/inbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/unitofwork"
)

// The inbox module consumes with the app's lifecycle: routes come from
// their own constructors (one per event type, one for the rest of the
// topic), handlers run in the app's unit of work (their events land in its
// outbox table), and a redelivered event is applied once.
func TestInboxModule(t *testing.T) {
	pool := testenv.Pool(t)
	brokers := testenv.Brokers(t)
	tbl := outbox.Table{Schema: testenv.Name("fxin_")}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+tbl.Schema+" CASCADE") })
	topic := testenv.Topic(t, brokers, 2)
	effects := tbl.Schema + ".effects"

	handler := func(kind string) inbox.Handler {
		return func(ctx context.Context, tx unitofwork.Tx, m *inbox.Message) error {
			if _, err := tx.Exec(ctx, "INSERT INTO "+effects+" (event_id, kind) VALUES ($1, $2)", m.ID, kind); err != nil {
				return err
			}
			return tx.Add(ctx, outbox.Event{AggregateType: "invoice", AggregateID: string(m.Key), Type: "invoice.created.v1", Payload: map[string]string{"for": m.ID}})
		}
	}
	newApp := func() *fxtest.App {
		return fxtest.New(t,
			fx.NopLogger,
			fx.Supply(pool, fxoutbox.Config{Table: tbl, Brokers: brokers, Migrate: true, DisableNotify: true, Writer: unitofwork.Config{Service: "billing"}}),
			fx.Supply(fxoutbox.InboxConfig{Consumer: inbox.Config{Group: testenv.Name("fxg_"), Name: "billing", Table: outbox.Table{Schema: tbl.Schema}}, Migrate: true}),
			fxoutbox.WriterModule,
			fxoutbox.InboxModule,
			fx.Provide(fxoutbox.InboxRoute(func() inbox.Route {
				return inbox.Route{Topic: topic, Type: "order.confirmed.v1", Handler: handler("confirmed")}
			})),
			fx.Provide(fxoutbox.InboxRoute(func(*pgxpool.Pool) (inbox.Route, error) {
				return inbox.Route{Topic: topic, Handler: handler("other")}, nil
			})),
		)
	}
	app := newApp()
	app.RequireStart()
	if _, err := pool.Exec(context.Background(), "CREATE TABLE "+effects+" (event_id text, kind text)"); err != nil {
		t.Fatal(err)
	}
	ids := []string{uuid.NewString(), uuid.NewString(), uuid.NewString()}
	produce(t, brokers, topic, ids[0], "order.confirmed.v1")
	produce(t, brokers, topic, ids[1], "order.shipped.v1")
	produce(t, brokers, topic, ids[0], "order.confirmed.v1") // redelivered
	produce(t, brokers, topic, ids[2], "order.shipped.v1")   // same key: applied after the redelivery
	testenv.Eventually(t, time.Minute, func() (bool, string) {
		var n int
		err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+sqlname.Ident(tbl)).Scan(&n)
		return err == nil && n == 3, fmt.Sprintf("%d inbox rows, want 3 (%v)", n, err)
	})
	app.RequireStop()

	rows, err := pool.Query(context.Background(), "SELECT event_id || ' ' || kind FROM "+effects+" ORDER BY 1")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var s string
		_ = rows.Scan(&s)
		got = append(got, s)
	}
	rows.Close()
	want := []string{ids[0] + " confirmed", ids[1] + " other", ids[2] + " other"}
	slices.Sort(want)
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("effects %v, want %v", got, want)
	}
}

func TestInboxModuleConfigErrors(t *testing.T) {
	pool := testenv.Pool(t)
	app := fx.New(fx.NopLogger,
		fx.Supply(pool, fxoutbox.Config{Brokers: []string{"127.0.0.1:1"}}),
		fx.Supply(fxoutbox.InboxConfig{}),
		fxoutbox.InboxModule,
		fx.Provide(fxoutbox.InboxRoute(func() inbox.Route { return inbox.Route{Topic: "t", Handler: nil} })),
	)
	if err := app.Err(); !errors.Is(err, outbox.ErrInvalidConfig) || !strings.Contains(err.Error(), "Group") {
		t.Fatalf("app.Err() = %v, want a config error naming Group", err)
	}
}

func produce(t *testing.T, brokers []string, topic, id, typ string) {
	t.Helper()
	testenv.Produce(t, brokers, &sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder("o-1"), Value: sarama.StringEncoder(`{}`),
		Headers: []sarama.RecordHeader{{Key: []byte(outbox.HeaderEventID), Value: []byte(id)}, {Key: []byte(outbox.HeaderEventType), Value: []byte(typ)}}})
}
