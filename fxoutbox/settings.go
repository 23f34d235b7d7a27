package fxoutbox

import (
	"errors"
	"reflect"
	"strings"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/relay"
)

// setting says where one field of an engine's Config (relay.Config,
// unitofwork.Config) is set from: Fx, the path of the Config field that
// fxoutbox gives it ("" when the module sets it itself), and Env, the
// variables ConfigFromEnv reads for it. A field Fx names under the same
// name is copied as it is.
type setting struct {
	Field string
	Fx    string
	Env   string
}

// relaySettings maps every relay.Config field that a user sets; the others
// are in relayFromFx. relayConfig copies them, and a test fails for a
// relay.Config field in neither list.
var relaySettings = []setting{
	{"Table", "Table", "OUTBOX_SCHEMA, OUTBOX_TABLE"},
	{"Mode", "Mode", "OUTBOX_RELAY_MODE"},
	{"Stream", "Stream", "OUTBOX_STREAM_MAX_LAG, OUTBOX_STREAM_MAX_LAG_BYTES"},
	{"PollInterval", "PollInterval", "OUTBOX_POLL_INTERVAL"},
	{"BatchSize", "BatchSize", "OUTBOX_BATCH_SIZE"},
	{"MaxBatchSize", "MaxBatchSize", "OUTBOX_MAX_BATCH_SIZE"},
	{"Workers", "Workers", "OUTBOX_WORKERS"},
	{"Ordering", "Ordering", "OUTBOX_ORDERING"},
	{"Lanes", "Lanes", "OUTBOX_LANES"},
	{"Delivery", "Delivery", "OUTBOX_DELIVERY"},
	{"Progress", "Progress", "OUTBOX_PROGRESS"},
	{"TransactionTimeout", "TransactionTimeout", "OUTBOX_TRANSACTION_TIMEOUT"},
	{"ProgressTopic", "ProgressTopic", "OUTBOX_PROGRESS_TOPIC"},
	{"TransactionalID", "TransactionalID", "OUTBOX_TRANSACTIONAL_ID"},
	{"MaxAttempts", "MaxAttempts", "OUTBOX_MAX_ATTEMPTS"},
	{"Poison", "Poison", "OUTBOX_POISON"},
	{"MaxMessageBytes", "Limits.MaxRecordBytes", "OUTBOX_MAX_RECORD_BYTES"}, // what the writers accept
	{"Listen", "DisableListen", "OUTBOX_LISTEN"},                            // inverted
	{"Retention", "Retention", "OUTBOX_RETENTION"},
	{"CleanupInterval", "CleanupInterval", "OUTBOX_CLEANUP_INTERVAL"},
	{"CleanupBatch", "CleanupBatch", "OUTBOX_CLEANUP_BATCH"},
	{"BatchTimeout", "BatchTimeout", "OUTBOX_BATCH_TIMEOUT"},
	{"SynchronousCommit", "SynchronousCommit", "OUTBOX_SYNCHRONOUS_COMMIT"},
	{"MaxBackoff", "MaxBackoff", "OUTBOX_MAX_BACKOFF"},
	{"StatsInterval", "StatsInterval", "OUTBOX_STATS_INTERVAL"},
	{"CloudEvents", "CloudEvents", "OUTBOX_CLOUDEVENTS, OUTBOX_CLOUDEVENTS_SOURCE"},
}

// relayFromFx are the relay.Config fields the module fills from what fx
// supplies (slog.Logger, the OTel providers, the propagator): code, not
// settings.
var relayFromFx = []string{"Logger", "TracerProvider", "MeterProvider", "Propagator"}

// unitOfWorkSettings maps the unitofwork.Config fields a user sets;
// unitOfWorkFromFx are those the module fills itself.
var unitOfWorkSettings = []setting{
	{"Service", "Service", "OUTBOX_SERVICE"},
	{"Table", "Table", "OUTBOX_SCHEMA, OUTBOX_TABLE"},
	{"Topics", "Topics", "OUTBOX_TOPIC_NAMING"},
	{"Limits", "Limits", "OUTBOX_MAX_RECORD_BYTES, OUTBOX_MAX_PAYLOAD_BYTES, OUTBOX_MAX_TYPE_BYTES, OUTBOX_MAX_AGGREGATE_TYPE_BYTES, " +
		"OUTBOX_MAX_AGGREGATE_ID_BYTES, OUTBOX_MAX_KEY_BYTES, OUTBOX_MAX_HEADERS, OUTBOX_MAX_HEADER_BYTES"},
}

