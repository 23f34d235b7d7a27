package nestjs_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/admin"
	"github.com/fxoutbox/outbox/internal/nestjs"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/migrations"
	"github.com/fxoutbox/outbox/relay"
)

// recorder is a Publisher that keeps what it was given.
type recorder struct {
	mu   sync.Mutex
	msgs []relay.Message
}

func (r *recorder) Publish(_ context.Context, msgs []relay.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, msgs...)
	return nil
}

// take returns and forgets what was published so far.
func (r *recorder) take() []relay.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.msgs
	r.msgs = nil
	return out
}

// Rows the NestJS writers insert have no headers (NULL), before the
// migration and after it: every path that reads rows takes them. The poll
// claim publishes them with x-event-id and x-event-type only; a replay
// publishes them again; a parked one shows (admin.GetParked, what outboxctl
// parked show prints) without headers; the streaming relay, on an adopted
// table with the publication created by migrations.Stream.Up, decodes them
// from the WAL.
func TestNestJSRowsOnEveryReadPath(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	tbl := outbox.Table{Schema: testenv.Name("nestjs_")}
	nest := nestjs.Create(t, pool, tbl.Schema)
	const topic = "order-service.order.confirmed"
	nestjs.Fill(t, nest, 20, 4, 5, topic)
	if err := migrations.Outbox.Up(ctx, pool, tbl); err != nil {
		t.Fatal(err)
	}
	type row struct{ key, eventType string }
	rows := func() map[uuid.UUID]row {
		out := map[uuid.UUID]row{}
		rs, err := pool.Query(ctx, "SELECT event_id, partition_key, event_type FROM "+sqlname.Ident(tbl)+" WHERE headers IS NULL")
		if err != nil {
			t.Fatal(err)
		}
		defer rs.Close()
		for rs.Next() {
			var id uuid.UUID
			var r row
			if err := rs.Scan(&id, &r.key, &r.eventType); err != nil {
				t.Fatal(err)
			}
			out[id] = r
		}
		return out
	}
	// check says that msgs are n NestJS rows, sent as the NestJS relay sends them.
	check := func(path string, msgs []relay.Message, n int) {
		t.Helper()
		byID := rows()
		if len(msgs) != n {
			t.Fatalf("%s: %d messages, want %d", path, len(msgs), n)
		}
		for _, m := range msgs {
			r, ok := byID[m.EventID]
			var hs []string
			for _, h := range m.Headers {
				hs = append(hs, h.Key)
			}
			if !ok || string(m.Key) != r.key || m.Topic != topic || len(m.Value) == 0 ||
				!slices.Equal(hs, []string{outbox.HeaderEventID, outbox.HeaderEventType}) ||
				string(m.Headers[0].Value) != m.EventID.String() || string(m.Headers[1].Value) != r.eventType {
				t.Errorf("%s: %s sent with key %q topic %s headers %v; want a NestJS row's key, x-event-id and x-event-type only", path, m.EventID, m.Key, m.Topic, m.Headers)
			}
		}
	}
	rec := &recorder{}

	// The poll claim.
	r, err := relay.New(pool, rec, &relay.Config{Table: tbl})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := r.RunOnce(ctx); err != nil || n != 15 {
		t.Fatalf("RunOnce = %d, %v; want the 15 unpublished NestJS rows", n, err)
	}
	check("poll claim", rec.take(), 15)

	// A replay.
	n, err := admin.Replay(ctx, pool, tbl, admin.Filter{Key: "order-1"}, nil)
	if err != nil || n != 5 {
		t.Fatalf("Replay = %d, %v", n, err)
	}
	if n, err := r.RunOnce(ctx); err != nil || n != 5 {
		t.Fatalf("RunOnce after the replay = %d, %v", n, err)
	}
	check("replay", rec.take(), 5)

	// A parked row, shown.
	var parked uuid.UUID
	if err := pool.QueryRow(ctx, "UPDATE "+sqlname.Ident(tbl)+" SET published_at = NULL, parked_at = now(), attempts = 3, last_error = 'kafka: message too large'"+
		" WHERE id = 4 RETURNING event_id").Scan(&parked); err != nil {
		t.Fatal(err)
	}
	p, err := admin.GetParked(ctx, pool, tbl, parked)
	if err != nil || p.Headers != nil || len(p.Payload) == 0 || p.Key != "order-3" || p.LastError != "kafka: message too large" {
		t.Fatalf("GetParked of a NestJS row = %+v, %v", p, err)
	}
	if list, err := admin.ListParked(ctx, pool, tbl, admin.Filter{}); err != nil || len(list) != 1 || list[0].EventID != parked {
		t.Fatalf("ListParked = %+v, %v", list, err)
	}

	// The stream, on the adopted table.
	testenv.Streaming(t, pool, tbl, true)
	sr, err := relay.New(pool, rec, &relay.Config{
		Table: tbl, Mode: relay.Stream, PollInterval: time.Hour,
		Stream: relay.StreamConfig{StandbyRetry: 50 * time.Millisecond, StatusInterval: 100 * time.Millisecond, SweepInterval: time.Hour},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := sr.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sr.Stop(context.Background()) })
	testenv.Eventually(t, time.Minute, func() (bool, string) {
		st := sr.StreamStatus()
		return st.State == relay.Streaming, fmt.Sprintf("stream status %+v, want streaming", st)
	})
	rec.take() // the start's sweep has nothing to publish: the parked row stays
	for i := range 6 {
		if _, err := nestjs.Write(ctx, nest, nestjs.NewEvent(100+i, "order-"+string(rune('a'+i%3)), topic)); err != nil {
			t.Fatal(err)
		}
	}
	var got []relay.Message
	testenv.Eventually(t, time.Minute, func() (bool, string) {
		got = append(got, rec.take()...)
		return len(got) >= 6, fmt.Sprintf("%d of 6 streamed rows published", len(got))
	})
	check("stream", got, 6)
	var left int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+sqlname.Ident(tbl)+" WHERE published_at IS NULL AND parked_at IS NULL").Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d rows unpublished (%v)", left, err)
	}
}
