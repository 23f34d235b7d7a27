package inbox_test

import (
	"context"
	"encoding/json"
	"sort"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/inbox"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/unitofwork"
)

// cloudEvent is a record another CloudEvents producer would send in the
// binary content mode of the Kafka protocol binding: ce_ headers only, no
// x-event-id or x-event-type. An empty source leaves ce_source out.
func cloudEvent(topic, key, source, id, typ string, seq int) *sarama.ProducerMessage {
	b, _ := json.Marshal(payload{Seq: seq})
	hs := []sarama.RecordHeader{
		{Key: []byte("ce_specversion"), Value: []byte("1.0")},
		{Key: []byte("ce_id"), Value: []byte(id)},
		{Key: []byte("ce_type"), Value: []byte(typ)},
		{Key: []byte("ce_time"), Value: []byte("2026-12-03T18:25:12Z")},
		{Key: []byte("content-type"), Value: []byte("application/json")},
	}
	if source != "" {
		hs = append(hs, sarama.RecordHeader{Key: []byte("ce_source"), Value: []byte(source)})
	}
	return &sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(key), Value: sarama.ByteEncoder(b), Headers: hs}
}

// Records of another CloudEvents producer, which carry ce_id and ce_source
// but no x-event-id, are deduplicated on their CloudEvents identity: one
// delivered twice is applied once, also when a new group of the same
// consumer name reads the topic again; the same ce_id from another source
// is another event. ce_id need not be a UUID. They are routed by ce_type;
// one without ce_source has no identity and is parked.
func TestCloudEventsRecordsAppliedOnce(t *testing.T) {
	t.Parallel()
	modes(t, 1, func(t *testing.T, e *env) {
		const typ = "thing.happened.v1"
		testenv.Produce(t, e.brokers,
			cloudEvent(e.topic, "a", "/billing-java", "order-42/7", typ, 0),
			cloudEvent(e.topic, "a", "/billing-java", "order-42/7", typ, 0),        // delivered twice
			cloudEvent(e.topic, "b", "urn:acme:other", "order-42/7", typ, 0),       // same id, another source
			cloudEvent(e.topic, "a", "/billing-java", "order-42/8", "other.v1", 1), // no route takes its ce_type
			cloudEvent(e.topic, "c", "", "no-source", typ, 0),
		)
		want := []string{inbox.CloudEventID("/billing-java", "order-42/7"), inbox.CloudEventID("urn:acme:other", "order-42/7")}
		sort.Strings(want)
		types := make(chan string, 10)
		effect := e.effect("ce")
		handler := func(ctx context.Context, tx unitofwork.Tx, m *inbox.Message) error {
			types <- m.Type
			return effect(ctx, tx, m)
		}
		for round, g := range []string{group(), group()} { // the second re-reads everything under the same name
			cfg := e.config(g, handler)
			cfg.Routes[0].Type = typ
			c := e.start(cfg)
			eventually(t, 60*time.Second, "every offset committed", func() bool { return e.committed(g, 1)[0] == 5 })
			stop(t, c)
			if got := e.effectIDs(); len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
				t.Fatalf("round %d: applied %v, want each of %v once", round, got, want)
			}
			parked, err := c.List(context.Background(), inbox.ListOptions{})
			// Parked once: the parked table keeps one row per position.
			if err != nil || len(parked) != 1 {
				t.Fatalf("round %d: parked %+v, %v; want the record without ce_source", round, parked, err)
			}
			for _, p := range parked {
				if p.ErrorType != inbox.ErrorTypeNoEventID || p.Offset != 4 {
					t.Errorf("round %d: parked %+v, want the record without ce_source (offset 4), as no_event_id", round, p)
				}
			}
		}
		close(types)
		for typ := range types {
			if typ != "thing.happened.v1" {
				t.Errorf("handler saw Message.Type %q, want the ce_type", typ)
			}
		}
	})
}

// effectIDs returns the event ids of the effects rows, sorted.
func (e *env) effectIDs() []string {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT event_id FROM `+e.effects+` ORDER BY event_id`)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			e.t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

// CloudEventID is a version 5 UUID of source and id that keeps them apart
// (("a", "bc") is not ("ab", "c")); EventID takes x-event-id first, then a
// CloudEvent's identity, and refuses a record with neither.
func TestCloudEventID(t *testing.T) {
	id := inbox.CloudEventID("/orders", "42")
	u, err := uuid.Parse(id)
	if err != nil || u.Version() != 5 || id != inbox.CloudEventID("/orders", "42") {
		t.Fatalf("CloudEventID = %q (%v), want a stable version 5 UUID", id, err)
	}
	if inbox.CloudEventID("a", "bc") == inbox.CloudEventID("ab", "c") || id == inbox.CloudEventID("/other", "42") {
		t.Error("CloudEventID does not keep source and id apart")
	}
	h := func(kv ...string) *sarama.ConsumerMessage {
		m := &sarama.ConsumerMessage{}
		for i := 0; i < len(kv); i += 2 {
			m.Headers = append(m.Headers, &sarama.RecordHeader{Key: []byte(kv[i]), Value: []byte(kv[i+1])})
		}
		return m
	}
	for _, c := range []struct {
		m    *sarama.ConsumerMessage
		want string
	}{
		{h("ce_id", "42", "ce_source", "/orders", outbox.HeaderEventID, "x-id"), "x-id"},
		{h("ce_source", "/orders", "ce_id", "42"), id},
		{h("ce_id", "42"), ""},
		{h("ce_source", "/orders"), ""},
		{h("ce_id", "", "ce_source", "/orders"), ""},
	} {
		got, err := inbox.EventID(c.m)
		if got != c.want || (c.want == "") != (err != nil) {
			t.Errorf("EventID(%v) = %q, %v; want %q", c.m.Headers, got, err, c.want)
		}
	}
}
