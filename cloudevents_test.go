package outbox_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/fxoutbox/outbox"
)

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
	if _, err := outbox.Prepare(e, "svc", nil, outbox.Limits{MaxRecordBytes: off}, trace); err != nil {
		t.Fatalf("without CloudEvents, at the limit: %v", err)
	}
	source := "/order-service"
	ce := 6*10 + len("ce_specversion") + len("1.0") + len("ce_id") + 36 + len("ce_source") + len(source) +
		len("ce_type") + len(e.Type) + len("ce_time") + len("2006-01-02T15:04:05.999999999Z") + len("content-type") + len("application/json")
	binary := outbox.CloudEvents{Mode: outbox.CloudEventsBinary, Source: source}
	if _, err := outbox.Prepare(e, "svc", nil, outbox.Limits{MaxRecordBytes: off + ce, CloudEvents: binary}, trace); err != nil {
		t.Fatalf("with CloudEvents, at the limit: %v", err)
	}
	_, err := outbox.Prepare(e, "svc", nil, outbox.Limits{MaxRecordBytes: off + ce - 1, CloudEvents: binary}, trace)
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
		_, err := outbox.Prepare(e, "svc", nil, binary, nil)
		var ee *outbox.EventError
		if !errors.As(err, &ee) || ee.Field != "Headers" || !strings.Contains(err.Error(), "CloudEvents binary mode") {
			t.Errorf("header %q in binary mode: %v, want an EventError on Headers", name, err)
		}
		if _, err := outbox.Prepare(e, "svc", nil, outbox.Limits{}, nil); err != nil {
			t.Errorf("header %q with CloudEvents off: %v", name, err)
		}
	}
	e := valid()
	e.Headers = map[string]string{"ce_subject": "o-1", "ce_tenant": "acme"}
	if _, err := outbox.Prepare(e, "svc", nil, binary, nil); err != nil {
		t.Errorf("extension headers in binary mode: %v", err)
	}
}

func TestLimitsValidateCloudEvents(t *testing.T) {
	for _, c := range []struct {
		ce    outbox.CloudEvents
		field string
	}{
		{outbox.CloudEvents{Mode: -1}, "Limits.CloudEvents.Mode"},
		{outbox.CloudEvents{Mode: outbox.CloudEventsBinary}, "Limits.CloudEvents.Source"},
		{outbox.CloudEvents{Mode: outbox.CloudEventsBinary, Source: "/a\tb"}, "Limits.CloudEvents.Source"},
	} {
		err := outbox.Limits{CloudEvents: c.ce}.WithDefaults().Validate()
		var ce *outbox.ConfigError
		if !errors.As(err, &ce) || ce.Field != c.field || !strings.Contains(err.Error(), "OUTBOX_CLOUDEVENTS") {
			t.Errorf("Validate(%+v) = %v, want a ConfigError on %s naming the variable", c.ce, err, c.field)
		}
	}
	if err := (outbox.Limits{CloudEvents: outbox.CloudEvents{Mode: outbox.CloudEventsBinary, Source: "/svc"}}).WithDefaults().Validate(); err != nil {
		t.Errorf("valid CloudEvents refused: %v", err)
	}
	if s := outbox.CloudEventsBinary.String(); s != "binary" {
		t.Errorf("String() = %q", s)
	}
}