// unitOfWorkFromFx: OnCommit wakes the relays; the others come from fx.
// TxOptions stays the unit of work's default (READ COMMITTED, read-write)
// under fx.
var unitOfWorkFromFx = []string{"Propagator", "OnCommit", "Logger", "TxOptions"}

// relayConfig is the relay.Config of cfg (after withDefaults): every field
// of relaySettings, through reflection for those of the same name.
func (in *instance) relayConfig(cfg Config) relay.Config {
	rc := relay.Config{
		Listen:          !cfg.DisableListen,
		MaxMessageBytes: cfg.Limits.MaxRecordBytes,
		Logger:          in.log,
		TracerProvider:  in.tp,
		MeterProvider:   in.mp,
		Propagator:      in.prop,
	}
	copySettings(&rc, &cfg, relaySettings)
	return rc
}

// copySettings copies the fields of settings whose Fx path is the field's
// own name from *src to *dst.
func copySettings[D, S any](dst *D, src *S, settings []setting) {
	d, s := reflect.ValueOf(dst).Elem(), reflect.ValueOf(src).Elem()
	for _, st := range settings {
		if st.Fx == st.Field {
			d.FieldByName(st.Field).Set(s.FieldByName(st.Fx))
		}
	}
}

// settingError makes a ConfigError of an engine name the fxoutbox field and
// the variables that set it, e.g. "BatchSize [OUTBOX_BATCH_SIZE]".
func settingError(err error, settings []setting) error {
	var ce *outbox.ConfigError
	if !errors.As(err, &ce) {
		return err
	}
	head, rest, _ := strings.Cut(ce.Field, ".")
	for _, st := range settings {
		if st.Field == head && st.Env != "" {
			field := st.Fx
			if rest != "" {
				field += "." + rest
			}
			return &outbox.ConfigError{Field: field + " [" + st.Env + "]", Reason: ce.Reason, Err: ce.Err}
		}
	}
	return err
}

// inboxSettings maps the inbox.Config fields a user sets to the variables
// InboxConfigFromEnv reads (InboxConfig.Consumer is the inbox.Config, so
// each is also set from fx); inboxCodeOnly are given in code only.
var inboxSettings = []setting{
	{"Group", "Consumer.Group", "OUTBOX_INBOX_GROUP"},
	{"Name", "Consumer.Name", "OUTBOX_INBOX_NAME"},
	{"Brokers", "Consumer.Brokers", "OUTBOX_INBOX_BROKERS"},
	{"Table", "Consumer.Table", "OUTBOX_INBOX_SCHEMA, OUTBOX_INBOX_TABLE"},
	{"Concurrency", "Consumer.Concurrency", "OUTBOX_INBOX_CONCURRENCY"},
	{"BatchSize", "Consumer.BatchSize", "OUTBOX_INBOX_BATCH_SIZE"},
	{"MaxAttempts", "Consumer.MaxAttempts", "OUTBOX_INBOX_MAX_ATTEMPTS"},
	{"Poison", "Consumer.Poison", "OUTBOX_INBOX_POISON"},
	{"Identity", "Consumer.Identity", "OUTBOX_INBOX_IDENTITY"},
	{"DeadLetterTopic", "Consumer.DeadLetterTopic", "OUTBOX_INBOX_DEAD_LETTER_TOPIC"},
	{"ParkUnrouted", "Consumer.ParkUnrouted", "OUTBOX_INBOX_PARK_UNROUTED"},
	{"MinBackoff", "Consumer.MinBackoff", "OUTBOX_INBOX_MIN_BACKOFF"},
	{"MaxBackoff", "Consumer.MaxBackoff", "OUTBOX_INBOX_MAX_BACKOFF"},
	{"TryTimeout", "Consumer.TryTimeout", "OUTBOX_INBOX_TRY_TIMEOUT"},
	{"DrainTimeout", "Consumer.DrainTimeout", "OUTBOX_INBOX_DRAIN_TIMEOUT"},
	{"Retention", "Consumer.Retention", "OUTBOX_INBOX_RETENTION"},
	{"CleanupInterval", "Consumer.CleanupInterval", "OUTBOX_INBOX_CLEANUP_INTERVAL"},
}

// inboxCodeOnly: the sarama configuration (brokers' security comes from
// KAFKA_TLS*, KAFKA_SASL*), the routes with their handlers, and what fx
// supplies.
var inboxCodeOnly = []string{"Sarama", "Routes", "Logger", "TracerProvider", "MeterProvider", "Propagator"}
