package record_test

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/record"
)

func valid() outbox.Event {
	return outbox.Event{AggregateType: "order", AggregateID: "o-1", Type: "order.created.v1", Payload: map[string]any{"total": 42}}
}

func TestPrepareDefaults(t *testing.T) {
	limits := record.LimitsWithDefaults(outbox.Limits{})
	r, err := record.Prepare(valid(), "order-service", nil, limits, map[string]string{"traceparent": "00-abc"})
	if err != nil {
		t.Fatal(err)
	}
	if r.ID.Version() != 7 {
		t.Errorf("id %v is version %d, want a UUIDv7", r.ID, r.ID.Version())
	}
	if r.Key != "o-1" || r.Topic != "order-service.order.created" || string(r.Payload) != `{"total":42}` {
		t.Errorf("record = %+v", r)
	}
	if r.Headers["traceparent"] != "00-abc" {
		t.Errorf("trace context not kept: %v", r.Headers)
	}
	e := valid()
	e.ID, e.Key, e.Topic, e.Payload = uuid.New(), "k", "explicit.topic", json.RawMessage(`{"a":1}`)
	e.Headers = map[string]string{"tenant": "t1"}
	r, err = record.Prepare(e, "", nil, limits, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.ID != e.ID || r.Key != "k" || r.Topic != "explicit.topic" || string(r.Payload) != `{"a":1}` || r.Headers["tenant"] != "t1" {
		t.Errorf("explicit fields not kept: %+v", r)
	}
}

func TestPrepareRejects(t *testing.T) {
	limits := record.LimitsWithDefaults(outbox.Limits{MaxPayloadBytes: 100, MaxHeaders: 2, MaxHeaderBytes: 20})
	cases := []struct {
		name  string
		edit  func(*outbox.Event)
		field string
	}{
		{"no type", func(e *outbox.Event) { e.Type = " " }, "Type"},
		{"no aggregate type", func(e *outbox.Event) { e.AggregateType = "" }, "AggregateType"},
		{"no aggregate id", func(e *outbox.Event) { e.AggregateID = "" }, "AggregateID"},
		{"unmarshalable payload", func(e *outbox.Event) { e.Payload = math.Inf(1) }, "Payload"},
		{"channel payload", func(e *outbox.Event) { e.Payload = make(chan int) }, "Payload"},
		{"invalid raw JSON", func(e *outbox.Event) { e.Payload = []byte("{nope") }, "Payload"},
		{"oversized payload", func(e *outbox.Event) { e.Payload = strings.Repeat("x", 200) }, "Payload"},
		{"invalid topic", func(e *outbox.Event) { e.Topic = "bad topic" }, "Topic"},
		{"reserved header", func(e *outbox.Event) { e.Headers = map[string]string{"X-Event-ID": "forged"} }, "Headers"},
		{"traceparent header", func(e *outbox.Event) { e.Headers = map[string]string{"traceparent": "x"} }, "Headers"},
		{"too many headers", func(e *outbox.Event) { e.Headers = map[string]string{"a": "1", "b": "2", "c": "3"} }, "Headers"},
		{"oversized header", func(e *outbox.Event) { e.Headers = map[string]string{"a": strings.Repeat("v", 30)} }, "Headers"},
		{"invalid utf8 key", func(e *outbox.Event) { e.Key = "\xff" }, "Key"},
		{"NUL escape in raw JSON", func(e *outbox.Event) { e.Payload = json.RawMessage(`"a\u0000b"`) }, "Payload"},
		{"NUL in a Go string", func(e *outbox.Event) { e.Payload = "a\x00b" }, "Payload"},
		{"invalid UTF-8 in raw JSON", func(e *outbox.Event) { e.Payload = json.RawMessage("\"\xff\"") }, "Payload"},
		{"lone surrogate", func(e *outbox.Event) { e.Payload = json.RawMessage(`"\ud800"`) }, "Payload"},
		{"number over numeric's range", func(e *outbox.Event) { e.Payload = json.RawMessage(`1e131072`) }, "Payload"},
		{"payload expanding over the limit", func(e *outbox.Event) { e.Payload = json.RawMessage(`[1e200]`) }, "Payload"},
		{"float expanding over the limit", func(e *outbox.Event) { e.Payload = 1e300 }, "Payload"},
		{"long type", func(e *outbox.Event) { e.Type = strings.Repeat("t", 256) }, "Type"},
		{"long aggregate type", func(e *outbox.Event) { e.AggregateType = strings.Repeat("a", 256) }, "AggregateType"},
		{"long aggregate id", func(e *outbox.Event) { e.AggregateID = strings.Repeat("i", 1025) }, "AggregateID"},
		{"long key", func(e *outbox.Event) { e.Key = strings.Repeat("k", 1025) }, "Key"},
		{"NUL in type", func(e *outbox.Event) { e.Type = "order.\x00" }, "Type"},
	}
	for _, c := range cases {
		e := valid()
		c.edit(&e)
		_, err := record.Prepare(e, "svc", nil, limits, nil)
		var ee *outbox.EventError
		if !errors.Is(err, outbox.ErrInvalidEvent) || !errors.As(err, &ee) || ee.Field != c.field {
			t.Errorf("%s: err = %v, want an EventError on field %s", c.name, err, c.field)
			continue
		}
		if !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: message %q does not name %s", c.name, err, c.field)
		}
	}
	// Nil payload is JSON null, not an error.
	e := valid()
	e.Payload = nil
	if r, err := record.Prepare(e, "svc", nil, limits, nil); err != nil || string(r.Payload) != "null" {
		t.Errorf("nil payload: %q, %v", r.Payload, err)
	}
}

