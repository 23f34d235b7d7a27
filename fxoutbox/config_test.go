package fxoutbox

import (
	"errors"
	"github.com/fxoutbox/outbox/unitofwork"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/relay"
)

func TestConfigFromEnv(t *testing.T) {
	env := map[string]string{
		"OUTBOX_SERVICE":              "order-service",
		"OUTBOX_SCHEMA":               "app",
		"OUTBOX_TABLE":                "events",
		"OUTBOX_TOPIC_NAMING":         "per-aggregate",
		"OUTBOX_MIGRATE":              "on", // as OUTBOX_NOTIFY=off: on/off and true/false both
		"KAFKA_BROKERS":               "a:9092, b:9092,",
		"KAFKA_CLIENT_ID":             "orders",
		"KAFKA_VERSION":               "3.7.0",
		"OUTBOX_POLL_INTERVAL":        "100ms",
		"OUTBOX_BATCH_SIZE":           "200",
		"OUTBOX_MAX_BATCH_SIZE":       "2000",
		"OUTBOX_WORKERS":              "2",
		"OUTBOX_SYNCHRONOUS_COMMIT":   "on",
		"OUTBOX_RELAY":                "off",
		"OUTBOX_NOTIFY":               "off",
		"OUTBOX_NOTIFY_INTERVAL":      "20ms",
		"OUTBOX_ORDERING":             "unordered",
		"OUTBOX_LANES":                "128",
		"OUTBOX_RETENTION":            "forever",
		"OUTBOX_MAX_ATTEMPTS":         "9",
		"OUTBOX_POISON":               "hold",
		"OUTBOX_RELAY_MODE":           "stream",
		"OUTBOX_STREAM_SLOT":          "app_slot",
		"OUTBOX_STREAM_PUBLICATION":   "app_pub",
		"OUTBOX_STREAM_MAX_LAG":       "10s",
		"OUTBOX_STREAM_MAX_LAG_BYTES": "1000000",
	}
	c, err := configFrom(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatal(err)
	}
	if c.Writer.Service != "order-service" || c.Table != (outbox.Table{Schema: "app", Name: "events"}) || !c.Migrate ||
		!reflect.DeepEqual(c.Brokers, []string{"a:9092", "b:9092"}) || c.Relay.PollInterval != 100*time.Millisecond ||
		c.Relay.BatchSize != 200 || c.Relay.MaxBatchSize != 2000 || c.Relay.Workers != 2 || !c.Relay.SynchronousCommit || !c.DisableRelay || !c.DisableNotify || c.DisableListen || c.Relay.Ordering != relay.Unordered ||
		c.Relay.Lanes != 128 || c.Relay.Retention >= 0 || c.Relay.MaxAttempts != 9 || c.Relay.Poison != outbox.Hold || c.Sarama == nil || c.Sarama.ClientID != "orders" || c.Sarama.Version.String() != "3.7.0" {
		t.Errorf("config = %+v", c)
	}
	if c.NotifyInterval != 20*time.Millisecond {
		t.Errorf("NotifyInterval = %v, want 20ms", c.NotifyInterval)
	}
	// The one default, as the settings page (from the field's comment) states it.
	if doc, err := os.ReadFile("../docs/configuration.md"); err != nil {
		t.Fatal(err)
	} else if i := strings.Index(string(doc), "| `OUTBOX_NOTIFY_INTERVAL` |"); i < 0 {
		t.Error("docs/configuration.md has no row for OUTBOX_NOTIFY_INTERVAL")
	} else if row := append(strings.Split(strings.SplitN(string(doc[i:]), "\n", 2)[0], " | "), "", "", "", ""); !strings.HasPrefix(row[3], unitofwork.DefaultNotifyInterval.String()) {
		t.Errorf("the settings page's default for OUTBOX_NOTIFY_INTERVAL is %q, want %v (unitofwork.DefaultNotifyInterval)", row[3], unitofwork.DefaultNotifyInterval)
	}
	if _, err := (Config{NotifyInterval: -time.Millisecond, Writer: unitofwork.Config{Service: "svc"}}).UnitOfWork(); !errors.Is(err, outbox.ErrInvalidConfig) || !strings.Contains(err.Error(), "OUTBOX_NOTIFY_INTERVAL") {
		t.Errorf("a negative NotifyInterval: %v, want a ConfigError naming OUTBOX_NOTIFY_INTERVAL", err)
	}
	if c.Relay.Mode != relay.Stream || c.Relay.Stream != (relay.StreamConfig{MaxLag: 10 * time.Second, MaxLagBytes: 1000000}) {
		t.Errorf("stream settings: mode %v, %+v", c.Relay.Mode, c.Relay.Stream)
	}
	if topic, _ := c.Writer.Topics("svc", outbox.Event{AggregateType: "Order", Type: "order.created"}); topic != "svc.order" {
		t.Errorf("per-aggregate naming not applied: %s", topic)
	}
	for k, v := range map[string]string{
		"OUTBOX_POLL_INTERVAL": "soon", "OUTBOX_BATCH_SIZE": "-1", "OUTBOX_MIGRATE": "maybe",
		"OUTBOX_TOPIC_NAMING": "random", "KAFKA_VERSION": "latest", "OUTBOX_TABLE": "x;y", "OUTBOX_SCHEMA": "a b", "OUTBOX_RELAY": "sometimes",
		"OUTBOX_ORDERING": "random", "OUTBOX_LANES": "x", "OUTBOX_RETENTION": "-1h", "OUTBOX_LISTEN": "nah", "OUTBOX_MAX_ATTEMPTS": "0", "OUTBOX_POISON": "drop",
		"OUTBOX_MAX_BATCH_SIZE": "lots", "OUTBOX_SYNCHRONOUS_COMMIT": "sometimes", "OUTBOX_NOTIFY_INTERVAL": "often",
		"OUTBOX_RELAY_MODE": "cdc", "OUTBOX_STREAM_MAX_LAG": "-1s", "OUTBOX_STREAM_MAX_LAG_BYTES": "1GB",
	} {
		_, err := configFrom(func(name string) (string, bool) { return v, name == k })
		var ce *outbox.ConfigError
		if !errors.As(err, &ce) || !errors.Is(err, outbox.ErrInvalidConfig) {
			t.Errorf("%s=%q: err = %v, want a ConfigError", k, v, err)
		} else if ce.Field != k {
			t.Errorf("%s=%q: error names %s", k, v, ce.Field)
		}
	}
}

