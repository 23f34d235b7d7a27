package admin_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/google/uuid"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/admin"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// parkOne writes two events and runs a relay whose broker rejects one of
// them for good, so the relay parks it after its first attempt.
func parkOne(ctx context.Context, db relay.DB, uow *unitofwork.UnitOfWork, table outbox.Table) {
	_ = uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		return tx.Add(ctx,
			outbox.Event{AggregateType: "Order", AggregateID: "o-1", Type: "order.created.v1", Payload: map[string]int{"total": 42}},
			outbox.Event{AggregateType: "Order", AggregateID: "o-2", Type: "order.created.v1", Payload: map[string]int{"total": 7}})
	})
	pub := relay.PublisherFunc(func(_ context.Context, msgs []relay.Message) error {
		failed := map[int]error{}
		for i, m := range msgs {
			if string(m.Key) == "o-2" {
				failed[i] = outbox.Permanent(errors.New("kafka server: Message contents does not match its CRC"))
			}
		}
		if len(failed) > 0 {
			return &relay.BatchError{Failed: failed}
		}
		return nil
	})
	r, _ := relay.New(db, pub, &relay.Config{Table: table, MaxAttempts: 1, Logger: slog.New(slog.DiscardHandler)})
	_, _ = r.RunOnce(ctx)
}

// An operator finds the parked event, reads it with its payload, and, once
// the cause is fixed, puts it back in line.
func ExampleRequeue() {
	pool, table, cleanup := testenv.ExampleDB()
	defer cleanup()
	ctx := context.Background()
	uow, _ := unitofwork.New(pool, &unitofwork.Config{Service: "order-service", Table: table})
	parkOne(ctx, pool, uow, table)

	parked, err := admin.ListParked(ctx, pool, table, admin.Filter{Topic: "order-service.order.created", Error: "crc"})
	if err != nil {
		panic(err)
	}
	for _, p := range parked {
		fmt.Printf("parked: key=%s type=%s attempts=%d error=%q\n", p.Key, p.EventType, p.Attempts, p.LastError)
	}
	ev, _ := admin.GetParked(ctx, pool, table, parked[0].EventID)
	fmt.Printf("payload: %s\n", ev.Payload)

	n, err := admin.Requeue(ctx, pool, table, admin.Filter{EventIDs: []uuid.UUID{ev.EventID}}, nil)
	fmt.Println("requeued:", n, err)
	st, _ := admin.ReadStatus(ctx, pool, table, nil)
	fmt.Println("backlog:", st.Backlog, "parked:", st.Parked)
	// Output:
	// parked: key=o-2 type=order.created.v1 attempts=1 error="[_OTHER] kafka server: Message contents does not match its CRC"
	// payload: {"total": 7}
	// requeued: 1 <nil>
	// backlog: 1 parked: 0
}

// The status of a table: its backlog, parked events by topic and reason,
// and the relays at work.
func ExampleReadStatus() {
	pool, table, cleanup := testenv.ExampleDB()
	defer cleanup()
	ctx := context.Background()
	uow, _ := unitofwork.New(pool, &unitofwork.Config{Service: "order-service", Table: table})
	parkOne(ctx, pool, uow, table)
	_ = uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		return tx.Add(ctx, outbox.Event{AggregateType: "Order", AggregateID: "o-3", Type: "order.created.v1", Payload: map[string]int{"total": 1}})
	})

	st, err := admin.ReadStatus(ctx, pool, table, nil)
	if err != nil {
		panic(err)
	}
	fmt.Println("backlog:", st.Backlog, "parked:", st.Parked, "lanes held:", len(st.LanesHeld))
	for _, g := range st.ParkedGroups {
		fmt.Printf("%d parked on %s: %s\n", g.Count, g.Topic, g.Reason)
	}
	// Output:
	// backlog: 1 parked: 1 lanes held: 0
	// 1 parked on order-service.order.created: [_OTHER] kafka server: Message contents does not match its CRC
}

// A consumer lost the events of one order: Replay sets them back to
// unpublished, and the relay sends them again, same ids, in their order.
func ExampleReplay() {
	pool, table, cleanup := testenv.ExampleDB()
	defer cleanup()
	ctx := context.Background()
	uow, _ := unitofwork.New(pool, &unitofwork.Config{Service: "order-service", Table: table})
	_ = uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		return tx.Add(ctx,
			outbox.Event{AggregateType: "Order", AggregateID: "o-1", Type: "order.created.v1", Payload: map[string]int{"total": 42}},
			outbox.Event{AggregateType: "Order", AggregateID: "o-2", Type: "order.created.v1", Payload: map[string]int{"total": 7}},
			outbox.Event{AggregateType: "Order", AggregateID: "o-1", Type: "order.paid.v1", Payload: map[string]int{"total": 42}})
	})
	printer := relay.PublisherFunc(func(_ context.Context, msgs []relay.Message) error {
		for _, m := range msgs {
			fmt.Printf("  %s key=%s value=%s\n", m.Topic, m.Key, m.Value)
		}
		return nil
	})
	r, _ := relay.New(pool, printer, &relay.Config{Table: table})
	fmt.Println("first delivery:")
	_, _ = r.RunOnce(ctx)

	n, err := admin.Replay(ctx, pool, table, admin.Filter{Key: "o-1"}, nil)
	fmt.Println("replayed:", n, err)
	fmt.Println("second delivery:")
	_, _ = r.RunOnce(ctx)
	// Output:
	// first delivery:
	//   order-service.order.created key=o-1 value={"total": 42}
	//   order-service.order.created key=o-2 value={"total": 7}
	//   order-service.order.paid key=o-1 value={"total": 42}
	// replayed: 2 <nil>
	// second delivery:
	//   order-service.order.created key=o-1 value={"total": 42}
	//   order-service.order.paid key=o-1 value={"total": 42}
}
