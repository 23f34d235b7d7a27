package fxoutbox

import (
	"errors"
	"testing"
	"time"

	"github.com/fxoutbox/outbox"
)

func TestInboxConfigFromEnv(t *testing.T) {
	env := map[string]string{
		"OUTBOX_INBOX_GROUP": "billing", "OUTBOX_INBOX_NAME": "billing-v2", "OUTBOX_INBOX_BROKERS": "k1:9092, k2:9092",
		"OUTBOX_INBOX_SCHEMA": "app", "OUTBOX_INBOX_TABLE": "inbox", "OUTBOX_INBOX_CONCURRENCY": "8", "OUTBOX_INBOX_BATCH_SIZE": "20", "OUTBOX_INBOX_DEAD_LETTER_TOPIC": "billing.dlq", "OUTBOX_INBOX_MAX_ATTEMPTS": "3",
		"OUTBOX_INBOX_POISON": "hold", "OUTBOX_INBOX_IDENTITY": "event-id-or-position", "OUTBOX_INBOX_PARK_UNROUTED": "on",
		"OUTBOX_INBOX_MIN_BACKOFF": "50ms", "OUTBOX_INBOX_MAX_BACKOFF": "10s", "OUTBOX_INBOX_TRY_TIMEOUT": "20s",
		"OUTBOX_INBOX_DRAIN_TIMEOUT": "3s", "OUTBOX_INBOX_RETENTION": "forever", "OUTBOX_INBOX_CLEANUP_INTERVAL": "1m", "OUTBOX_INBOX_MIGRATE": "true",
	}
	var environ []string
	for k, v := range env {
		environ = append(environ, k+"="+v)
	}
	ic, err := inboxConfigFrom(func(k string) (string, bool) { v, ok := env[k]; return v, ok }, environ...)
	if err != nil {
		t.Fatal(err)
	}
	c := ic.Consumer
	if c.Group != "billing" || c.Name != "billing-v2" || len(c.Brokers) != 2 || c.Table != (outbox.Table{Schema: "app", Name: "inbox"}) ||
		c.Concurrency != 8 || c.BatchSize != 20 || c.DeadLetterTopic != "billing.dlq" || c.MaxAttempts != 3 || c.Poison != outbox.Hold || c.Identity == nil || !c.ParkUnrouted ||
		c.MinBackoff != 50*time.Millisecond || c.MaxBackoff != 10*time.Second || c.TryTimeout != 20*time.Second ||
		c.DrainTimeout != 3*time.Second || c.Retention >= 0 || c.CleanupInterval != time.Minute || !ic.Migrate {
		t.Errorf("InboxConfig = %+v", ic)
	}
	// The relay's loader knows the inbox's variables: no warning.
	cfg, err := configFrom(func(k string) (string, bool) { v, ok := env[k]; return v, ok }, environ...)
	if err != nil || len(warningsOf(cfg)) != 0 {
		t.Errorf("ConfigFromEnv with the inbox's variables: %v, warnings %v", err, warningsOf(cfg))
	}
	for k, v := range map[string]string{
		"OUTBOX_INBOX_CONCURRENCY": "-1", "OUTBOX_INBOX_POISON": "drop", "OUTBOX_INBOX_IDENTITY": "offset", "OUTBOX_INBOX_RETENTION": "1 week",
		"OUTBOX_INBOX_MIN_BACKOFF": "fast", "OUTBOX_INBOX_MIGRATE": "maybe", "OUTBOX_INBOX_BROKERS": "no-port", "OUTBOX_INBOX_PARK_UNROUTED": "sometimes",
	} {
		_, err := inboxConfigFrom(func(name string) (string, bool) { return v, name == k })
		var ce *outbox.ConfigError
		if !errors.As(err, &ce) || ce.Field != k {
			t.Errorf("%s=%q: %v, want a ConfigError naming it", k, v, err)
		}
	}
	_, err = inboxConfigFrom(func(string) (string, bool) { return "", false }, "OUTBOX_INBOX_CONCURENCY=4")
	var ce *outbox.ConfigError
	if !errors.As(err, &ce) {
		t.Errorf("a typo of OUTBOX_INBOX_CONCURRENCY: %v, want a ConfigError", err)
	}
}