// The one size setting: OUTBOX_MAX_RECORD_BYTES reaches the writers'
// limits; a sarama configuration that changed Producer.MaxMessageBytes sets
// it when it is unset and must agree with it otherwise; the old
// OUTBOX_MAX_PAYLOAD_BYTES still caps the payload but cannot exceed the
// record.
func TestOneRecordSizeSetting(t *testing.T) {
	env := map[string]string{"OUTBOX_MAX_RECORD_BYTES": "500000", "OUTBOX_MAX_PAYLOAD_BYTES": "100000", "OUTBOX_MAX_TYPE_BYTES": "64",
		"OUTBOX_MAX_AGGREGATE_TYPE_BYTES": "65", "OUTBOX_MAX_AGGREGATE_ID_BYTES": "66", "OUTBOX_MAX_KEY_BYTES": "67",
		"OUTBOX_MAX_HEADERS": "3", "OUTBOX_MAX_HEADER_BYTES": "68"}
	c, err := configFrom(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatal(err)
	}
	c, err = c.WithDefaults()
	want := outbox.Limits{MaxRecordBytes: 500000, MaxPayloadBytes: 100000, MaxTypeBytes: 64, MaxAggregateTypeBytes: 65,
		MaxAggregateIDBytes: 66, MaxKeyBytes: 67, MaxHeaders: 3, MaxHeaderBytes: 68}
	if err != nil || c.Writer.Limits != want {
		t.Errorf("limits = %+v, %v; want %+v", c.Writer.Limits, err, want)
	}

	if c, err := (Config{}).WithDefaults(); err != nil || c.Writer.Limits.MaxRecordBytes != outbox.DefaultMaxRecordBytes || c.Writer.Limits.MaxPayloadBytes != outbox.DefaultMaxRecordBytes {
		t.Errorf("default limits = %+v, %v", c.Writer.Limits, err)
	}
	sc := relay.DefaultSaramaConfig()
	sc.Producer.MaxMessageBytes = 2 << 20
	if c, err := (Config{Sarama: sc}).WithDefaults(); err != nil || c.Writer.Limits.MaxRecordBytes != 2<<20 {
		t.Errorf("sarama's MaxMessageBytes not adopted: %+v, %v", c.Writer.Limits, err)
	}
	for _, bad := range []Config{
		{Sarama: sc, Writer: unitofwork.Config{Limits: outbox.Limits{MaxRecordBytes: 1 << 20}}},
		{Writer: unitofwork.Config{Limits: outbox.Limits{MaxPayloadBytes: 2 << 20}}},
	} {
		if _, err := bad.WithDefaults(); !errors.Is(err, outbox.ErrInvalidConfig) || !strings.Contains(err.Error(), "MaxRecordBytes") {
			t.Errorf("withDefaults(%+v) = %v, want a ConfigError naming MaxRecordBytes", bad.Writer.Limits, err)
		}
	}
}

