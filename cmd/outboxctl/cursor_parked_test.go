package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/IBM/sarama"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/migrations"
	"github.com/fxoutbox/outbox/relay"
)

// On a table in cursor mode a cursor relay moves a poison event to the
// parked table; outboxctl finds it there: status counts it, parked list and
// show name it with its reason, its last error and its tries, and a
// requeue moves it back into the table, where the relay delivers it once.
func TestCursorParkedTable(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	if err := migrations.Cursor.Up(w.ctx, w.pool, w.table); err != nil {
		t.Fatal(err)
	}
	var created atomic.Bool
	rec := &recorder{}
	pub := relay.PublisherFunc(func(ctx context.Context, msgs []relay.Message) error {
		failed := map[int]error{}
		var good []relay.Message
		for i, m := range msgs {
			if m.Topic == "shop.missing" && !created.Load() {
				failed[i] = outbox.Permanent(fmt.Errorf("%s: %w", m.Topic, sarama.ErrUnknownTopicOrPartition))
				continue
			}
			good = append(good, m)
		}
		_ = rec.Publish(ctx, good)
		if len(failed) > 0 {
			return &relay.BatchError{Failed: failed}
		}
		return nil
	})
	r, err := relay.New(w.pool, pub, &relay.Config{Table: w.table, Progress: relay.ProgressCursor, Retention: -1})
	if err != nil {
		t.Fatal(err)
	}
	drain := func() {
		t.Helper()
		for {
			n, err := r.RunOnce(w.ctx)
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				return
			}
		}
	}
	const poison = "00000000-0000-7000-8000-0000000000aa"
	w.exec("INSERT INTO $T (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key)" +
		" SELECT gen_random_uuid(), 'Order', 'o-' || g, 'order.created.v1', jsonb_build_object('seq', g), 'shop.orders', 'o-' || g FROM generate_series(1, 20) g")
	w.exec("INSERT INTO $T (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key)" +
		" VALUES ('" + poison + "', 'Order', 'o-7', 'order.created.v1', '{\"total\": 9}', 'shop.missing', 'o-7')")
	drain()
	if got := len(rec.take()); got != 20 {
		t.Fatalf("the relay published %d events, want the 20 good ones", got)
	}
	if w.count("event_id = '"+poison+"'") != 0 {
		t.Fatal("the poison event is still in the table: in cursor mode it moves to the parked table")
	}

	w.want(w.run("", false, "status"), exitOK, "Backlog   0 events waiting", "Parked    1 events", "shop.missing", `topic "shop.missing" does not exist`)
	r1 := w.run("", false, "parked", "list")
	w.want(r1, exitOK, poison, "shop.missing", "[kafka.unknown_topic_or_partition]")
	list := decode[struct {
		Events []struct {
			EventID    string  `json:"event_id"`
			Reason     string  `json:"reason"`
			LastError  string  `json:"last_error"`
			Attempts   int     `json:"attempts"`
			FirstTryAt *string `json:"first_try_at"`
		} `json:"events"`
	}](t, w.run("", false, "parked", "list", "--error", "does not exist on this broker", "--json").stdout)
	if len(list.Events) != 1 || list.Events[0].EventID != poison || list.Events[0].Attempts != 1 || list.Events[0].FirstTryAt == nil ||
		list.Events[0].Reason == list.Events[0].LastError {
		t.Fatalf("parked list --json: %+v; want the poison event, its reason and its own last error", list.Events)
	}
	w.want(w.run("", false, "parked", "show", poison), exitOK, "First try", "Reason", "Last error", "does not exist on this broker", `"total": 9`,
		"outboxctl parked requeue "+poison)

	created.Store(true)
	w.want(w.run("", false, "parked", "requeue", poison, "--yes"), exitOK)
	w.want(w.run("", false, "parked", "list"), exitNoMatch, "no parked events match")
	if w.count("event_id = '"+poison+"'") != 1 {
		t.Fatal("the requeued event is not back in the table")
	}
	drain()
	msgs := rec.take()
	if len(msgs) != 1 || msgs[0].EventID.String() != poison {
		t.Fatalf("after the requeue the relay published %d events, want the requeued one", len(msgs))
	}
	var parkedRows int
	if err := w.pool.QueryRow(w.ctx, "SELECT count(*) FROM "+sqlname.Ident(sqlname.Parked(w.table))).Scan(&parkedRows); err != nil {
		t.Fatal(err)
	}
	if parkedRows != 0 {
		t.Fatalf("%d rows left in the parked table", parkedRows)
	}
	w.want(w.run("", false, "parked", "show", poison), exitNoMatch)
}
