package fxoutbox

import (
	"errors"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
	"strings"
	"testing"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/outboxconfig"
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
	if c, err = c.WithDefaults(); err != nil {
		t.Fatal(err)
	}
	want := outbox.CloudEvents{Mode: outbox.CloudEventsBinary, Source: "/order-service"}
	if c.Relay.CloudEvents != want || c.Writer.Limits.CloudEvents != want {
		t.Errorf("CloudEvents %+v, Limits.CloudEvents %+v; want both %+v", c.Relay.CloudEvents, c.Writer.Limits.CloudEvents, want)
	}
	env["OUTBOX_CLOUDEVENTS_SOURCE"] = "urn:acme:orders"
	if c, err = configFrom(lookup); err == nil {
		c, err = c.WithDefaults()
	}
	if err != nil || c.Relay.CloudEvents.Source != "urn:acme:orders" || c.Writer.Limits.CloudEvents.Source != "urn:acme:orders" {
		t.Errorf("source from OUTBOX_CLOUDEVENTS_SOURCE: %+v, %v", c.Relay.CloudEvents, err)
	}
	if c, err := (Config{}).WithDefaults(); err != nil || c.Relay.CloudEvents != (outbox.CloudEvents{}) || c.Writer.Limits.CloudEvents != (outbox.CloudEvents{}) {
		t.Errorf("default: %+v, %+v, %v; want off", c.Relay.CloudEvents, c.Writer.Limits.CloudEvents, err)
	}

	env = map[string]string{"OUTBOX_CLOUDEVENTS": "structured"}
	if _, err := configFrom(lookup); !errors.Is(err, outbox.ErrInvalidConfig) || !strings.Contains(err.Error(), "OUTBOX_CLOUDEVENTS") {
		t.Errorf("OUTBOX_CLOUDEVENTS=structured: %v, want a ConfigError naming the variable", err)
	}
	for _, bad := range []Config{
		{Writer: unitofwork.Config{Topics: outboxconfig.ExplicitTopics}, Relay: relay.Config{CloudEvents: outbox.CloudEvents{Mode: outbox.CloudEventsBinary}}}, // no service for the default source
		{Writer: unitofwork.Config{Service: "svc"}, Relay: relay.Config{CloudEvents: outbox.CloudEvents{Mode: outbox.CloudEventsBinary, Source: "a b"}}},
		{Writer: unitofwork.Config{Service: "svc"}, Relay: relay.Config{CloudEvents: outbox.CloudEvents{Mode: 9}}},
		{Writer: unitofwork.Config{Service: "svc", Limits: outbox.Limits{CloudEvents: outbox.CloudEvents{Mode: outbox.CloudEventsBinary, Source: "/other"}}}, Relay: relay.Config{CloudEvents: outbox.CloudEvents{Mode: outbox.CloudEventsBinary}}},
	} {
		if _, err := bad.WithDefaults(); !errors.Is(err, outbox.ErrInvalidConfig) || !strings.Contains(err.Error(), "CloudEvents") {
			t.Errorf("withDefaults(%+v) = %v, want a ConfigError on CloudEvents", bad.Relay.CloudEvents, err)
		}
	}
}
