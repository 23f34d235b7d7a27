package fxoutbox

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/inbox"
	"github.com/fxoutbox/outbox/internal/textcut"
)

// inboxVariables are the variables InboxConfigFromEnv reads. ConfigFromEnv
// knows them too, so that a service running both modules gets no warning
// about them.
var inboxVariables = []string{
	"OUTBOX_INBOX_GROUP", "OUTBOX_INBOX_NAME", "OUTBOX_INBOX_BROKERS", "OUTBOX_INBOX_SCHEMA", "OUTBOX_INBOX_TABLE",
	"OUTBOX_INBOX_CONCURRENCY", "OUTBOX_INBOX_BATCH_SIZE", "OUTBOX_INBOX_MAX_ATTEMPTS", "OUTBOX_INBOX_POISON", "OUTBOX_INBOX_IDENTITY",
	"OUTBOX_INBOX_PARK_UNROUTED", "OUTBOX_INBOX_DEAD_LETTER_TOPIC", "OUTBOX_INBOX_MIN_BACKOFF", "OUTBOX_INBOX_MAX_BACKOFF", "OUTBOX_INBOX_TRY_TIMEOUT",
	"OUTBOX_INBOX_DRAIN_TIMEOUT", "OUTBOX_INBOX_RETENTION", "OUTBOX_INBOX_CLEANUP_INTERVAL", "OUTBOX_INBOX_MIGRATE",
}

// InboxConfigFromEnv reads an InboxConfig from environment variables. Unset
// ones keep the defaults of inbox.Config; a malformed value, or an
// OUTBOX_INBOX_ variable one typo away from one of these, is an
// *outbox.ConfigError naming the variable. The brokers and their security
// come from Config (KAFKA_BROKERS, KAFKA_TLS*, KAFKA_SASL*) unless
// OUTBOX_INBOX_BROKERS names another cluster.
//
//	OUTBOX_INBOX_GROUP            Consumer.Group (required by the module)
//	OUTBOX_INBOX_NAME             Consumer.Name (default: the group)
//	OUTBOX_INBOX_BROKERS          Consumer.Brokers, comma-separated
//	OUTBOX_INBOX_SCHEMA, _TABLE   Consumer.Table (default outbox_inbox)
//	OUTBOX_INBOX_CONCURRENCY      Consumer.Concurrency (16)
//	OUTBOX_INBOX_BATCH_SIZE       Consumer.BatchSize (1: a transaction per record)
//	OUTBOX_INBOX_MAX_ATTEMPTS     Consumer.MaxAttempts (5)
//	OUTBOX_INBOX_POISON           park (default) or hold
//	OUTBOX_INBOX_IDENTITY         event-id (default) or event-id-or-position
//	OUTBOX_INBOX_PARK_UNROUTED    on or off (default off)
//	OUTBOX_INBOX_DEAD_LETTER_TOPIC Consumer.DeadLetterTopic (default none)
//	OUTBOX_INBOX_MIN_BACKOFF, _MAX_BACKOFF, _TRY_TIMEOUT, _DRAIN_TIMEOUT,
//	_CLEANUP_INTERVAL             durations (100ms, 30s, 60s, 5s, 10m)
//	OUTBOX_INBOX_RETENTION        a duration, or "forever" (720h)
//	OUTBOX_INBOX_MIGRATE          true or false (default false)
func InboxConfigFromEnv() (InboxConfig, error) {
	return inboxConfigFrom(os.LookupEnv, os.Environ()...)
}