// The record Prepare sizes is the one the relay builds: key, payload as
// jsonb prints it, the event's headers, x-event-id (36), x-event-type, the
// relay's own traceparent (55) and the stored tracestate, each header with
// 10 bytes of length fields, 36 bytes of record fields and a 61-byte batch
// header. Counted here by hand.
func TestPrepareRecordSize(t *testing.T) {
	e := valid()
	e.Headers = map[string]string{"tenant": "t1"}
	trace := map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "a=b"}
	payload := len(`{"total": 42}`)
	headers := len("x-event-id") + 36 + len("x-event-type") + len(e.Type) + len("traceparent") + 55 + len("tenant") + len("t1") + len("tracestate") + len("a=b")
	want := 61 + 36 + len(e.AggregateID) + payload + 5*10 + headers
	if got := record.Bytes(len(e.AggregateID), payload, 5, headers); got != want {
		t.Fatalf("RecordBytes = %d, want %d", got, want)
	}
	r, err := record.Prepare(e, "svc", nil, outbox.Limits{MaxRecordBytes: want}, trace)
	if err != nil || r.PayloadBytes != payload {
		t.Fatalf("at the limit: PayloadBytes %d, %v", r.PayloadBytes, err)
	}
	_, err = record.Prepare(e, "svc", nil, outbox.Limits{MaxRecordBytes: want - 1}, trace)
	var ee *outbox.EventError
	if !errors.As(err, &ee) || ee.Field != "Headers" || !strings.Contains(err.Error(), "MaxRecordBytes") {
		t.Errorf("one byte over: %v, want an EventError on Headers (the larger part) naming MaxRecordBytes", err)
	}
	// Without a stored trace context the relay's span still sends a
	// traceparent: only the tracestate header is not counted.
	noTrace := want - len("tracestate") - len("a=b") - 10
	if _, err := record.Prepare(e, "svc", nil, outbox.Limits{MaxRecordBytes: noTrace}, nil); err != nil {
		t.Errorf("without trace context: %v", err)
	}
	if _, err := record.Prepare(e, "svc", nil, outbox.Limits{MaxRecordBytes: noTrace - 1}, nil); err == nil {
		t.Error("without trace context, one byte over: accepted")
	}
	// A large payload is named as the culprit.
	e.Payload = strings.Repeat("x", 1000)
	if _, err = record.Prepare(e, "svc", nil, outbox.Limits{MaxRecordBytes: 1000}, trace); !errors.As(err, &ee) || ee.Field != "Payload" {
		t.Errorf("large payload over the record limit: %v, want an EventError on Payload", err)
	}
}

