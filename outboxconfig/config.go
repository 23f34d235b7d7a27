package outboxconfig

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/IBM/sarama"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/inbox"
	"github.com/fxoutbox/outbox/internal/envconfig"
	"github.com/fxoutbox/outbox/internal/record"
	"github.com/fxoutbox/outbox/internal/textcut"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// Config configures a service's outbox: the unit of work that writes events
// (Writer), the relay that publishes them (Relay), the table both use and
// the Kafka brokers. Zero fields take their defaults; [FromEnv] reads it
// from environment variables (each field's struct tag names its variable).
//
// The settings both sides share are set once: the table in Table (leave
// Writer.Table and Relay.Table zero), the largest record in
// Writer.Limits.MaxRecordBytes (it also becomes Relay.MaxMessageBytes and
// the sarama producer's Producer.MaxMessageBytes), CloudEvents in
// Relay.CloudEvents (it also becomes Writer.Limits.CloudEvents). A nested
// copy set to another value is an error naming the field to set instead.
type Config struct {
	// Table is the outbox table of the writer and the relay. Default:
	// outbox_event in the connection's search_path.
	Table outbox.Table `env:"OUTBOX_"`
	// Writer configures the unit of work: Service (the first part of
	// derived topic names), Topics, Limits and TxOptions. Writer.Service is
	// required when Writer.Topics derives names from it (the default); with
	// ExplicitTopics or a TopicFunc of your own it may stay empty. Under
	// fxoutbox, Propagator and Logger default to those the application
	// supplies, and OnCommit, if set, is called after the module's own
	// wake-ups.
	Writer unitofwork.Config `env:""`
	// Relay configures the relay. Under fxoutbox, Logger, TracerProvider,
	// MeterProvider and Propagator default to those the application
	// supplies; Listen is !DisableListen; Table, MaxMessageBytes are set
	// from Table and Writer.Limits.MaxRecordBytes.
	Relay relay.Config `env:""`
	// Migrate applies the migrations at start instead of only checking that
	// the table exists; with Relay.Progress ProgressCursor the cursor
	// migration too, and with ProgressAuto (the default, under Ordering
	// PerKey) the cursor migration to a table it creates
	// (migrations.Install), so a new install relays with cursor progress.
	// Default false.
	Migrate bool `env:"OUTBOX_MIGRATE"`
	// Brokers are the Kafka bootstrap addresses, host:port (the variable is
	// comma-separated). Required by the relay unless the application
	// supplies its own relay.Publisher; an address without a port is an
	// error. Default none.
	Brokers []string `env:"KAFKA_BROKERS,brokers"`
	// Sarama is the producer configuration. Default
	// relay.DefaultSaramaConfig() (idempotent, acks=all); a configuration
	// that breaks those guarantees is rejected. KAFKA_CLIENT_ID and
	// KAFKA_VERSION set ClientID and Version of the default. KafkaTLS,
	// KafkaSASL and Partitioner are applied to a copy of it.
	Sarama *sarama.Config `env:"KAFKA_"`
	// KafkaTLS turns on TLS to the brokers, with server certificates
	// verified. Default: plaintext.
	KafkaTLS KafkaTLS `env:""`
	// KafkaSASL authenticates to the brokers with PLAIN or SCRAM; it needs
	// KafkaTLS unless AllowPlaintext is set. Default: no SASL.
	KafkaSASL KafkaSASL `env:""`
	// Partitioner is the hash that maps an event's key to a partition:
	// relay.Murmur2 (Apache Kafka's Java client's and kafkajs's),
	// relay.FNV1a (sarama's; fxoutbox's before murmur2 became the default,
	// for topics that must keep their placement) or relay.CRC32
	// (librdkafka's). Set, it replaces Sarama.Producer.Partitioner when that
	// is one of these three, and is an error next to a partitioner of your
	// own there (choose in one place) or with a relay.Publisher from fx
	// (which partitions itself). Changing it on a live topic moves keys to
	// other partitions: see "Changing the partitioner" in
	// docs/configuration.md. Default (zero): relay.Murmur2, or
	// Sarama.Producer.Partitioner as it is when Sarama is given.
	Partitioner relay.Partitioner `env:"OUTBOX_PARTITIONER"`
	// DisableRelay builds the relay but does not start it: one image
	// deployed both as a writer and as a relay (the variable is
	// OUTBOX_RELAY=off). Default false.
	DisableRelay bool `env:"OUTBOX_RELAY,invert"`
	// DisableNotify stops writers from waking relays in other processes
	// with a coalesced NOTIFY after commits (at most one per NotifyInterval
	// per process, never inside the business transaction)
	// (OUTBOX_NOTIFY=off). Default false: writers notify.
	DisableNotify bool `env:"OUTBOX_NOTIFY,invert"`
	// NotifyInterval is the shortest time between two of a process's
	// NOTIFYs. The first commit after a quiet interval is notified at once;
	// while commits keep coming it is the most an event waits for its
	// wake-up, and it sets what a woken relay's batch gathers: at 1,000
	// events/s, 10ms makes batches of about 10 events and costs PostgreSQL
	// about 60 µs per event for the relay, 5ms about 6 events and 85 µs,
	// for a median commit-to-consumer latency about 3ms lower. Relays in
	// the writer's own process are woken at once, whatever it is. Default
	// 10ms (unitofwork.DefaultNotifyInterval).
	NotifyInterval time.Duration `env:"OUTBOX_NOTIFY_INTERVAL"`
	// DisableListen stops the relay from listening for those notifications
	// on a dedicated connection (Relay.Listen); it then relies on in-process
	// wake-ups and its ticker (OUTBOX_LISTEN=off). Default false: the relay
	// listens.
	DisableListen bool `env:"OUTBOX_LISTEN,invert"`
	// EventTypes declares the events this service writes, for TopicNames
	// and TopicCheck. The variable lists entries separated by commas, each
	// <aggregate-type>:<event-type>, e.g. payment:payment.created.v1 (its
	// topic derived as the writer derives it), or
	// <aggregate-type>:<event-type>=<topic> (or =<topic> alone) for events
	// that name their topic. Default none.
	EventTypes []EventType `env:"OUTBOX_EVENT_TYPES"`
	// TopicCheck makes the relay's start check that the topics of
	// EventTypes exist (TopicsCheck: a missing one fails the start, naming
	// it) or create the missing ones (TopicsCreate). It needs the brokers
	// at start. Default TopicsOff.
	TopicCheck TopicCheck `env:"OUTBOX_TOPICS"`
	// TopicPartitions is the number of partitions of the topics
	// TopicsCreate creates. Default -1 (zero means it too): the broker's
	// num.partitions.
	TopicPartitions int32 `env:"OUTBOX_TOPIC_PARTITIONS,orbroker"`
	// TopicReplicationFactor is the replication factor of the topics
	// TopicsCreate creates. Default -1 (zero means it too): the broker's
	// default.replication.factor.
	TopicReplicationFactor int16 `env:"OUTBOX_TOPIC_REPLICATION_FACTOR,orbroker"`

	// warnings are what FromEnv found doubtful but not wrong enough to
	// fail on; fxoutbox's start hooks log them.
	warnings []string
	// env names the variables the Config was read from (FromEnvPrefix),
	// for the errors found later.
	env envconfig.Names
}

