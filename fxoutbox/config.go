package fxoutbox

import (
	"github.com/fxoutbox/outbox/internal/envconfig"
	"github.com/fxoutbox/outbox/outboxconfig"
)

// Config configures both sides of the outbox: outboxconfig.Config, where
// each field is documented (Writer is the unit of work's
// unitofwork.Config, Relay the relay's relay.Config). Zero fields take
// their defaults; ConfigFromEnv reads it from the environment.
type Config = outboxconfig.Config

// InboxConfig configures [InboxModule]: outboxconfig.InboxConfig, whose
// Consumer is the consumer's inbox.Config.
type InboxConfig = outboxconfig.InboxConfig

// ConfigFromEnv reads a Config from environment variables:
// outboxconfig.FromEnv, for fx.Provide.
func ConfigFromEnv() (Config, error) { return outboxconfig.FromEnv() }

// ConfigFromEnvPrefix reads the Config of one more outbox from the
// variables with prefix in front of their names (AUDIT_OUTBOX_TABLE):
// outboxconfig.FromEnvPrefix. See Named and NamedFromEnv.
func ConfigFromEnvPrefix(prefix string) (Config, error) { return outboxconfig.FromEnvPrefix(prefix) }

// InboxConfigFromEnv reads an InboxConfig from the OUTBOX_INBOX_ variables:
// outboxconfig.InboxFromEnv, for fx.Provide.
func InboxConfigFromEnv() (InboxConfig, error) { return outboxconfig.InboxFromEnv() }

// namesOf returns how the variables of c are named (its prefix) and what
// its reading found doubtful.
func namesOf(c Config) (envconfig.Names, []string) { return envconfig.Of(c) }