// Variables of other tools (and of this project's test harness) are
// warnings, those of its scripts (OUTBOX_PG_PORT, KAFKA_HEAP_OPTS) nothing;
// typos of a setting are errors naming the setting.
func TestUnknownVariables(t *testing.T) {
	env := []string{"OUTBOX_TEST_REQUIRE=1", "OUTBOX_TEST_REAL_KAFKA=1", "OUTBOX_TEST_ORDERING=x", "OUTBOX_FAULTTEST_KILLS=3",
		"OUTBOX_FAULTTEST_PG_PORT=1", "OUTBOX_SOAK_EVENTS=1", "OUTBOX_SOAK_RATE=1", "OUTBOX_PG_PORT=1",
		"KAFKA_OPTS=-Xmx1g", "KAFKA_HEAP_OPTS=-Xmx1g", "KAFKA_CONSUMER_GROUP=g", "PATH=/bin", "OUTBOX_SERVICE=svc"}
	lookup := func(k string) (string, bool) {
		for _, kv := range env {
			if name, v, _ := strings.Cut(kv, "="); name == k {
				return v, true
			}
		}
		return "", false
	}
	c, err := configFrom(lookup, env...)
	if err != nil {
		t.Fatalf("configFrom = %v, want only warnings", err)
	}
	if len(warningsOf(c)) != 9 || strings.Contains(strings.Join(warningsOf(c), " "), "OUTBOX_PG_PORT") || strings.Contains(strings.Join(warningsOf(c), " "), "KAFKA_HEAP_OPTS") {
		t.Errorf("warnings = %q, want one per unknown OUTBOX_/KAFKA_ variable but the scripts' (9)", warningsOf(c))
	}
	for typo, want := range map[string]string{
		"OUTBOX_BATCHSIZE": "OUTBOX_BATCH_SIZE", "OUTBOX_POLL_INTERVALL": "OUTBOX_POLL_INTERVAL", "outbox_service": "",
		"KAFKA_BROKER": "KAFKA_BROKERS", "OUTBOX_MAX_ATTEMTPS": "OUTBOX_MAX_ATTEMPTS", "OUTBOX_TOPIC": "OUTBOX_TOPICS",
	} {
		_, err := configFrom(lookup, append(env, typo+"=1")...)
		if want == "" {
			if err != nil {
				t.Errorf("%s: %v, want no error (not an OUTBOX_ variable)", typo, err)
			}
			continue
		}
		if !errors.Is(err, outbox.ErrInvalidConfig) || !strings.Contains(err.Error(), typo) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error naming it and %s", typo, err, want)
		}
	}
}