// InboxConfig configures an inbox consumer (fxoutbox.InboxModule).
type InboxConfig struct {
	// Consumer is the consumer's configuration; Group is required. Under
	// fxoutbox, the routes of the fxoutbox.InboxRoutes group are added to
	// Consumer.Routes; Brokers default to Config.Brokers; Sarama to
	// inbox.DefaultSaramaConfig(), with KafkaTLS and KafkaSASL applied to a
	// copy; Logger, TracerProvider, MeterProvider and Propagator to those the
	// application supplies.
	Consumer inbox.Config `env:""`
	// KafkaTLS and KafkaSASL secure the consumer's connections. Default:
	// Config.KafkaTLS and Config.KafkaSASL when Consumer.Brokers is empty
	// (the same cluster as the relay), none otherwise.
	KafkaTLS  KafkaTLS
	KafkaSASL KafkaSASL
	// Migrate applies the inbox migrations (migrations.Inbox.Up) at start
	// instead of only checking that the inbox tables exist. Default false.
	Migrate bool `env:"OUTBOX_INBOX_MIGRATE"`
}

func init() {
	envconfig.Of = func(cfg any) (envconfig.Names, []string) {
		c := cfg.(Config)
		return c.env, c.warnings
	}
	envconfig.Read = func(prefix string, lookup func(string) (string, bool), environ ...string) (any, error) {
		return fromEnv(prefix, lookup, environ...)
	}
	envconfig.ReadInbox = func(lookup func(string) (string, bool), environ ...string) (any, error) {
		return inboxFromEnv(lookup, environ...)
	}
}

