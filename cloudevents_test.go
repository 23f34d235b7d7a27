package outbox_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/fxoutbox/outbox"
)

func TestLimitsValidateCloudEvents(t *testing.T) {
	for _, c := range []struct {
		ce    outbox.CloudEvents
		field string
	}{
		{outbox.CloudEvents{Mode: -1}, "Limits.CloudEvents.Mode"},
		{outbox.CloudEvents{Mode: outbox.CloudEventsBinary}, "Limits.CloudEvents.Source"},
		{outbox.CloudEvents{Mode: outbox.CloudEventsBinary, Source: "/a\tb"}, "Limits.CloudEvents.Source"},
	} {
		err := outbox.Limits{MaxRecordBytes: 1 << 20, MaxPayloadBytes: 1 << 20, CloudEvents: c.ce}.Validate()
		var ce *outbox.ConfigError
		if !errors.As(err, &ce) || ce.Field != c.field || !strings.Contains(err.Error(), "OUTBOX_CLOUDEVENTS") {
			t.Errorf("Validate(%+v) = %v, want a ConfigError on %s naming the variable", c.ce, err, c.field)
		}
	}
	if err := (outbox.Limits{CloudEvents: outbox.CloudEvents{Mode: outbox.CloudEventsBinary, Source: "/svc"}}).Validate(); err != nil {
		t.Errorf("valid CloudEvents refused: %v", err)
	}
	if s := outbox.CloudEventsBinary.String(); s != "binary" {
		t.Errorf("String() = %q", s)
	}
}
