package record

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/fxoutbox/outbox"
)

// The CloudEvents headers are the binding's six in binary mode and none
// otherwise, each one a header CloudEventsHeader names; the ce_time that
// Prepare counts is at least as wide as any the relay sends.
func TestCloudEventsHeaders(t *testing.T) {
	c := outbox.CloudEvents{Mode: outbox.CloudEventsBinary, Source: "/orders"}
	id := uuid.New().String()
	created := time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.FixedZone("x", 3600))
	got := map[string]string{}
	for k, v := range CloudEventsHeaders(c, id, "order.placed.v1", CloudEventsTime(created)) {
		if !CloudEventsHeader(k) {
			t.Errorf("%s is sent but CloudEventsHeader says the event may set it", k)
		}
		got[k] = v
	}
	want := map[string]string{
		outbox.HeaderCloudEventsSpecVersion: "1.0", outbox.HeaderCloudEventsID: id, outbox.HeaderCloudEventsSource: "/orders",
		outbox.HeaderCloudEventsType: "order.placed.v1", outbox.HeaderCloudEventsTime: "9999-12-31T22:59:59.999999999Z",
		outbox.HeaderContentType: "application/json",
	}
	if len(got) != len(want) {
		t.Errorf("headers %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	if n := len(CloudEventsTime(created)); n > len(widestCloudEventsTime) {
		t.Errorf("ce_time of %d bytes, wider than the %d Prepare counts", n, len(widestCloudEventsTime))
	}
	for range CloudEventsHeaders(outbox.CloudEvents{Source: "/orders"}, id, "t", "x") {
		t.Error("headers sent with CloudEvents off")
	}
	if !ReservedHeader("X-Event-ID") || !ReservedHeader("traceparent") || ReservedHeader("ce_id") {
		t.Error("ReservedHeader names the outbox's own headers, case-insensitively, and only those")
	}
}
