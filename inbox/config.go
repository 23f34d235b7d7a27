package inbox

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/defaults"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/unitofwork"
)

// Handler applies one record inside the consumer's transaction: its
// statements on tx, and the events it records with tx.Add, commit together
// with the record's inbox row, or not at all. ctx carries the record's
// process span (the producer's trace), so events it adds continue the trace.
//
// An error rolls the transaction back. A transient database error (lost
// connection, serialization failure, deadlock, timeouts; see [Transient])
// is retried with backoff without counting against the record; any other
// error counts as one attempt, and after Config.MaxAttempts the record is
// parked (or, with [outbox.Hold], retried forever). Wrap an error with [outbox.Permanent]
// to park the record at once (a payload that can never be decoded).
//
// A handler must not have side effects outside tx that cannot be repeated
// (HTTP calls, e-mails): those run again when the transaction rolls back or
// its outcome is unknown. Record an event with tx.Add instead and act on it
// in another consumer.
type Handler func(ctx context.Context, tx unitofwork.Tx, m *Message) error

// Route sends the records of a topic (and, optionally, of one event type) to
// a handler.
type Route struct {
	// Topic is the Kafka topic. Required.
	Topic string
	// Type, if set, limits the route to records whose x-event-type header
	// (or, without one, ce_type header) equals it; a route without Type
	// takes the topic's other records.
	// Default "" (every type).
	Type string
	// Handler applies the records. Required.
	Handler Handler
}

// Message is a consumed record as a handler sees it.
type Message struct {
	// ID is the identity the inbox deduplicates on: the x-event-id header,
	// or what Config.Identity gives a record without one (by default, for a
	// CloudEvent, CloudEventID of its ce_source and ce_id).
	ID string
	// Type is the x-event-type header, or without one the ce_type header
	// of a CloudEvent ("" if both are absent).
	Type      string
	Topic     string
	Partition int32
	Offset    int64
	Key       []byte
	Value     []byte
	// Headers are the record's headers (the last value of a repeated name).
	Headers   map[string]string
	Timestamp time.Time
	// Attempt counts the times a handler ran for this record in this
	// process, from 1; transient failures do not count.
	Attempt int
}

// IdentityFunc returns the identity a record is deduplicated on, or an error
// saying why it has none (the record is then parked at once with that
// reason).
type IdentityFunc func(m *sarama.ConsumerMessage) (string, error)

// EventID is the default identity: the x-event-id header the relay sets.
// A record without it whose ce_id and ce_source headers say it is a
// CloudEvent in the binary content mode of the Kafka protocol binding
// (another CloudEvents producer) is identified by its CloudEvents identity,
// source and id, as [CloudEventID] renders it. Other records are parked
// with ErrNoEventID.
func EventID(m *sarama.ConsumerMessage) (string, error) {
	var ceID, ceSource []byte
	for _, h := range m.Headers {
		if h == nil || len(h.Value) == 0 {
			continue
		}
		switch string(h.Key) {
		case outbox.HeaderEventID:
			if len(h.Value) > 200 {
				return "", fmt.Errorf("%w: the %s header is over 200 bytes", ErrNoEventID, outbox.HeaderEventID)
			}
			return string(h.Value), nil
		case outbox.HeaderCloudEventsID:
			ceID = h.Value
		case outbox.HeaderCloudEventsSource:
			ceSource = h.Value
		}
	}
	if ceID != nil && ceSource != nil {
		return CloudEventID(string(ceSource), string(ceID)), nil
	}
	return "", ErrNoEventID
}

// cloudEventsNamespace is the UUID namespace of CloudEventID: the name-based
// (SHA-1) UUID of the URL "https://github.com/fxoutbox/outbox/inbox#cloudevents".
const cloudEventsNamespace = "75f11d54-d63f-5f58-8311-6b1a90d9cdc5"

// CloudEventID returns the identity under which the inbox deduplicates a
// CloudEvent that has no x-event-id header: the name-based (SHA-1, version
// 5) UUID, in the namespace 75f11d54-d63f-5f58-8311-6b1a90d9cdc5, of the
// name made of the source's length in bytes (decimal), a colon, the source
// and the id. CloudEvents identifies an event by source and id together
// (two producers may both send an id "1"), and the id may be any string;
// the UUID fits the inbox table whatever their length, and differs from
// the outbox's own event ids (version 7 UUIDs). Look a record up in the inbox table
// with it; handlers find the ce_id itself in Message.Headers.
func CloudEventID(source, id string) string {
	name := strconv.Itoa(len(source)) + ":" + source + id
	return uuid.NewSHA1(uuid.MustParse(cloudEventsNamespace), []byte(name)).String()
}

