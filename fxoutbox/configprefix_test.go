package fxoutbox

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.uber.org/fx"

	"github.com/fxoutbox/outbox"
)

// envList serves configFromPrefix from a list of NAME=value.
func envList(env []string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		for _, kv := range env {
			if name, v, _ := strings.Cut(kv, "="); name == k {
				return v, true
			}
		}
		return "", false
	}
}

// A second outbox reads its own OUTBOX_ settings under its prefix, never
// the first one's, and shares the Kafka settings unless it sets its own.
func TestConfigFromEnvPrefix(t *testing.T) {
	env := []string{
		"OUTBOX_SERVICE=payment-service", "OUTBOX_POLL_INTERVAL=1s", "OUTBOX_TOPIC_NAMING=per-aggregate",
		"KAFKA_BROKERS=a:9092", "KAFKA_CLIENT_ID=payments",
		"AUDIT_OUTBOX_SERVICE=audit", "AUDIT_OUTBOX_TABLE=audit_outbox", "AUDIT_OUTBOX_BATCH_SIZE=20", "AUDIT_OUTBOX_MAX_TYPE_BYTES=40",
	}
	c, err := configFromPrefix("AUDIT_", envList(env), env...)
	if err != nil {
		t.Fatal(err)
	}
	if c.Writer.Service != "audit" || c.Table != (outbox.Table{Name: "audit_outbox"}) || c.Relay.BatchSize != 20 || c.Writer.Limits.MaxTypeBytes != 40 {
		t.Errorf("prefixed settings not read: %+v", c)
	}
	if c.Relay.PollInterval != 0 || c.Writer.Topics != nil {
		t.Errorf("the unprefixed OUTBOX_ settings leaked into the prefixed outbox: poll %v, topics set %v", c.Relay.PollInterval, c.Writer.Topics != nil)
	}
	if !reflect.DeepEqual(c.Brokers, []string{"a:9092"}) || c.Sarama == nil || c.Sarama.ClientID != "payments" || len(warningsOf(c)) != 0 {
		t.Errorf("shared Kafka settings: brokers %v, sarama %v, warnings %q", c.Brokers, c.Sarama, warningsOf(c))
	}
	uc, err := c.UnitOfWork()
	if err != nil || uc.Service != "audit" || uc.Table.Name != "audit_outbox" || uc.Limits.MaxTypeBytes != 40 || uc.Limits.MaxRecordBytes != outbox.DefaultMaxRecordBytes {
		t.Errorf("UnitOfWork() = %+v, %v", uc, err)
	}
	// The unprefixed read is unchanged and does not see the prefixed variables.
	p, err := configFrom(envList(env), env...)
	if err != nil || p.Writer.Service != "payment-service" || p.Relay.PollInterval != time.Second || len(warningsOf(p)) != 0 {
		t.Errorf("ConfigFromEnv beside a prefixed outbox: %+v, %v, warnings %q", p, err, warningsOf(p))
	}

	// A prefixed KAFKA_ variable: all Kafka settings come from the prefix.
	own := append(env, "AUDIT_KAFKA_BROKERS=b:9092, c:9092", "KAFKA_TLS=on")
	c, err = configFromPrefix("AUDIT_", envList(own), own...)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c.Brokers, []string{"b:9092", "c:9092"}) || c.Sarama != nil || c.KafkaTLS.Enable {
		t.Errorf("own cluster: brokers %v, sarama %v, TLS %v; want only the AUDIT_KAFKA_ settings", c.Brokers, c.Sarama, c.KafkaTLS.Enable)
	}
}