// EventType declares an event a service writes, so that its topic is known
// before the first event: Config.TopicNames lists the topics, and
// Config.TopicCheck checks or creates them at start.
type EventType struct {
	// AggregateType and Type are those of the events, e.g. "payment" and
	// "payment.created.v1"; the topic is derived from them as
	// Config.Writer.Topics says.
	AggregateType string
	Type          string
	// Topic is the topic of events that name theirs. Default "": derived.
	Topic string
}

// TopicCheck says what the relay does at start about the topics of the
// declared event types (Config.EventTypes).
type TopicCheck int

const (
	// TopicsOff checks nothing (default). An event for a missing topic
	// fails at publish: with the brokers' auto-creation off it is retried
	// and then parked (Config.Relay.MaxAttempts).
	TopicsOff TopicCheck = iota
	// TopicsCheck fails the start when a topic is missing, naming it.
	TopicsCheck
	// TopicsCreate creates missing topics with TopicPartitions and
	// TopicReplicationFactor, and fails the start if it cannot.
	TopicsCreate
)

func (t TopicCheck) String() string {
	switch t {
	case TopicsOff:
		return "off"
	case TopicsCheck:
		return "check"
	case TopicsCreate:
		return "create"
	}
	return fmt.Sprintf("TopicCheck(%d)", int(t))
}

// ExplicitTopics is the TopicFunc of a service whose events all name their
// Topic (OUTBOX_TOPIC_NAMING=explicit): it derives none, so
// Config.Writer.Service may stay empty, and an event without a Topic fails
// at Add.
func ExplicitTopics(string, outbox.Event) (string, error) {
	return "", errors.New("is empty, and this service derives no topic names (OUTBOX_TOPIC_NAMING=explicit): set the event's Topic")
}

// WithDefaults returns c with its own defaults applied (the table's, the
// topic naming's, the limits', the topic check's, CloudEvents' source) and
// the settings both sides share reconciled, or the first error of a field.
// The relay and the unit of work apply the rest of their defaults when
// they are built. Errors name the variables as they are set.
func (c Config) WithDefaults() (Config, error) {
	out, err := c.withDefaults()
	return out, c.env.Rename(err)
}

