package inbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fxoutbox/outbox/inbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
)

// With DeadLetterTopic, parking a record also records an outbox event to
// that topic, in the parking transaction: the record's exact bytes and why
// it was parked. One per parked row: a record without identity parked
// again after an offset reset sends no second one, and a duplicate of a
// parked event none at all.
func TestDeadLetterTopicGetsEachParkedRecordOnce(t *testing.T) {
	t.Parallel()
	modes(t, 1, func(t *testing.T, e *env) {
		long := strings.Repeat("k", 2000) // over the outbox's MaxKeyBytes (1024)
		recs := e.produce(ev{Key: "a", Seq: 0}, ev{Key: "a", Seq: 1, Poison: true}, ev{ID: "-", Key: "b", Seq: 0}, ev{Key: long, Poison: true})
		dlq := e.topic + ".dlq"
		g := group()
		cfg := e.config(g, e.effect("d"))
		cfg.MaxAttempts, cfg.DeadLetterTopic = 2, dlq
		c := e.start(cfg)
		e.waitCommitted(g, 1, 4, 60*time.Second)
		parked, err := c.List(context.Background(), inbox.ListOptions{})
		if err != nil || len(parked) != 3 {
			t.Fatalf("parked %+v, %v; want 3", parked, err)
		}
		letters := e.deadLetters(dlq)
		if len(letters) != 3 {
			t.Fatalf("%d dead letters, want one per parked record (3)", len(letters))
		}
		byOffset := map[int64]inbox.DeadLetter{}
		for _, l := range letters {
			byOffset[l.Offset] = l
		}
		poison, noID, longKey := byOffset[1], byOffset[2], byOffset[3]
		want, _ := json.Marshal(payload{Seq: 1, Poison: true}) // as produced
		if poison.EventID != recs[1].ID || string(poison.Value) != string(want) || string(poison.Key) != "a" ||
			poison.ErrorType != inbox.ErrorTypeHandler || poison.Attempts != 2 || poison.Consumer != "c" || poison.Topic != e.topic {
			t.Errorf("the poison record's dead letter: %+v", poison)
		}
		if noID.EventID != "" || noID.ErrorType != inbox.ErrorTypeNoEventID || string(noID.Key) != "b" {
			t.Errorf("the record without x-event-id's dead letter: %+v", noID)
		}
		// Its key breaks the outbox's limits: the letter keeps the position
		// and the reason, and the parking went through.
		if longKey.EventID != recs[3].ID || longKey.Key != nil || longKey.Value != nil || !strings.Contains(longKey.ValueOmitted, "MaxKeyBytes") ||
			longKey.ErrorType != inbox.ErrorTypeHandler {
			t.Errorf("the long-keyed record's dead letter: %+v", longKey)
		}
		for _, p := range parked {
			if l := byOffset[p.Offset]; l.ID != p.ID || !l.ParkedAt.Equal(p.ParkedAt) {
				t.Errorf("dead letter of offset %d names parked id %d at %v, the parked table %d at %v", p.Offset, l.ID, l.ParkedAt, p.ID, p.ParkedAt)
			}
		}
		stop(t, c)

		// Offsets reset: the poison event is a duplicate now, the record
		// without identity is parked again; neither sends another letter.
		g2 := group()
		cfg2 := e.config(g2, e.effect("d2"))
		cfg2.MaxAttempts, cfg2.DeadLetterTopic = 2, dlq
		e.start(cfg2)
		e.waitCommitted(g2, 1, 4, 60*time.Second)
		if n := len(e.deadLetters(dlq)); n != 3 {
			t.Errorf("%d dead letters after the offsets were reset, want still 3", n)
		}
	})
}

// deadLetters reads the dead-letter events recorded in the outbox table
// for topic.
func (e *env) deadLetters(topic string) []inbox.DeadLetter {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT payload, headers, event_type, partition_key FROM `+sqlname.Ident(e.table)+` WHERE topic = $1 ORDER BY id`, topic)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	var out []inbox.DeadLetter
	for rows.Next() {
		var payload []byte
		var headers map[string]string
		var typ, key string
		if err := rows.Scan(&payload, &headers, &typ, &key); err != nil {
			e.t.Fatal(err)
		}
		var l inbox.DeadLetter
		if err := json.Unmarshal(payload, &l); err != nil {
			e.t.Fatalf("dead letter payload %s: %v", payload, err)
		}
		wantKey := string(l.Key)
		if wantKey == "" {
			wantKey = fmt.Sprintf("%s/%d/%d", l.Topic, l.Partition, l.Offset)
		}
		if typ != inbox.DeadLetterEventType || headers["x-original-topic"] != l.Topic || key != wantKey {
			e.t.Errorf("dead letter of %s/%d: type %q, headers %v, key %q", l.Topic, l.Offset, typ, headers, key)
		}
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		e.t.Fatal(err)
	}
	return out
}
