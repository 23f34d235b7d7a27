package fxoutbox

import (
	"os"

	"github.com/fxoutbox/outbox/internal/envconfig"
)

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
	ic, err := envconfig.ReadInbox(lookupEnv, environ...)
	return InboxConfig{Consumer: ic.Consumer, Migrate: ic.Migrate}, err
}