// EventIDOrPosition identifies a record as EventID does (x-event-id, or a
// CloudEvent's source and id), and any other record by its position,
// "<topic>/<partition>/<offset>". A position
// is stable across redeliveries of the same record (offset resets,
// rebalances), but the same payload sent twice by its producer gets two
// positions and is applied twice.
func EventIDOrPosition(m *sarama.ConsumerMessage) (string, error) {
	if id, err := EventID(m); err == nil {
		return id, nil
	}
	return m.Topic + "/" + strconv.Itoa(int(m.Partition)) + "/" + strconv.FormatInt(m.Offset, 10), nil
}

// Config configures a Consumer.
type Config struct {
	// Group is the Kafka consumer group id. Required.
	Group string `env:"OUTBOX_INBOX_GROUP"`
	// Name is the consumer's name in the inbox table: each event is applied
	// once per Name. Two groups that must each apply every event need two
	// names. Default: Group.
	Name string `env:"OUTBOX_INBOX_NAME"`
	// Brokers are the Kafka bootstrap addresses, host:port. Required.
	Brokers []string `env:"OUTBOX_INBOX_BROKERS,brokers"`
	// Sarama is the consumer group's configuration. Default:
	// DefaultSaramaConfig(). Its Consumer.Group.Rebalance.Timeout must be
	// below Net.ReadTimeout (IBM/sarama#2820), and DrainTimeout below it.
	// Keep Consumer.Offsets.AutoCommit enabled: the inbox marks offsets and
	// sarama commits them; with it off, no offset is ever committed and
	// every restart redelivers (and skips) everything since the last one.
	// Consumer.IsolationLevel is used as given: DefaultSaramaConfig's is
	// sarama.ReadCommitted (records of aborted Kafka transactions are never
	// delivered), while sarama.NewConfig's is ReadUncommitted; a
	// configuration of your own should start from DefaultSaramaConfig or
	// set it.
	Sarama *sarama.Config
	// Routes send each topic's records to handlers. At least one.
	Routes []Route
	// Table is the inbox table (its parked records are in <name>_parked).
	// Default: outbox_inbox in the search_path.
	Table outbox.Table `env:"OUTBOX_INBOX_"`
	// Concurrency is how many records of one partition are processed at
	// once, on distinct keys (records of one key are applied in partition
	// order, one at a time). An idle worker takes the next record whose key
	// has nothing earlier in progress, reading up to Concurrency x 64
	// records ahead of the lowest one not yet done. 1-1024. Default 16.
	Concurrency int `env:"OUTBOX_INBOX_CONCURRENCY"`
	// BatchSize is how many records of a partition one transaction may
	// apply (default 1: a transaction per record). Above 1, a worker that
	// takes a record also takes the records ready at that moment (of
	// distinct keys: a key's records are still applied one after another),
	// up to BatchSize, and applies them in one transaction: one INSERT of
	// their inbox rows sent with BEGIN, the handler of each new record in
	// offset order, one COMMIT. Nothing waits for a batch to fill, so
	// batches grow only when records queue up, and latency under light load
	// is unchanged.
	//
	// Set it only when the handlers allow it: a handler's writes then
	// commit or roll back with other records' writes. When any part of a
	// batch fails (a handler error or panic, a database error), the whole
	// transaction rolls back and each of its records is applied again
	// alone, with its own retries, attempts and parking; so a handler's
	// side effects outside tx, which must be repeatable anyway, may run
	// once more. What a handler leaves in the transaction is seen by the
	// handlers after it: SET LOCAL and set_config(..., true) settings (a
	// row-level security tenant, a role, statement_timeout), transaction
	// advisory locks, temporary tables; a deferred constraint one handler
	// breaks fails the whole batch at COMMIT. TryTimeout bounds the batch's
	// transaction; a partition's batches halve after one failed and grow
	// again as they commit. 1-1000. Default 1.
	BatchSize int `env:"OUTBOX_INBOX_BATCH_SIZE"`
	// MaxAttempts is how many handler errors a record may have before it is
	// parked (or held). Default 5.
	MaxAttempts int `env:"OUTBOX_INBOX_MAX_ATTEMPTS"`
	// Poison is outbox.Park (default) or outbox.Hold (see
	// outbox.PoisonPolicy for what each does to a record).
	Poison outbox.PoisonPolicy `env:"OUTBOX_INBOX_POISON"`
	// Identity gives each record the id it is deduplicated on. Default
	// EventID (x-event-id, or a CloudEvent's ce_source and ce_id; other
	// records are parked); EventIDOrPosition accepts the others too.
	Identity IdentityFunc `env:"OUTBOX_INBOX_IDENTITY"`
	// DeadLetterTopic, if set, is where a parked record is also announced:
	// the transaction that parks it records an outbox event (type
	// DeadLetterEventType, payload DeadLetter: the record's exact key, value
	// and headers, and why it was parked) to this topic, keyed by the
	// record's key, on the record's trace. The event commits with the
	// parked row and the inbox row or not at all, and the relay publishes
	// it like any other. One event per parked row: a record parked again
	// (without identity, redelivered) sends none. It must not be a topic
	// the consumer routes. Create the topic as you create the others: the
	// relay parks events whose topic does not exist (with fxoutbox, list it
	// in Config.EventTypes as outboxconfig.EventType{Topic: ...} for
	// OUTBOX_TOPICS=check or create to cover it). Default "" (none).
	DeadLetterTopic string `env:"OUTBOX_INBOX_DEAD_LETTER_TOPIC,topic"`
	// ParkUnrouted parks records of a topic whose x-event-type no route
	// takes, instead of skipping them. Default false: they are skipped
	// (counted as ignored) and their offsets committed.
	ParkUnrouted bool `env:"OUTBOX_INBOX_PARK_UNROUTED"`
	// MinBackoff is the first wait between tries of a failing record; the
	// wait doubles up to MaxBackoff. Default 100ms.
	MinBackoff time.Duration `env:"OUTBOX_INBOX_MIN_BACKOFF"`
	// MaxBackoff caps the wait between tries of a failing record. Default
	// 30s, or MinBackoff if longer.
	MaxBackoff time.Duration `env:"OUTBOX_INBOX_MAX_BACKOFF"`
	// TryTimeout bounds one try at a record (its transaction, handler
	// included): at the deadline the transaction is cancelled and rolls
	// back, and the record is retried like after any timeout, with backoff
	// and without counting an attempt (a database that stopped answering
	// must not get records parked). A handler that never finishes in time
	// therefore holds its key; it is logged with error.type=timeout at each
	// try. Default 60s.
	TryTimeout time.Duration `env:"OUTBOX_INBOX_TRY_TIMEOUT"`
	// DrainTimeout is how long records in progress may take to finish when
	// their partition is revoked or the consumer stops; then their
	// transactions are cancelled (rolled back) and the records are left
	// to the next owner. Default 5s.
	DrainTimeout time.Duration `env:"OUTBOX_INBOX_DRAIN_TIMEOUT"`
	// Retention is how long inbox rows are kept; older ones are deleted in
	// bounded batches every CleanupInterval. Keep it longer than the topics'
	// retention.ms plus the longest offset reset you may do: an event
	// redelivered after its row was deleted is applied again. Negative keeps
	// rows forever. Default 720h (30 days; Kafka's default retention is 7).
	Retention time.Duration `env:"OUTBOX_INBOX_RETENTION,forever"`
	// CleanupInterval is the period of the retention deletes. Default 10m.
	CleanupInterval time.Duration `env:"OUTBOX_INBOX_CLEANUP_INTERVAL"`
	// Logger receives the consumer's logs. Default slog.Default().
	Logger *slog.Logger
	// TracerProvider makes the process spans. Default: the global one.
	TracerProvider trace.TracerProvider
	// MeterProvider makes the metrics. Default: the global one.
	MeterProvider metric.MeterProvider
	// Propagator reads the trace context from record headers. Default: W3C
	// trace context and baggage, as the relay writes them.
	Propagator propagation.TextMapPropagator
}