func inboxConfigFrom(lookupEnv func(string) (string, bool), environ ...string) (InboxConfig, error) {
	var ic InboxConfig
	c := &ic.Consumer
	get := func(name string) (string, bool) {
		v, ok := lookupEnv(name)
		if v = strings.TrimSpace(v); !ok || v == "" {
			return "", false
		}
		return v, true
	}
	bad := func(name, v, want string) error {
		return &outbox.ConfigError{Field: name, Reason: fmt.Sprintf("%s is not %s", textcut.Quote(v, 64), want)}
	}
	c.Group, _ = get("OUTBOX_INBOX_GROUP")
	c.Name, _ = get("OUTBOX_INBOX_NAME")
	c.Table.Schema, _ = get("OUTBOX_INBOX_SCHEMA")
	c.Table.Name, _ = get("OUTBOX_INBOX_TABLE")
	if v, ok := get("OUTBOX_INBOX_DEAD_LETTER_TOPIC"); ok {
		if err := outbox.ValidateTopic(v); err != nil {
			return ic, &outbox.ConfigError{Field: "OUTBOX_INBOX_DEAD_LETTER_TOPIC", Reason: err.Error()}
		}
		c.DeadLetterTopic = v
	}
	if err := c.Table.Validate(); err != nil {
		return ic, &outbox.ConfigError{Field: "OUTBOX_INBOX_SCHEMA/OUTBOX_INBOX_TABLE", Reason: err.Error(), Err: err}
	}
	if v, ok := get("OUTBOX_INBOX_BROKERS"); ok {
		for _, b := range strings.Split(v, ",") {
			if b = strings.TrimSpace(b); b != "" {
				c.Brokers = append(c.Brokers, b)
			}
		}
		if err := validateBrokers(c.Brokers, "OUTBOX_INBOX_BROKERS"); err != nil {
			return ic, err
		}
	}
	for _, n := range []struct {
		name string
		dst  *int
	}{
		{"OUTBOX_INBOX_CONCURRENCY", &c.Concurrency},
		{"OUTBOX_INBOX_BATCH_SIZE", &c.BatchSize},
		{"OUTBOX_INBOX_MAX_ATTEMPTS", &c.MaxAttempts},
	} {
		if v, ok := get(n.name); ok {
			x, err := strconv.Atoi(v)
			if err != nil || x <= 0 {
				return ic, bad(n.name, v, "a positive number")
			}
			*n.dst = x
		}
	}
	for _, d := range []struct {
		name string
		dst  *time.Duration
	}{
		{"OUTBOX_INBOX_MIN_BACKOFF", &c.MinBackoff},
		{"OUTBOX_INBOX_MAX_BACKOFF", &c.MaxBackoff},
		{"OUTBOX_INBOX_TRY_TIMEOUT", &c.TryTimeout},
		{"OUTBOX_INBOX_DRAIN_TIMEOUT", &c.DrainTimeout},
		{"OUTBOX_INBOX_CLEANUP_INTERVAL", &c.CleanupInterval},
	} {
		if v, ok := get(d.name); ok {
			x, err := time.ParseDuration(v)
			if err != nil || x <= 0 {
				return ic, bad(d.name, v, "a positive duration such as 5s")
			}
			*d.dst = x
		}
	}
	if v, ok := get("OUTBOX_INBOX_RETENTION"); ok {
		if v == "forever" {
			c.Retention = -1
		} else if x, err := time.ParseDuration(v); err != nil || x <= 0 {
			return ic, bad("OUTBOX_INBOX_RETENTION", v, `a positive duration such as 720h, or "forever"`)
		} else {
			c.Retention = x
		}
	}
	for _, e := range []error{
		choose(get, "OUTBOX_INBOX_POISON", `"park" or "hold"`, map[string]outbox.PoisonPolicy{"park": outbox.Park, "hold": outbox.Hold}, &c.Poison, strings.ToLower),
		choose(get, "OUTBOX_INBOX_IDENTITY", `"event-id" or "event-id-or-position"`,
			map[string]inbox.IdentityFunc{"event-id": inbox.EventID, "event-id-or-position": inbox.EventIDOrPosition}, &c.Identity, strings.ToLower),
		choose(get, "OUTBOX_INBOX_PARK_UNROUTED", "on or off", onOff(true), &c.ParkUnrouted, strings.ToLower),
		choose(get, "OUTBOX_INBOX_MIGRATE", "true or false (on or off)", onOff(true), &ic.Migrate, strings.ToLower),
	} {
		if e != nil {
			return ic, e
		}
	}
	known := map[string]bool{}
	for _, n := range inboxVariables {
		known[n] = true
	}
	var mine []string
	for _, kv := range environ {
		if strings.HasPrefix(kv, "OUTBOX_INBOX_") {
			mine = append(mine, kv)
		}
	}
	if _, err := unknownVariables(mine, known); err != nil {
		return ic, err
	}
	return ic, nil
}
