// Package outboxconfig is the one settings model of the outbox: the
// [Config] of a service's outbox (its table, the unit of work's and the
// relay's settings, the brokers), the [InboxConfig] of its consumer, and
// the reading of both from environment variables ([FromEnv],
// [FromEnvPrefix], [InboxFromEnv]). It links no fx: fxoutbox's Config and
// InboxConfig are these types, and the outboxctl command reads the same
// variables through this package.
//
// Config nests the engines' own configurations, as pgxpool.Config nests
// pgx's ConnConfig: Config.Writer is a unitofwork.Config, Config.Relay a
// relay.Config, InboxConfig.Consumer an inbox.Config. Each setting is
// documented once, on the field that defines it, and the field's struct
// tag names its variable (`env:"OUTBOX_BATCH_SIZE"`); a tag ending in '_'
// on a struct field is the prefix of its fields' variables (inbox.Config's
// Table `env:"OUTBOX_INBOX_"` reads OUTBOX_INBOX_SCHEMA and
// OUTBOX_INBOX_TABLE). Zero fields take their defaults; the engines apply
// and validate them.
//
// docs/configuration.md lists every setting with its variable, field,
// default and meaning; it is generated from these sources (go generate
// ./... in this directory).
//
//go:generate go run ../internal/settingsdoc/cmd/gensettings -root ..
package outboxconfig