// DefaultSaramaConfig returns the consumer group configuration the inbox
// uses by default: Kafka 2.1 protocol, oldest offset for a new group, errors
// returned (and logged), offsets auto-committed every second (only what the
// inbox marked: records applied, skipped or parked), and a rebalance timeout
// of 20s below the 30s read timeout, so a JoinGroup answer always arrives
// before sarama gives up on it (IBM/sarama#2820).
//
// It reads committed (Consumer.IsolationLevel = sarama.ReadCommitted): the
// records of an aborted Kafka transaction, such as a batch the relay
// published in exactly-once mode and then aborted (and published again),
// are never delivered; while a transaction is open, the records of its
// partitions from its first one on wait until it commits or aborts (the
// broker's last stable offset). Set sarama.ReadUncommitted to read every
// record as soon as it is written, aborted ones included (the inbox then
// applies them).
func DefaultSaramaConfig() *sarama.Config {
	sc := sarama.NewConfig()
	sc.Version = sarama.V2_1_0_0
	sc.ClientID = "fxoutbox-inbox"
	sc.Consumer.IsolationLevel = sarama.ReadCommitted
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	sc.Consumer.Offsets.AutoCommit.Enable = true
	sc.Consumer.Offsets.AutoCommit.Interval = time.Second
	sc.Consumer.Return.Errors = true
	sc.Consumer.Group.Rebalance.Timeout = 20 * time.Second
	sc.Net.ReadTimeout = 30 * time.Second
	return sc
}

