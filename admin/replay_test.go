package admin_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/admin"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// Events published to the broker, then replayed for one key and an id
// range, in chunks: the relay publishes exactly the replayed events again,
// with their x-event-id, each key's replayed events in their original
// order; parked and waiting rows are not replayed.
func TestReplayPublishesAgainThroughTheRelay(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	brokers := testenv.Brokers(t)
	topic := testenv.Topic(t, brokers, 4)
	uow, err := unitofwork.New(s.pool, &unitofwork.Config{Service: "shop", Table: s.table})
	if err != nil {
		t.Fatal(err)
	}
	const events, keys = 2000, 20
	for i := 0; i < events; i += 200 {
		if err := uow.Do(s.ctx, func(ctx context.Context, tx unitofwork.Tx) error {
			var evs []outbox.Event
			for j := i; j < i+200; j++ {
				evs = append(evs, outbox.Event{Topic: topic, AggregateType: "Order", AggregateID: fmt.Sprintf("o-%d", j%keys), Type: "order.changed.v1", Payload: map[string]int{"seq": j}})
			}
			return tx.Add(ctx, evs...)
		}); err != nil {
			t.Fatal(err)
		}
	}
	pub, err := relay.NewSaramaPublisher(brokers, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	r, err := relay.New(s.pool, pub, &relay.Config{Table: s.table, Retention: -1})
	if err != nil {
		t.Fatal(err)
	}
	drain := func() {
		t.Helper()
		for i := 0; ; i++ {
			n, err := r.RunOnce(s.ctx)
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				return
			}
			if i > 1000 {
				t.Fatal("relay does not drain")
			}
		}
	}
	drain()
	cons := testenv.Consume(t, brokers, topic)
	cons.WaitFor(events, 30*time.Second)
	// A parked and a waiting row, which Replay must leave alone.
	s.seed(t, rows{n: 1, key: "'o-3'", parked: "now()", lastErr: "'x'"})

	var lo, hi int64
	if err := s.pool.QueryRow(s.ctx, "SELECT min(id) + 100, min(id) + 399 FROM "+sqlname.Ident(s.table)).Scan(&lo, &hi); err != nil {
		t.Fatal(err)
	}
	want, err := admin.CountPublished(s.ctx, s.pool, s.table, admin.Filter{Key: "o-3"})
	if err != nil || want != events/keys {
		t.Fatalf("CountPublished(key o-3) = %d, %v", want, err)
	}
	var progress []int
	n, err := admin.Replay(s.ctx, s.pool, s.table, admin.Filter{Key: "o-3"}, &admin.BulkOptions{ChunkSize: 30, Progress: func(d int) { progress = append(progress, d) }})
	if err != nil || n != want || len(progress) != 4 || progress[3] != want {
		t.Fatalf("Replay(key o-3) = %d, %v, progress %v", n, err, progress)
	}
	// An id range overlapping the key: its o-3 rows are no longer
	// published, so they are not counted twice.
	n2, err := admin.Replay(s.ctx, s.pool, s.table, admin.Filter{FromID: lo, ToID: hi}, &admin.BulkOptions{ChunkSize: 64})
	if err != nil || n2 != 300-300/keys {
		t.Fatalf("Replay(ids %d-%d) = %d, %v; want %d", lo, hi, n2, err, 300-300/keys)
	}
	if p := s.count(t, "parked_at IS NOT NULL"); p != 1 {
		t.Errorf("%d parked rows after replay, want 1", p)
	}
	drain()
	total := events + n + n2
	msgs := cons.WaitFor(total, 30*time.Second)
	time.Sleep(200 * time.Millisecond)
	if got := testenv.RecordCount(t, brokers, topic); got != total {
		t.Fatalf("%d records on the topic, want %d (%d + %d replayed)", got, total, events, n+n2)
	}
	// Per key, the second deliveries carry the first ones' ids, in the
	// same order.
	firsts, seconds := map[string][]string{}, map[string][]string{}
	seen := map[string]bool{}
	for _, m := range msgs {
		id := testenv.Header(m, outbox.HeaderEventID)
		if seen[id] {
			seconds[string(m.Key)] = append(seconds[string(m.Key)], id)
		} else {
			seen[id] = true
			firsts[string(m.Key)] = append(firsts[string(m.Key)], id)
		}
	}
	if !slices.Equal(seconds["o-3"], firsts["o-3"]) {
		t.Errorf("key o-3: replayed %d events, not in their original order", len(seconds["o-3"]))
	}
	replayed := 0
	for k, ids := range seconds {
		replayed += len(ids)
		if k != "o-3" && !slices.Equal(ids, firsts[k][5:20]) { // ids lo..hi: the 6th to the 20th event of each key
			t.Errorf("key %s: replayed %v, want its events 6 to 20", k, ids)
		}
	}
	if replayed != n+n2 {
		t.Errorf("%d events delivered twice, want %d", replayed, n+n2)
	}
}