func (c Config) withDefaults() (Config, error) {
	c.Table = c.Table.WithDefaults()
	if err := c.Table.Validate(); err != nil {
		return c, fieldError(err, "", "Table")
	}
	for _, nested := range []struct {
		field string
		t     outbox.Table
	}{{"Writer.Table", c.Writer.Table}, {"Relay.Table", c.Relay.Table}} {
		if nested.t != (outbox.Table{}) && nested.t.WithDefaults() != c.Table {
			return c, &outbox.ConfigError{Field: nested.field, Reason: fmt.Sprintf("is %s but Table is %s: set only Table (OUTBOX_SCHEMA, OUTBOX_TABLE), "+
				"which the writer and the relay share", nested.t.WithDefaults(), c.Table)}
		}
	}
	c.Writer.Table, c.Relay.Table = c.Table, c.Table
	if c.Writer.Topics == nil {
		c.Writer.Topics = outbox.TopicPerEvent
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
	lim := &c.Writer.Limits
	// One size rule: the largest record, from Limits or else from a sarama
	// configuration that changed sarama's default.
	if c.Sarama != nil {
		if m := c.Sarama.Producer.MaxMessageBytes; m != sarama.NewConfig().Producer.MaxMessageBytes {
			switch lim.MaxRecordBytes {
			case 0:
				lim.MaxRecordBytes = m
			case m:
			default:
				return c, &outbox.ConfigError{Field: "Sarama.Producer.MaxMessageBytes", Reason: fmt.Sprintf(
					"is %d but Writer.Limits.MaxRecordBytes is %d: set only Writer.Limits.MaxRecordBytes (OUTBOX_MAX_RECORD_BYTES); "+
						"the writers, the relay and sarama get that one number", m, lim.MaxRecordBytes)}
			}
		}
	}
	if err := c.cloudEvents(); err != nil {
		return c, err
	}
	*lim = record.LimitsWithDefaults(*lim)
	if err := lim.Validate(); err != nil {
		return c, fieldError(err, "Writer.", "Limits")
	}
	switch c.Relay.MaxMessageBytes {
	case 0, lim.MaxRecordBytes:
		c.Relay.MaxMessageBytes = lim.MaxRecordBytes
	default:
		return c, &outbox.ConfigError{Field: "Relay.MaxMessageBytes", Reason: fmt.Sprintf("is %d but Writer.Limits.MaxRecordBytes is %d: "+
			"set only Writer.Limits.MaxRecordBytes (OUTBOX_MAX_RECORD_BYTES); the writers, the relay and sarama get that one number", c.Relay.MaxMessageBytes, lim.MaxRecordBytes)}
	}
	if c.Relay.Listen && c.DisableListen {
		return c, &outbox.ConfigError{Field: "Relay.Listen", Reason: "is set, and so is DisableListen (OUTBOX_LISTEN=off): set only DisableListen"}
	}
	c.Relay.Listen = !c.DisableListen
	return c, nil
}

// cloudEvents applies CloudEvents' default source, checks it, and gives it
// to the writers' limits, which count the headers the relay adds with it.
func (c *Config) cloudEvents() error {
	ce := &c.Relay.CloudEvents
	if ce.Mode == outbox.CloudEventsBinary && ce.Source == "" {
		if c.Writer.Service == "" {
			return &outbox.ConfigError{Field: "Relay.CloudEvents.Source [OUTBOX_CLOUDEVENTS_SOURCE]", Reason: "is empty, and so is Writer.Service " +
				"(OUTBOX_SERVICE), from which its default /<service> comes: set one of them, e.g. OUTBOX_CLOUDEVENTS_SOURCE=/order-service"}
		}
		ce.Source = "/" + c.Writer.Service
	}
	if err := ce.Validate(); err != nil {
		return fieldError(err, "Relay.", "CloudEvents")
	}
	switch c.Writer.Limits.CloudEvents {
	case outbox.CloudEvents{}, *ce:
		c.Writer.Limits.CloudEvents = *ce
		return nil
	}
	return &outbox.ConfigError{Field: "Writer.Limits.CloudEvents", Reason: fmt.Sprintf("is %+v but Relay.CloudEvents is %+v: set only Relay.CloudEvents "+
		"(OUTBOX_CLOUDEVENTS); the writers and the relay get that one setting", c.Writer.Limits.CloudEvents, *ce)}
}

// validateWriter checks what only the writer needs, after withDefaults: a
// service name when topics are derived from it, and NotifyInterval.
func (c Config) validateWriter() error {
	if c.NotifyInterval < 0 {
		return &outbox.ConfigError{Field: "NotifyInterval [OUTBOX_NOTIFY_INTERVAL]", Reason: fmt.Sprintf("is %v: use a positive duration, "+
			"or zero for the default (%v); OUTBOX_NOTIFY=off turns the notifications off", c.NotifyInterval, unitofwork.DefaultNotifyInterval)}
	}
	if c.Writer.Service == "" && derivesFromService(c.Writer.Topics) {
		return &outbox.ConfigError{Field: "Writer.Service [OUTBOX_SERVICE]", Reason: "is empty, and topic names are derived from it " +
			"(OUTBOX_TOPIC_NAMING per-event or per-aggregate): every event without a Topic would fail at Add. " +
			"Set it, e.g. payment-service; or, if every event names its Topic, set Writer.Topics to outboxconfig.ExplicitTopics (OUTBOX_TOPIC_NAMING=explicit)"}
	}
	return nil
}

// derivesFromService reports whether f is one of the library's namings,
// which need a service name.
func derivesFromService(f outbox.TopicFunc) bool {
	p := reflect.ValueOf(f).Pointer()
	return p == reflect.ValueOf(outbox.TopicPerEvent).Pointer() || p == reflect.ValueOf(outbox.TopicPerAggregate).Pointer()
}

// UnitOfWork returns the configuration of the unit of work the writer
// builds from c: Writer with the table, the defaults and the shared
// settings applied, and the error the writer would fail with. Build a unit
// of work without fx from it, or a test's recorder with the outbox's own
// rules (outboxtest.RecorderConfig{UnitOfWork: uc}).
func (c Config) UnitOfWork() (unitofwork.Config, error) {
	cfg, err := c.withDefaults()
	if err == nil {
		err = cfg.validateWriter()
	}
	if err != nil {
		return unitofwork.Config{}, c.env.Rename(err)
	}
	return cfg.Writer, nil
}

// RelayConfig returns the configuration of the relay built from c: Relay
// with the table, the largest record, Listen and CloudEvents applied, and
// the error relay.New would fail with, naming the field of Config and its
// variable (Relay.BatchSize [OUTBOX_BATCH_SIZE]).
func (c Config) RelayConfig() (relay.Config, error) {
	cfg, err := c.withDefaults()
	if err == nil {
		err = relayError(cfg.Relay.Validate())
	}
	if err != nil {
		return relay.Config{}, c.env.Rename(err)
	}
	return cfg.Relay, nil
}

// relayError makes an error of relay.Config.Validate name the field of
// Config that sets the relay's field, and its variables: "BatchSize"
// becomes "Relay.BatchSize [OUTBOX_BATCH_SIZE]", "MaxMessageBytes"
// "Writer.Limits.MaxRecordBytes [OUTBOX_MAX_RECORD_BYTES]".
func relayError(err error) error { return fieldError(err, "Relay.", "") }

// fromShared are the engines' fields that Config sets from one shared
// setting: their errors name that setting.
var fromShared = map[string]string{
	"Relay.Table":           "Table",
	"Writer.Table":          "Table",
	"Relay.MaxMessageBytes": "Writer.Limits.MaxRecordBytes",
	"Relay.Listen":          "DisableListen",
}

// fieldError makes a ConfigError whose Field is a path under prefix (in
// Config) name the whole path and its variables; head, when not empty, is
// put in front of the error's own field unless it starts with it ("Limits"
// for outbox.Limits' errors, which name "Limits" or
// "Limits.MaxPayloadBytes").
func fieldError(err error, prefix, head string) error {
	var ce *outbox.ConfigError
	if !errors.As(err, &ce) {
		return err
	}
	path := ce.Field
	if head != "" && path != head && !strings.HasPrefix(path, head+".") {
		path = head + "." + path
	}
	path = prefix + path
	if p, ok := fromShared[path]; ok {
		path = p
	}
	vars := variablesOf(reflect.TypeFor[Config](), path)
	if len(vars) == 0 {
		return &outbox.ConfigError{Field: path, Reason: ce.Reason, Err: ce.Err}
	}
	return &outbox.ConfigError{Field: path + " [" + strings.Join(vars, ", ") + "]", Reason: ce.Reason, Err: ce.Err}
}

// TopicNames returns the topics of the declared event types
// (Config.EventTypes), derived as the writer derives them, sorted and
// without duplicates: the list to create or to grant the relay's producer
// access to. A type whose topic cannot be derived is an error naming it.
func (c Config) TopicNames() ([]string, error) {
	names, err := c.topicNames()
	return names, c.env.Rename(err)
}

func (c Config) topicNames() ([]string, error) {
	c, err := c.withDefaults()
	if err != nil {
		return nil, err
	}
	var out []string
	for i, et := range c.EventTypes {
		topic := et.Topic
		if topic == "" {
			if topic, err = c.Writer.Topics(c.Writer.Service, outbox.Event{AggregateType: et.AggregateType, Type: et.Type}); err != nil {
				return nil, &outbox.ConfigError{Field: fmt.Sprintf("EventTypes[%d] [OUTBOX_EVENT_TYPES]", i),
					Reason: fmt.Sprintf("(%s, %s): the topic %v", textcut.Quote(et.AggregateType, 64), textcut.Quote(et.Type, 64), err)}
			}
		}
		if err := outbox.ValidateTopic(topic); err != nil {
			return nil, &outbox.ConfigError{Field: fmt.Sprintf("EventTypes[%d] [OUTBOX_EVENT_TYPES]", i), Reason: err.Error()}
		}
		out = append(out, topic)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}
