package inbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/inbox"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/unitofwork"
)

// Configurations that cannot work are refused by New, naming the field.
func TestConfigRefusals(t *testing.T) {
	pool := testenv.Pool(t)
	h := func(context.Context, unitofwork.Tx, *inbox.Message) error { return nil }
	valid := func() inbox.Config {
		return inbox.Config{Group: "g", Brokers: []string{"127.0.0.1:1"}, Routes: []inbox.Route{{Topic: "t", Handler: h}}}
	}
	saramaDefaults := sarama.NewConfig() // Rebalance.Timeout 60s, Net.ReadTimeout 30s
	for _, tc := range []struct {
		name, field string
		edit        func(*inbox.Config)
	}{
		{"no group", "Group", func(c *inbox.Config) { c.Group = "" }},
		{"no brokers", "Brokers", func(c *inbox.Config) { c.Brokers = nil }},
		{"no routes", "Routes", func(c *inbox.Config) { c.Routes = nil }},
		{"bad topic", "Routes[0].Topic", func(c *inbox.Config) { c.Routes[0].Topic = "a topic" }},
		{"nil handler", "Routes[0].Handler", func(c *inbox.Config) { c.Routes[0].Handler = nil }},
		{"twice", "Routes[1]", func(c *inbox.Config) { c.Routes = append(c.Routes, c.Routes[0]) }},
		{"rebalance timeout not below the read timeout (IBM/sarama#2820)", "Rebalance.Timeout", func(c *inbox.Config) { c.Sarama = saramaDefaults }},
		{"read committed on a protocol without transactions", "Sarama.Version", func(c *inbox.Config) {
			c.Sarama = inbox.DefaultSaramaConfig()
			c.Sarama.Version = sarama.V0_10_2_0
		}},
		{"drain longer than a rebalance", "DrainTimeout", func(c *inbox.Config) { c.DrainTimeout = time.Minute }},
		{"bad table", "Table.Name", func(c *inbox.Config) { c.Table = outbox.Table{Name: "x; drop"} }},
		{"concurrency", "Concurrency", func(c *inbox.Config) { c.Concurrency = -1 }},
		{"poison", "Poison", func(c *inbox.Config) { c.Poison = 7 }},
		{"batch size", "BatchSize", func(c *inbox.Config) { c.BatchSize = 5000 }},
		{"bad dead-letter topic", "DeadLetterTopic", func(c *inbox.Config) { c.DeadLetterTopic = "a dlq" }},
		{"dead letters read back", "DeadLetterTopic", func(c *inbox.Config) { c.DeadLetterTopic = "t" }},
		{"negative batch size", "BatchSize", func(c *inbox.Config) { c.BatchSize = -1 }},
		{"negative max attempts", "MaxAttempts", func(c *inbox.Config) { c.MaxAttempts = -1 }},
		{"negative min backoff", "MinBackoff", func(c *inbox.Config) { c.MinBackoff = -1 }},
		{"negative max backoff", "MaxBackoff", func(c *inbox.Config) { c.MaxBackoff = -1 }},
		{"max backoff below min", "MaxBackoff", func(c *inbox.Config) { c.MinBackoff, c.MaxBackoff = time.Second, time.Millisecond }},
		{"negative try timeout", "TryTimeout", func(c *inbox.Config) { c.TryTimeout = -1 }},
		{"negative drain timeout", "DrainTimeout", func(c *inbox.Config) { c.DrainTimeout = -1 }},
		{"negative cleanup interval", "CleanupInterval", func(c *inbox.Config) { c.CleanupInterval = -1 }},
	} {
		cfg := valid()
		tc.edit(&cfg)
		_, err := inbox.New(pool, nil, &cfg)
		if !errors.Is(err, outbox.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: New = %v, want a config error naming %s", tc.name, err, tc.field)
		}
	}
	cfg := valid()
	if _, err := inbox.New(pool, nil, &cfg); err != nil {
		t.Fatalf("valid configuration refused: %v", err)
	}
	if cfg.Sarama != nil || cfg.Concurrency != 0 {
		t.Fatal("New changed the caller's Config")
	}
}