// An EventError prints the Type quoted and cut: a long Type with control
// bytes never reaches a log line as it is; neither does a bad header name
// or topic.
func TestEventErrorQuotesValues(t *testing.T) {
	long := "order.\x00\x1b[31m" + strings.Repeat("x", 1<<20)
	for _, c := range []outbox.Event{
		{AggregateType: "order", AggregateID: "o-1", Type: long},
		{AggregateType: "order", AggregateID: "o-1", Type: "\x00" + strings.Repeat("y", 100), Payload: json.RawMessage("{")},
		{AggregateType: "order", AggregateID: "o-1", Type: "t", Headers: map[string]string{"\xff\n" + strings.Repeat("h", 3000): "v"}},
		{AggregateType: "order", AggregateID: "o-1", Type: "t", Topic: "bad\r\n" + strings.Repeat("t", 1<<20)},
		{AggregateType: "order", AggregateID: "o-1", Type: "t", Payload: badMarshaler{}},
	} {
		_, err := record.Prepare(c, "svc", nil, outbox.Limits{MaxHeaderBytes: 1 << 20}, nil)
		if err == nil {
			t.Fatalf("Prepare accepted %.40q", c.Type)
		}
		msg := err.Error()
		if len(msg) > 400 || strings.ContainsFunc(msg, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			t.Errorf("message of %d bytes, or with control bytes: %.400q", len(msg), msg)
		}
	}
	err := &outbox.EventError{Type: long, Field: "Type", Reason: "is bad"}
	if msg := err.Error(); !strings.Contains(msg, `(type "order.\x00\x1b[31mxxx`) || !strings.Contains(msg, "(1048588 bytes)") {
		t.Errorf("Error() = %.200q, want the Type quoted, cut and its length", msg)
	}
}

// badMarshaler fails with a long message full of control bytes.
type badMarshaler struct{}

func (badMarshaler) MarshalJSON() ([]byte, error) {
	return nil, errors.New("\x1b[2J" + strings.Repeat("\x00boom", 1000))
}

// With CloudEvents binary mode in the writer's limits, the record size
// counts the six headers the relay adds: their names, the values the relay
// sends (ce_time at its widest, 30 bytes) and each header's overhead. The
// same event is accepted at exactly that many bytes more and refused one
// byte below.
func TestPrepareCountsCloudEventsHeaders(t *testing.T) {
	e := valid()
	trace := map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	off := 61 + 36 + len(e.AggregateID) + len(`{"total": 42}`) + 3*10 +
		len("x-event-id") + 36 + len("x-event-type") + len(e.Type) + len("traceparent") + 55
	if _, err := record.Prepare(e, "svc", nil, outbox.Limits{MaxRecordBytes: off}, trace); err != nil {
		t.Fatalf("without CloudEvents, at the limit: %v", err)
	}
	source := "/order-service"
	ce := 6*10 + len("ce_specversion") + len("1.0") + len("ce_id") + 36 + len("ce_source") + len(source) +
		len("ce_type") + len(e.Type) + len("ce_time") + len("2006-01-02T15:04:05.999999999Z") + len("content-type") + len("application/json")
	binary := outbox.CloudEvents{Mode: outbox.CloudEventsBinary, Source: source}
	if _, err := record.Prepare(e, "svc", nil, outbox.Limits{MaxRecordBytes: off + ce, CloudEvents: binary}, trace); err != nil {
		t.Fatalf("with CloudEvents, at the limit: %v", err)
	}
	_, err := record.Prepare(e, "svc", nil, outbox.Limits{MaxRecordBytes: off + ce - 1, CloudEvents: binary}, trace)
	var ee *outbox.EventError
	if !errors.As(err, &ee) || !strings.Contains(err.Error(), "MaxRecordBytes") {
		t.Errorf("with CloudEvents, one byte over: %v, want an EventError naming MaxRecordBytes", err)
	}
}

// In binary mode an event may not set the headers the relay sets (any
// case); other ce_ headers, extensions such as ce_subject, it may. With
// CloudEvents off, every one of them is the event's own.
func TestPrepareCloudEventsHeaderNames(t *testing.T) {
	binary := outbox.Limits{CloudEvents: outbox.CloudEvents{Mode: outbox.CloudEventsBinary, Source: "/svc"}}
	for _, name := range []string{"ce_id", "CE_ID", "ce_source", "ce_specversion", "ce_type", "ce_time", "content-type", "Content-Type"} {
		e := valid()
		e.Headers = map[string]string{name: "mine"}
		_, err := record.Prepare(e, "svc", nil, binary, nil)
		var ee *outbox.EventError
		if !errors.As(err, &ee) || ee.Field != "Headers" || !strings.Contains(err.Error(), "CloudEvents binary mode") {
			t.Errorf("header %q in binary mode: %v, want an EventError on Headers", name, err)
		}
		if _, err := record.Prepare(e, "svc", nil, outbox.Limits{}, nil); err != nil {
			t.Errorf("header %q with CloudEvents off: %v", name, err)
		}
	}
	e := valid()
	e.Headers = map[string]string{"ce_subject": "o-1", "ce_tenant": "acme"}
	if _, err := record.Prepare(e, "svc", nil, binary, nil); err != nil {
		t.Errorf("extension headers in binary mode: %v", err)
	}
}
