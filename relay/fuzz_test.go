package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/admin"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
)

// FuzzStoredRow writes a row by hand with any values its columns accept
// (as a buggy writer or a hand-written INSERT could), then a good event of
// the same key, and runs a cursor relay on the table: it may not stall. The good event must be delivered, and the odd row
// delivered or parked with a reason (moved to the parked table); no batch
// may fail for it. `go test`
// runs the seed corpus below; `go test -fuzz FuzzStoredRow ./relay/` looks
// for more.
func FuzzStoredRow(f *testing.F) {
	f.Add("order.created.v1", "test", "k1", `{"a":1}`, `{"x-a":"b"}`, int32(0), int64(0))
	f.Add("", "", "", `null`, `null`, int32(0), int64(0))
	f.Add("t", "not a topic!", "k", `"just a string"`, `[1,2]`, int32(3), int64(0))
	f.Add("t", "test", "k", `{}`, `{"traceparent":7,"tracestate":{"a":1}}`, int32(0), int64(-1e12))
	f.Add("t", "test", string(make([]byte, 0, 1)), `[[[[[[[[[[]]]]]]]]]]`, `"headers"`, int32(-5), int64(4e12))
	f.Add("t\u2028\u00e9\U0001F600", "test", "\u0001key\U0001F600", `{"\u0001":"\ud83d\ude00"}`, `{"x-event-id":"not-a-uuid"}`, int32(1<<30), int64(0))
	f.Add("t", "test", "a very long key "+strings.Repeat("k", 4000), `1e308`, `{"content-type":"application/cloudevents+json"}`, int32(0), int64(0))
	f.Add("t", "test", "k", `{"a":"\u0000"}`, `null`, int32(0), int64(0)) // refused by jsonb: skipped
	s := newSetup(f)
	brokers := s.kafka(f)
	topic := testenv.Topic(f, brokers, 2)
	cons := testenv.Consume(f, brokers, topic)
	s.cursor(f)
	cursorRelay := s.relay(f, s.publisher(f), relay.Config{Progress: relay.ProgressCursor, MaxAttempts: 1})
	n := 0
	f.Fuzz(func(t *testing.T, eventType, tp, key, payload, headers string, attempts int32, createdAt int64) {
		n++
		if tp == "test" {
			tp = topic
		}
		if !json.Valid([]byte(payload)) {
			payload, _ = jsonString(payload)
		}
		if !json.Valid([]byte(headers)) {
			headers, _ = jsonString(headers)
		}
		odd := uuid.Must(uuid.NewV7())
		_, err := s.pool.Exec(s.ctx, "INSERT INTO "+sqlname.Ident(s.table)+
			" (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, headers, attempts, created_at)"+
			" VALUES ($1, 'fuzz', $2, $3, $4::jsonb, $5, $2, $6::jsonb, $7, now() + $8 * interval '1 microsecond')",
			odd, key, eventType, payload, tp, headers, attempts, createdAt)
		if err != nil {
			t.Skipf("the table refused the row, so no relay ever reads it: %v", err)
		}
		good := uuid.Must(uuid.NewV7())
		if _, err := s.pool.Exec(s.ctx, "INSERT INTO "+sqlname.Ident(s.table)+
			" (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key) VALUES ($1, 'fuzz', $2, 'fuzz.good.v1', $3, $4, $2)",
			good, key, fmt.Sprintf(`{"n":%d}`, n), topic); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
		defer cancel()
		for delivered := false; !delivered; {
			if ctx.Err() != nil {
				t.Fatalf("the good event after the odd row (event_type %q, topic %q, key %q, payload %s, headers %s, attempts %d) was not delivered: the lane stalled", eventType, tp, key, payload, headers, attempts)
			}
			if _, err := cursorRelay.RunOnce(ctx); err != nil {
				t.Fatalf("RunOnce: %v (an odd row must not fail the batch)", err)
			}
			for _, m := range cons.Messages() {
				if testenv.Header(m, outbox.HeaderEventID) == good.String() {
					delivered = true
				}
			}
			if !delivered {
				time.Sleep(10 * time.Millisecond)
			}
		}
		// Parked, it moved to the parked table with a reason; delivered, it
		// stays in the table.
		p, parked := s.parked(t, odd)
		_, inTable := s.inTable(t, odd)
		// Its key's next event went: the odd row is resolved, parked or
		// delivered (maybe to a topic of its own), and nothing waits.
		st, err := admin.ReadStatus(s.ctx, s.pool, s.table, nil)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case parked && inTable:
			t.Errorf("the odd row was parked, yet is still in the table")
		case !parked && !inTable:
			t.Errorf("the odd row is neither in the table nor parked")
		case parked && (p.reason == "" || p.attempts < 1 || p.lastTry == nil):
			t.Errorf("the odd row was parked without a reason, an attempt or its try: %+v", p)
		case st.Backlog != 0:
			t.Errorf("the key's next event went, yet %d events wait (the odd row: parked %v, reason %q)", st.Backlog, parked, p.reason)
		}
	})
}

func jsonString(s string) (string, error) {
	b, err := json.Marshal(s)
	return string(b), err
}