// The defaults and bounds of Config: the one place each is written (a test
// compares the field comments with them).
const (
	defaultConcurrency     = 16
	maxConcurrency         = 1024
	defaultBatchSize       = 1
	maxBatchSize           = 1000
	defaultMaxAttempts     = 5
	defaultMinBackoff      = 100 * time.Millisecond
	defaultMaxBackoff      = 30 * time.Second // or MinBackoff, if longer
	defaultTryTimeout      = 60 * time.Second
	defaultDrainTimeout    = 5 * time.Second
	defaultRetention       = 720 * time.Hour
	defaultCleanupInterval = 10 * time.Minute
)

// withDefaults sets each zero field to its default, and gives the Config its
// own copy of Sarama. It leaves other values, negative ones included, to
// validate.
func (c Config) withDefaults() Config {
	if c.Name == "" {
		c.Name = c.Group
	}
	c.Table = sqlname.Inbox(c.Table)
	if c.Sarama == nil {
		c.Sarama = DefaultSaramaConfig()
	} else {
		cp := *c.Sarama
		c.Sarama = &cp
	}
	c.Sarama.Consumer.Return.Errors = true
	defaults.Set(&c.Concurrency, defaultConcurrency)
	defaults.Set(&c.BatchSize, defaultBatchSize)
	defaults.Set(&c.MaxAttempts, defaultMaxAttempts)
	if c.Identity == nil {
		c.Identity = EventID
	}
	defaults.Set(&c.MinBackoff, defaultMinBackoff)
	defaults.Set(&c.MaxBackoff, max(defaultMaxBackoff, c.MinBackoff))
	defaults.Set(&c.TryTimeout, defaultTryTimeout)
	defaults.Set(&c.DrainTimeout, defaultDrainTimeout)
	defaults.Set(&c.Retention, defaultRetention)
	defaults.Set(&c.CleanupInterval, defaultCleanupInterval)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Propagator == nil {
		c.Propagator = defaults.Propagator()
	}
	return c
}

