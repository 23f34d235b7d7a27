package fxoutbox

import (
	"fmt"
	"os"
	"reflect"
	"time"

	"github.com/IBM/sarama"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/envconfig"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// Config configures both sides of the outbox. Zero fields take the defaults
// given in their comments; the environment variable that ConfigFromEnv reads
// for each field is named in brackets.
type Config struct {
	// Service is the first part of derived topic names, e.g. "order-service"
	// [OUTBOX_SERVICE]. Required by the writer when Topics derives names
	// from it (the default); with Topics = ExplicitTopics or a TopicFunc of
	// your own it may stay empty. Default "".
	Service string
	// Table is the outbox table [OUTBOX_SCHEMA, OUTBOX_TABLE].
	// Default: outbox_event in the connection's search_path.
	Table outbox.Table
	// Topics derives topic names. Default outbox.TopicPerEvent
	// ("<service>.<aggregate-type>.<event-name>")
	// [OUTBOX_TOPIC_NAMING=per-event|per-aggregate|explicit; explicit is
	// ExplicitTopics: every event names its Topic].
	Topics outbox.TopicFunc
	// Limits bounds what one event may carry; defaults and meaning in
	// outbox.Limits. Limits.MaxRecordBytes, the largest Kafka record
	// [OUTBOX_MAX_RECORD_BYTES], is the one size setting: the writers refuse
	// larger events and the relay and its sarama producer get the same
	// number (relay.Config.MaxMessageBytes, sarama
	// Producer.MaxMessageBytes), so every event accepted can be sent. Keep it
	// at most the topics' max.message.bytes. Default 1,048,588 (the
	// broker's default message.max.bytes). A Sarama configuration whose
	// Producer.MaxMessageBytes is not sarama's default sets it when
	// MaxRecordBytes is zero, and must equal it otherwise. The other limits
	// are [OUTBOX_MAX_PAYLOAD_BYTES] (the payload alone, as stored; at most
	// MaxRecordBytes), [OUTBOX_MAX_TYPE_BYTES, OUTBOX_MAX_AGGREGATE_TYPE_BYTES,
	// OUTBOX_MAX_AGGREGATE_ID_BYTES, OUTBOX_MAX_KEY_BYTES, OUTBOX_MAX_HEADERS,
	// OUTBOX_MAX_HEADER_BYTES].
	Limits outbox.Limits
	// Migrate applies the migrations at start instead of only checking that
	// the table exists [OUTBOX_MIGRATE]. Default false.
	Migrate bool

	// Brokers are the Kafka bootstrap addresses, host:port [KAFKA_BROKERS,
	// comma-separated]. Required by the relay unless the application
	// supplies its own relay.Publisher; an address without a port is an
	// error. Default none.
	Brokers []string
	// Sarama is the producer configuration. Default
	// relay.DefaultSaramaConfig() (idempotent, acks=all); a configuration
	// that breaks those guarantees is rejected. [KAFKA_CLIENT_ID,
	// KAFKA_VERSION adjust the default.] KafkaTLS and KafkaSASL are applied
	// to a copy of it.
	Sarama *sarama.Config
	// KafkaTLS turns on TLS to the brokers, with server certificates
	// verified [KAFKA_TLS=on, KAFKA_TLS_CA_FILE, KAFKA_TLS_CERT_FILE,
	// KAFKA_TLS_KEY_FILE, KAFKA_TLS_SERVER_NAME,
	// KAFKA_TLS_INSECURE_SKIP_VERIFY]. Default: plaintext.
	KafkaTLS KafkaTLS
	// KafkaSASL authenticates to the brokers with PLAIN or SCRAM; it needs
	// KafkaTLS unless AllowPlaintext is set [KAFKA_SASL_MECHANISM,
	// KAFKA_SASL_USER, KAFKA_SASL_PASSWORD, KAFKA_SASL_ALLOW_PLAINTEXT].
	// Default: no SASL.
	KafkaSASL KafkaSASL
	// Partitioner is the hash that maps an event's key to a partition
	// [OUTBOX_PARTITIONER=murmur2|fnv1a|crc32]: relay.Murmur2 (Apache Kafka's
	// Java client's and kafkajs's), relay.FNV1a (sarama's; fxoutbox's
	// before murmur2 became the default, for topics that must keep their
	// placement) or relay.CRC32 (librdkafka's). Set, it replaces
	// Sarama.Producer.Partitioner when that is one of these three, and is
	// an error next to a partitioner of your own there (choose in one
	// place) or with a relay.Publisher from fx (which partitions itself).
	// Changing it on a live topic moves keys to other partitions: see the
	// "Changing the partitioner" in docs/configuration.md. Default (zero): relay.Murmur2,
	// or Sarama.Producer.Partitioner as it is when Sarama is given
	// (relay.DefaultSaramaConfig's is murmur2).
	Partitioner relay.Partitioner

	// PollInterval is the relay's ticker period [OUTBOX_POLL_INTERVAL]. Default 500ms.
	PollInterval time.Duration
	// BatchSize is the most events per claim while the relay keeps up,
	// 1-10000 [OUTBOX_BATCH_SIZE]. Default 50.
	BatchSize int
	// MaxBatchSize is the most events per claim while a backlog drains:
	// claims double after each full batch up to it [OUTBOX_MAX_BATCH_SIZE].
	// Default 500 (or BatchSize, if larger); set it to BatchSize for fixed
	// batches.
	MaxBatchSize int
	// SynchronousCommit makes the relay's commits wait for their WAL flush
	// (see relay.Config.SynchronousCommit) [OUTBOX_SYNCHRONOUS_COMMIT=on].
	// Default false: a database crash can only make the relay publish its
	// last batches again.
	SynchronousCommit bool
	// Workers is how many batches one relay has in flight, on distinct
	// lanes; a crash repeats up to that many batches [OUTBOX_WORKERS].
	// Default 1.
	Workers int
	// BatchTimeout bounds one batch [OUTBOX_BATCH_TIMEOUT]. Default 30s.
	BatchTimeout time.Duration
	// MaxBackoff caps the wait between failing batches [OUTBOX_MAX_BACKOFF]. Default 30s.
	MaxBackoff time.Duration
	// DisableRelay builds the relay but does not start it [OUTBOX_RELAY=off].
	// Default false.
	DisableRelay bool
	// Ordering is relay.PerKey (default: each key's events in write order,
	// with any number of relay replicas) or relay.Unordered
	// [OUTBOX_ORDERING=per-key|unordered].
	Ordering relay.Ordering
	// Delivery is relay.AtLeastOnce (default) or relay.ExactlyOnce: each
	// batch in a Kafka transaction with the lane's progress, so that
	// read_committed consumers see each event once; it needs the poll mode,
	// per-key ordering and the module's own producer (docs/exactly-once.md) [OUTBOX_DELIVERY=at-least-once|exactly-once].
	Delivery relay.Delivery
	// Progress is relay.ProgressMarks (default: published_at set on each
	// delivered row) or relay.ProgressCursor (the lanes' positions once
	// per batch, nothing written per event; with Migrate the cursor
	// migration is applied too) [OUTBOX_PROGRESS=marks|cursor].
	Progress relay.Progress
	// TransactionTimeout is the Kafka transaction timeout of exactly-once
	// delivery, 1s to BatchTimeout [OUTBOX_TRANSACTION_TIMEOUT]. Default 10s.
	TransactionTimeout time.Duration
	// ProgressTopic is exactly-once's compacted progress topic, created when
	// missing [OUTBOX_PROGRESS_TOPIC]. Default "fxoutbox.progress.<table>"
	// without OUTBOX_SCHEMA (e.g. fxoutbox.progress.outbox_event),
	// "fxoutbox.progress.<schema>.<table>" with it.
	ProgressTopic string
	// TransactionalID is the prefix of exactly-once's Kafka transactional
	// ids, "<prefix>.<relay>.<n>" [OUTBOX_TRANSACTIONAL_ID]. Default
	// "fxoutbox.<table>" without OUTBOX_SCHEMA, "fxoutbox.<schema>.<table>"
	// with it.
	TransactionalID string
	// Lanes is the number of lanes keys hash into under per-key ordering;
	// every relay on a table must agree [OUTBOX_LANES]. Default 64.
	Lanes int
	// Retention is how long published rows are kept before the relay
	// deletes them; negative keeps them forever [OUTBOX_RETENTION, a
	// duration or "forever"]. Default 72h.
	Retention time.Duration
	// CleanupInterval is the period of the relay's deletion of published
	// rows past Retention [OUTBOX_CLEANUP_INTERVAL]. Default 1m.
	CleanupInterval time.Duration
	// CleanupBatch is the most rows one of those deletions removes, 1-100000
	// [OUTBOX_CLEANUP_BATCH]. Default 1000.
	CleanupBatch int
	// StatsInterval is how often the relay that reports the table-wide
	// gauges (outbox.backlog, outbox.oldest.age, outbox.parked) reads them,
	// and how often the others try to become that reporter
	// [OUTBOX_STATS_INTERVAL]. Default 1s.
	StatsInterval time.Duration
	// DisableNotify stops writers from waking relays in other processes
	// with a coalesced NOTIFY after commits (at most one per 5ms per
	// process, never inside the business transaction) [OUTBOX_NOTIFY=off].
	// Default false: writers notify.
	DisableNotify bool
	// DisableListen stops the relay from listening for those
	// notifications on a dedicated connection; it then relies on
	// in-process wake-ups and its ticker [OUTBOX_LISTEN=off]. Default false.
	DisableListen bool
	// MaxAttempts is how many permanent failures (too large, invalid or
	// missing topic, rejected record) an event may have before it is parked
	// [OUTBOX_MAX_ATTEMPTS]. Default 5.
	MaxAttempts int
	// Mode is relay.Poll (default: the relay claims unpublished rows from
	// the table) or relay.Stream (it follows the table's inserts in a
	// logical replication slot: PostgreSQL needs wal_level = logical, the
	// table's publication (migrations.UpStream) and a role with
	// REPLICATION; see relay.StreamConfig and docs/streaming.md) [OUTBOX_RELAY_MODE=poll|stream].
	Mode relay.Mode
	// Stream configures the Stream mode [OUTBOX_STREAM_MAX_LAG (a
	// duration), OUTBOX_STREAM_MAX_LAG_BYTES]. The slot and publication
	// are named after the table (outbox.Table.Slot, Publication). Default:
	// relay.StreamConfig's defaults (30s, 1 GiB).
	Stream relay.StreamConfig
	// Poison is outbox.Park (default: set a failing event aside so its key
	// flows on) or outbox.Hold (retry it forever, blocking its key)
	// [OUTBOX_POISON=park|hold].
	Poison outbox.PoisonPolicy
	// CloudEvents makes the relay also send each record in the binary
	// content mode of the CloudEvents Kafka protocol binding (ce_specversion,
	// ce_id, ce_source, ce_type, ce_time and content-type headers, next to
	// x-event-id, x-event-type and the trace context; see
	// relay.Config.CloudEvents), and the writers count those headers in
	// Limits.MaxRecordBytes (Limits.CloudEvents is set from it)
	// [OUTBOX_CLOUDEVENTS=off|binary, OUTBOX_CLOUDEVENTS_SOURCE]. Default
	// off; Source defaults to "/" + Service.
	CloudEvents outbox.CloudEvents

	// EventTypes declares the events this service writes, for TopicNames
	// and TopicCheck [OUTBOX_EVENT_TYPES: entries separated by commas, each
	// <aggregate-type>:<event-type>, e.g. payment:payment.created.v1 (its
	// topic derived as the writer derives it), or
	// <aggregate-type>:<event-type>=<topic> (or =<topic> alone) for events
	// that name their topic]. Default none.
	EventTypes []EventType
	// TopicCheck makes the relay's start check that the topics of
	// EventTypes exist (TopicsCheck: a missing one fails the start, naming
	// it) or create the missing ones (TopicsCreate)
	// [OUTBOX_TOPICS=off|check|create]. It needs the brokers at start.
	// Default TopicsOff.
	TopicCheck TopicCheck
	// TopicPartitions and TopicReplicationFactor are those of topics
	// TopicsCreate creates [OUTBOX_TOPIC_PARTITIONS,
	// OUTBOX_TOPIC_REPLICATION_FACTOR]. Default -1 (zero means it too):
	// the broker's num.partitions and default.replication.factor.
	TopicPartitions        int32
	TopicReplicationFactor int16

	// warnings are what ConfigFromEnv found doubtful but not wrong enough
	// to fail on; the start hooks log them.
	warnings []string
	// env names the variables the Config was read from (ConfigFromEnvPrefix),
	// for the errors found at start.
	env envconfig.Names
}

func (c Config) withDefaults() (Config, error) {
	c.Table = c.Table.WithDefaults()
	if c.Topics == nil {
		c.Topics = outbox.TopicPerEvent
	}
	if c.TopicPartitions == 0 {
		c.TopicPartitions = -1
	}
	if c.TopicReplicationFactor == 0 {
		c.TopicReplicationFactor = -1
	}
	switch {
	case c.TopicCheck < TopicsOff || c.TopicCheck > TopicsCreate:
		return c, &outbox.ConfigError{Field: "TopicCheck [OUTBOX_TOPICS]", Reason: fmt.Sprintf("is %d: use TopicsOff, TopicsCheck or TopicsCreate", int(c.TopicCheck))}
	case c.TopicPartitions < -1:
		return c, &outbox.ConfigError{Field: "TopicPartitions [OUTBOX_TOPIC_PARTITIONS]", Reason: fmt.Sprintf("is %d: use a positive number, or -1 for the broker's default", c.TopicPartitions)}
	case c.TopicReplicationFactor < -1:
		return c, &outbox.ConfigError{Field: "TopicReplicationFactor [OUTBOX_TOPIC_REPLICATION_FACTOR]", Reason: fmt.Sprintf("is %d: use a positive number, or -1 for the broker's default", c.TopicReplicationFactor)}
	}
	if err := c.Table.Validate(); err != nil {
		return c, err
	}
	// One size rule: the largest record, from Limits or else from a sarama
	// configuration that changed sarama's default.
	if c.Sarama != nil {
		if m := c.Sarama.Producer.MaxMessageBytes; m != sarama.NewConfig().Producer.MaxMessageBytes {
			switch c.Limits.MaxRecordBytes {
			case 0:
				c.Limits.MaxRecordBytes = m
			case m:
			default:
				return c, &outbox.ConfigError{Field: "Sarama.Producer.MaxMessageBytes", Reason: fmt.Sprintf(
					"is %d but Limits.MaxRecordBytes is %d: set only Limits.MaxRecordBytes (OUTBOX_MAX_RECORD_BYTES); "+
						"fxoutbox gives the writers, the relay and sarama that one number", m, c.Limits.MaxRecordBytes)}
			}
		}
	}
	if err := c.cloudEvents(); err != nil {
		return c, err
	}
	c.Limits = c.Limits.WithDefaults()
	return c, c.Limits.Validate()
}

// cloudEvents applies CloudEvents' default source, checks it, and gives it
// to the writers' limits, which count the headers the relay adds with it.
func (c *Config) cloudEvents() error {
	if c.CloudEvents.Mode == outbox.CloudEventsBinary && c.CloudEvents.Source == "" {
		if c.Service == "" {
			return &outbox.ConfigError{Field: "CloudEvents.Source [OUTBOX_CLOUDEVENTS_SOURCE]", Reason: "is empty, and so is Service " +
				"(OUTBOX_SERVICE), from which its default /<service> comes: set one of them, e.g. OUTBOX_CLOUDEVENTS_SOURCE=/order-service"}
		}
		c.CloudEvents.Source = "/" + c.Service
	}
	if err := c.CloudEvents.Validate(); err != nil {
		return err
	}
	switch c.Limits.CloudEvents {
	case outbox.CloudEvents{}, c.CloudEvents:
		c.Limits.CloudEvents = c.CloudEvents
		return nil
	}
	return &outbox.ConfigError{Field: "Limits.CloudEvents", Reason: fmt.Sprintf("is %+v but CloudEvents is %+v: set only CloudEvents "+
		"(OUTBOX_CLOUDEVENTS); fxoutbox gives the writers and the relay that one setting", c.Limits.CloudEvents, c.CloudEvents)}
}

// validateWriter checks what only the writer needs: a service name when
// topics are derived from it.
func (c Config) validateWriter() error {
	if c.Service == "" && derivesFromService(c.Topics) {
		return &outbox.ConfigError{Field: "Service [OUTBOX_SERVICE]", Reason: "is empty, and topic names are derived from it " +
			"(OUTBOX_TOPIC_NAMING per-event or per-aggregate): every event without a Topic would fail at Add. " +
			"Set it, e.g. payment-service; or, if every event names its Topic, set Topics to fxoutbox.ExplicitTopics (OUTBOX_TOPIC_NAMING=explicit)"}
	}
	return nil
}

// validateBrokers checks that every address is host:port with a port
// number; field names the setting in errors.
func validateBrokers(brokers []string, field string) error {
	return envconfig.ValidateBrokers(brokers, field)
}

// ConfigFromEnv reads a Config from environment variables (names in the
// field comments). Unset variables keep the defaults; a malformed value is a
// *outbox.ConfigError naming the variable. So is an OUTBOX_ or KAFKA_
// variable that is not a setting but close to the name of one (a typo such
// as OUTBOX_BATCHSIZE); other unknown variables with these prefixes (those
// of other tools) are logged as warnings when the outbox starts.
func ConfigFromEnv() (Config, error) { return configFrom(os.LookupEnv, os.Environ()...) }

// ConfigFromEnvPrefix reads the Config of one more outbox in the same
// process (see Named and NamedFromEnv) from the variables of ConfigFromEnv
// with prefix in front of their names: with prefix "AUDIT_",
// AUDIT_OUTBOX_SERVICE, AUDIT_OUTBOX_TABLE, AUDIT_OUTBOX_POLL_INTERVAL, and
// so on. Each outbox has its own OUTBOX_ settings: an unset prefixed one
// takes the default, never the value of the unprefixed variable. The Kafka
// settings (KAFKA_BROKERS, KAFKA_TLS*, KAFKA_SASL*, KAFKA_CLIENT_ID,
// KAFKA_VERSION) are shared: they are read from the unprefixed variables
// unless a variable starting with prefix+"KAFKA_" is set, and then all of
// them from the prefixed ones (another cluster). Validation, typo detection
// (AUDIT_OUTBOX_BATCHSIZE) and warnings are those of ConfigFromEnv; every
// error names the variable as it is set. The prefix is upper-case letters,
// digits and underscores ending with '_', not starting with OUTBOX_ or
// KAFKA_ (ConfigFromEnv would take its variables for its own); "" is
// ConfigFromEnv.
func ConfigFromEnvPrefix(prefix string) (Config, error) {
	return configFromPrefix(prefix, os.LookupEnv, os.Environ()...)
}

// UnitOfWork returns the configuration of the unit of work the writer
// builds from c: the same service, table, topic naming and limits, with
// the defaults applied, and the error the writer would fail with. Build a
// unit of work without fx from it, or a test's recorder with the outbox's
// own rules (outboxtest.RecorderConfig{UnitOfWork: uc}). OnCommit,
// Propagator and Logger are left for the caller.
func (c Config) UnitOfWork() (unitofwork.Config, error) {
	cfg, err := c.withDefaults()
	if err == nil {
		err = cfg.validateWriter()
	}
	if err != nil {
		return unitofwork.Config{}, c.env.Rename(err)
	}
	return unitofwork.Config{Service: cfg.Service, Table: cfg.Table, Topics: cfg.Topics, Limits: cfg.Limits}, nil
}

// configFrom reads the variables through lookup; environ, when given, is
// scanned for unknown OUTBOX_ and KAFKA_ variables.
func configFrom(lookupEnv func(string) (string, bool), environ ...string) (Config, error) {
	return configFromPrefix("", lookupEnv, environ...)
}

// configFromPrefix is configFrom for the variables named with prefix (see
// ConfigFromEnvPrefix); envconfig.Read reads them, and the Config takes
// each of its fields by name.
func configFromPrefix(prefix string, lookupEnv func(string) (string, bool), environ ...string) (Config, error) {
	o, err := envconfig.Read(prefix, lookupEnv, environ...)
	if err != nil {
		return Config{}, err
	}
	c := Config{warnings: o.Warnings, env: o.Names}
	src, dst := reflect.ValueOf(o), reflect.ValueOf(&c).Elem()
	for _, et := range o.EventTypes {
		c.EventTypes = append(c.EventTypes, EventType(et))
	}
	for i, f := range reflect.VisibleFields(src.Type()) {
		if f.Name == "Warnings" || f.Name == "Names" || f.Name == "EventTypes" {
			continue
		}
		dst.FieldByName(f.Name).Set(src.Field(i).Convert(dst.FieldByName(f.Name).Type()))
	}
	return c, nil
}
