package fxoutbox

import (
	"github.com/fxoutbox/outbox/internal/envconfig"
)

// configFrom reads a Config as ConfigFromEnv does, from lookup; environ,
// when given, is scanned for unknown variables.
func configFrom(lookup func(string) (string, bool), environ ...string) (Config, error) {
	return configFromPrefix("", lookup, environ...)
}

// configFromPrefix is ConfigFromEnvPrefix(prefix) reading through lookup.
func configFromPrefix(prefix string, lookup func(string) (string, bool), environ ...string) (Config, error) {
	c, err := envconfig.Read(prefix, lookup, environ...)
	return c.(Config), err
}

// inboxConfigFrom is InboxConfigFromEnv reading through lookup.
func inboxConfigFrom(lookup func(string) (string, bool), environ ...string) (InboxConfig, error) {
	c, err := envconfig.ReadInbox(lookup, environ...)
	return c.(InboxConfig), err
}

// warningsOf are the unknown variables FromEnv found.
func warningsOf(c Config) []string {
	_, w := namesOf(c)
	return w
}