// validate checks a Config after withDefaults: what is required, the
// routes, and each setting's range; a negative value is an error (except
// Retention, where it keeps rows forever). Each error names the field and
// says what to do.
func (c Config) validate() error {
	if c.Group == "" {
		return &outbox.ConfigError{Field: "Group", Reason: "is empty: name the Kafka consumer group"}
	}
	if len(c.Brokers) == 0 {
		return &outbox.ConfigError{Field: "Brokers", Reason: "is empty: give the Kafka bootstrap addresses (host:port)"}
	}
	if err := c.validateRoutes(); err != nil {
		return err
	}
	if err := c.Table.Validate(); err != nil {
		return err
	}
	if c.Sarama.Consumer.Group.Rebalance.Timeout >= c.Sarama.Net.ReadTimeout {
		return &outbox.ConfigError{Field: "Sarama.Consumer.Group.Rebalance.Timeout", Reason: fmt.Sprintf(
			"%v is not below Net.ReadTimeout %v: sarama waits for a JoinGroup answer only the read timeout, and a group whose members died then rejoins in a loop (IBM/sarama#2820); lower it or raise Net.ReadTimeout",
			c.Sarama.Consumer.Group.Rebalance.Timeout, c.Sarama.Net.ReadTimeout)}
	}
	if c.Sarama.Consumer.IsolationLevel == sarama.ReadCommitted && !c.Sarama.Version.IsAtLeast(sarama.V0_11_0_0) {
		return &outbox.ConfigError{Field: "Sarama.Version", Reason: fmt.Sprintf(
			"%v is below 0.11.0.0, the first Kafka protocol with transactions, and Consumer.IsolationLevel is ReadCommitted: raise Version (DefaultSaramaConfig's is %v) or set Consumer.IsolationLevel to sarama.ReadUncommitted",
			c.Sarama.Version, DefaultSaramaConfig().Version)}
	}
	if err := c.Sarama.Validate(); err != nil {
		return &outbox.ConfigError{Field: "Sarama", Reason: err.Error(), Err: err}
	}
	bad := func(field string, v any, want string) error {
		return &outbox.ConfigError{Field: field, Reason: fmt.Sprintf("is %v: %s", v, want)}
	}
	switch {
	case c.Concurrency < 1 || c.Concurrency > maxConcurrency:
		return bad("Concurrency", c.Concurrency, fmt.Sprintf("use 1 to %d (zero means the default, %d)", maxConcurrency, defaultConcurrency))
	case c.BatchSize < 1 || c.BatchSize > maxBatchSize:
		return bad("BatchSize", c.BatchSize, fmt.Sprintf("use 1 to %d (zero means the default, %d)", maxBatchSize, defaultBatchSize))
	case c.MaxAttempts < 1:
		return bad("MaxAttempts", c.MaxAttempts, fmt.Sprintf("use at least 1 (zero means the default, %d)", defaultMaxAttempts))
	case c.Poison != outbox.Park && c.Poison != outbox.Hold:
		return bad("Poison", int(c.Poison), "use outbox.Park or outbox.Hold")
	case c.MinBackoff < 0:
		return bad("MinBackoff", c.MinBackoff, fmt.Sprintf("use a positive duration (zero means the default, %v)", defaultMinBackoff))
	case c.MaxBackoff < c.MinBackoff:
		return bad("MaxBackoff", c.MaxBackoff, fmt.Sprintf("use at least MinBackoff (%v); zero means the default, %v or MinBackoff if longer", c.MinBackoff, defaultMaxBackoff))
	case c.TryTimeout < 0:
		return bad("TryTimeout", c.TryTimeout, fmt.Sprintf("use a positive duration (zero means the default, %v)", defaultTryTimeout))
	case c.DrainTimeout < 0:
		return bad("DrainTimeout", c.DrainTimeout, fmt.Sprintf("use a positive duration (zero means the default, %v)", defaultDrainTimeout))
	case c.CleanupInterval < 0:
		return bad("CleanupInterval", c.CleanupInterval, fmt.Sprintf("use a positive duration (zero means the default, %v)", defaultCleanupInterval))
	}
	if c.DrainTimeout >= c.Sarama.Consumer.Group.Rebalance.Timeout {
		return &outbox.ConfigError{Field: "DrainTimeout", Reason: fmt.Sprintf(
			"%v is not below Sarama.Consumer.Group.Rebalance.Timeout %v: a member still draining when the rebalance times out is thrown out of the group",
			c.DrainTimeout, c.Sarama.Consumer.Group.Rebalance.Timeout)}
	}
	return nil
}

// validateRoutes checks the routes and the dead-letter topic.
func (c Config) validateRoutes() error {
	if len(c.Routes) == 0 {
		return &outbox.ConfigError{Field: "Routes", Reason: "is empty: route at least one topic to a handler"}
	}
	seen := map[[2]string]bool{}
	for i, r := range c.Routes {
		if err := outbox.ValidateTopic(r.Topic); err != nil {
			return &outbox.ConfigError{Field: fmt.Sprintf("Routes[%d].Topic", i), Reason: err.Error()}
		}
		if r.Handler == nil {
			return &outbox.ConfigError{Field: fmt.Sprintf("Routes[%d].Handler", i), Reason: "is nil: give the route a Handler"}
		}
		k := [2]string{r.Topic, r.Type}
		if seen[k] {
			return &outbox.ConfigError{Field: fmt.Sprintf("Routes[%d]", i), Reason: fmt.Sprintf("routes topic %q, type %q a second time: one handler per topic and type", r.Topic, r.Type)}
		}
		seen[k] = true
	}
	if c.DeadLetterTopic == "" {
		return nil
	}
	if err := outbox.ValidateTopic(c.DeadLetterTopic); err != nil {
		return &outbox.ConfigError{Field: "DeadLetterTopic", Reason: err.Error()}
	}
	for _, r := range c.Routes {
		if r.Topic == c.DeadLetterTopic {
			return &outbox.ConfigError{Field: "DeadLetterTopic", Reason: fmt.Sprintf("%q is also a routed topic: the consumer would read its own dead letters; use a topic no route reads", c.DeadLetterTopic)}
		}
	}
	return nil
}
