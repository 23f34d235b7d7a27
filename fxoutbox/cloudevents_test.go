package fxoutbox

import (
	"errors"
	"strings"
	"testing"

	"github.com/fxoutbox/outbox"
)

// OUTBOX_CLOUDEVENTS and OUTBOX_CLOUDEVENTS_SOURCE set Config.CloudEvents;
// the source defaults to "/<service>", and the writers' limits get the same
// setting, so that they count the headers the relay adds.
func TestCloudEventsConfig(t *testing.T) {
	env := map[string]string{"OUTBOX_SERVICE": "order-service", "OUTBOX_CLOUDEVENTS": "Binary"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	c, err := configFrom(lookup)
	if err != nil {
		t.Fatal(err)
	}
	if c, err = c.withDefaults(); err != nil {
		t.Fatal(err)
	}
	want := outbox.CloudEvents{Mode: outbox.CloudEventsBinary, Source: "/order-service"}
	if c.CloudEvents != want || c.Limits.CloudEvents != want {
		t.Errorf("CloudEvents %+v, Limits.CloudEvents %+v; want both %+v", c.CloudEvents, c.Limits.CloudEvents, want)
	}
	env["OUTBOX_CLOUDEVENTS_SOURCE"] = "urn:acme:orders"
	if c, err = configFrom(lookup); err == nil {
		c, err = c.withDefaults()
	}
	if err != nil || c.CloudEvents.Source != "urn:acme:orders" || c.Limits.CloudEvents.Source != "urn:acme:orders" {
		t.Errorf("source from OUTBOX_CLOUDEVENTS_SOURCE: %+v, %v", c.CloudEvents, err)
	}
	if c, err := (Config{}).withDefaults(); err != nil || c.CloudEvents != (outbox.CloudEvents{}) || c.Limits.CloudEvents != (outbox.CloudEvents{}) {
		t.Errorf("default: %+v, %+v, %v; want off", c.CloudEvents, c.Limits.CloudEvents, err)
	}

	env = map[string]string{"OUTBOX_CLOUDEVENTS": "structured"}
	if _, err := configFrom(lookup); !errors.Is(err, outbox.ErrInvalidConfig) || !strings.Contains(err.Error(), "OUTBOX_CLOUDEVENTS") {
		t.Errorf("OUTBOX_CLOUDEVENTS=structured: %v, want a ConfigError naming the variable", err)
	}
	for _, bad := range []Config{
		{CloudEvents: outbox.CloudEvents{Mode: outbox.CloudEventsBinary}, Topics: ExplicitTopics}, // no service for the default source
		{Service: "svc", CloudEvents: outbox.CloudEvents{Mode: outbox.CloudEventsBinary, Source: "a b"}},
		{Service: "svc", CloudEvents: outbox.CloudEvents{Mode: 9}},
		{Service: "svc", CloudEvents: outbox.CloudEvents{Mode: outbox.CloudEventsBinary},
			Limits: outbox.Limits{CloudEvents: outbox.CloudEvents{Mode: outbox.CloudEventsBinary, Source: "/other"}}},
	} {
		if _, err := bad.withDefaults(); !errors.Is(err, outbox.ErrInvalidConfig) || !strings.Contains(err.Error(), "CloudEvents") {
			t.Errorf("withDefaults(%+v) = %v, want a ConfigError on CloudEvents", bad.CloudEvents, err)
		}
	}
}