// Errors name the variable as it is set.
func TestConfigFromEnvPrefixErrors(t *testing.T) {
	for _, tc := range []struct {
		set   []string
		field string // the ConfigError's Field
		says  string
	}{
		{[]string{"AUDIT_OUTBOX_BATCH_SIZE=-1"}, "AUDIT_OUTBOX_BATCH_SIZE", "positive"},
		{[]string{"AUDIT_OUTBOX_POLL_INTERVAL=soon"}, "AUDIT_OUTBOX_POLL_INTERVAL", "duration"},
		{[]string{"AUDIT_OUTBOX_SCHEMA=a b"}, "AUDIT_OUTBOX_SCHEMA", ""},
		{[]string{"AUDIT_OUTBOX_TOPIC_NAMING=random"}, "AUDIT_OUTBOX_TOPIC_NAMING", "per-event"},
		{[]string{"AUDIT_KAFKA_BROKERS=kafka"}, "AUDIT_KAFKA_BROKERS", "host:port"},
		{[]string{"KAFKA_BROKERS=kafka"}, "KAFKA_BROKERS", "host:port"}, // shared: named as set
		{[]string{"AUDIT_KAFKA_SASL_MECHANISM=PLAIN", "AUDIT_KAFKA_SASL_USER=u", "AUDIT_KAFKA_SASL_PASSWORD=p"}, "", "AUDIT_KAFKA_SASL_ALLOW_PLAINTEXT"},
		{[]string{"AUDIT_OUTBOX_BATCHSIZE=5"}, "AUDIT_OUTBOX_BATCHSIZE", "did you mean AUDIT_OUTBOX_BATCH_SIZE?"},
		{[]string{"AUDIT_KAFKA_BROKER=a:9092"}, "AUDIT_KAFKA_BROKER", "did you mean AUDIT_KAFKA_BROKERS?"},
	} {
		_, err := configFromPrefix("AUDIT_", envList(tc.set), tc.set...)
		var ce *outbox.ConfigError
		if !errors.As(err, &ce) || !errors.Is(err, outbox.ErrInvalidConfig) {
			t.Errorf("%q: err = %v, want a ConfigError", tc.set, err)
			continue
		}
		if tc.field != "" && ce.Field != tc.field {
			t.Errorf("%q: error names %s, want %s (%v)", tc.set, ce.Field, tc.field, err)
		}
		if !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%q: %v, want it to say %q", tc.set, err, tc.says)
		}
	}
	// Other unknown variables under the prefix are warnings.
	set := []string{"AUDIT_OUTBOX_SOMETHING_ELSE_ENTIRELY=1", "AUDIT_KAFKA_OPTS=x"}
	c, err := configFromPrefix("AUDIT_", envList(set), set...)
	if err != nil || len(warningsOf(c)) != 2 {
		t.Errorf("unknown prefixed variables: %v, warnings %q; want 2 warnings", err, warningsOf(c))
	}
	// Found at start: the service the writer needs.
	_, err = c.UnitOfWork()
	if !errors.Is(err, outbox.ErrInvalidConfig) || !strings.Contains(err.Error(), "AUDIT_OUTBOX_SERVICE") || strings.Contains(err.Error(), " OUTBOX_") {
		t.Errorf("UnitOfWork() without AUDIT_OUTBOX_SERVICE = %v, want an error naming it", err)
	}
	for _, p := range []string{"audit_", "AUDIT", "OUTBOX_AUDIT_", "KAFKA_X_", "A-B_"} {
		if _, err := configFromPrefix(p, envList(nil)); !errors.Is(err, outbox.ErrInvalidConfig) || !strings.Contains(err.Error(), "prefix") {
			t.Errorf("prefix %q: %v, want a ConfigError about the prefix", p, err)
		}
	}
}

// NamedFromEnv fails the application's start with the outbox's name and
// the variable.
func TestNamedFromEnvError(t *testing.T) {
	t.Setenv("AUDIT_OUTBOX_SERVICE", "audit")
	t.Setenv("AUDIT_OUTBOX_LANES", "many")
	err := fx.New(fx.NopLogger, NamedFromEnv("audit", "AUDIT_")).Err()
	if !errors.Is(err, outbox.ErrInvalidConfig) || !strings.Contains(err.Error(), `fxoutbox "audit"`) || !strings.Contains(err.Error(), "AUDIT_OUTBOX_LANES") {
		t.Errorf("NamedFromEnv with a bad variable: %v, want an error naming the outbox and AUDIT_OUTBOX_LANES", err)
	}
}
