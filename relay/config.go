package relay

import (
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/defaults"
	"github.com/fxoutbox/outbox/relay/internal/eo"
)

// Config configures a Relay. The zero value means every default.
type Config struct {
	// Table is the outbox table. Default: outbox_event in the search_path.
	Table outbox.Table
	// Mode is Poll (default: claim unpublished rows from the table) or
	// Stream (follow the table's inserts in a logical replication slot;
	// see Stream and the package documentation).
	Mode Mode `env:"OUTBOX_RELAY_MODE"`
	// Stream configures the Stream mode.
	Stream StreamConfig `env:""`
	// PollInterval is the period of the relay's ticker: the longest an event
	// waits when no wake-up reaches the relay. Default 500ms.
	PollInterval time.Duration `env:"OUTBOX_POLL_INTERVAL"`
	// BatchSize is the most rows one claim takes when the relay is keeping
	// up (1-10000). Default 50.
	BatchSize int `env:"OUTBOX_BATCH_SIZE"`
	// MaxBatchSize is the most rows one claim takes while a backlog drains:
	// after a full batch the next claim takes twice as many (four times
	// under ExactlyOnce), up to MaxBatchSize, and the first claim that is
	// not full returns to
	// BatchSize. Larger batches cut the per-batch cost (statements, round
	// trips, commit) over more events: draining a backlog with batches of
	// 500 is about 2.4x faster than with batches of 50. A crash then repeats
	// up to MaxBatchSize events instead of BatchSize. Set it to BatchSize
	// for fixed batches. Under ExactlyOnce each batch is a Kafka
	// transaction, whose fixed cost larger batches share, and a crash
	// repeats no event. BatchSize-10000. Default 500, or 5000 under
	// ExactlyOnce in Mode Poll, or BatchSize if larger.
	MaxBatchSize int `env:"OUTBOX_MAX_BATCH_SIZE"`
	// Workers is how many batches one relay has in flight, each in its own
	// transaction on its own lanes (under PerKey ordering a lane is still
	// published by one worker at a time, so order holds). A second worker
	// claims while the first publishes: it helps when the broker is far
	// (publishing waits on the network) and cores are free, and adds
	// little when PostgreSQL already keeps the machine busy. A crash of the
	// process repeats up to Workers batches instead of one. In Stream mode
	// one goroutine follows the stream and Workers is not used. 1-64.
	// Default 1.
	Workers int `env:"OUTBOX_WORKERS"`
	// Ordering is PerKey (default: each key's events reach Kafka in the
	// order they were written, with any number of replicas) or Unordered.
	Ordering Ordering `env:"OUTBOX_ORDERING"`
	// Delivery is AtLeastOnce (default) or ExactlyOnce: each batch in a
	// Kafka transaction with a progress record for each of its lanes, for
	// read_committed consumers that see each event once (see
	// docs/exactly-once.md). ExactlyOnce needs Ordering PerKey and a
	// SaramaPublisher, and commits each batch's marks synchronously; in
	// Mode Stream it needs cursor progress (Progress cursor, or auto on a
	// table that records it), and each batch of the stream is one
	// transaction with the stream's record (see docs/streaming.md).
	// Default at-least-once.
	Delivery Delivery `env:"OUTBOX_DELIVERY"`
	// Progress is ProgressCursor (the lanes' positions are recorded once
	// per batch, and nothing is written per event; it needs the cursor
	// migration and Ordering PerKey; in Stream mode it is what lets the
	// stream publish what it decodes, see docs/streaming.md),
	// ProgressMarks (published_at is set on each delivered row) or
	// ProgressAuto (cursor on a table migrations.Install made, or one
	// already in cursor progress, or a partitioned one; marks otherwise,
	// and under Ordering Unordered; decided when the relay first reads the
	// table; see ProgressAuto). Default auto.
	Progress Progress `env:"OUTBOX_PROGRESS"`
	// TransactionTimeout is the Kafka transaction timeout of ExactlyOnce:
	// a relay that dies mid-transaction holds read_committed consumers of
	// the partitions it wrote back at most this long (plus the broker's
	// transaction.abort.timed.out.transaction.cleanup.interval.ms) when no
	// other relay takes its lane first. At most BatchTimeout, and at most the broker's
	// transaction.max.timeout.ms. Default 10s.
	TransactionTimeout time.Duration `env:"OUTBOX_TRANSACTION_TIMEOUT"`
	// ProgressTopic is the compacted, one-partition topic where
	// ExactlyOnce writes each lane's progress; the relay creates it when
	// missing. Default "fxoutbox.progress.<table>" with no Table.Schema
	// (e.g. fxoutbox.progress.outbox_event), "fxoutbox.progress.<schema>.<table>"
	// with one; characters Kafka does not take in a topic name become '_'.
	ProgressTopic string `env:"OUTBOX_PROGRESS_TOPIC"`
	// TransactionalID is the prefix of ExactlyOnce's Kafka transactional
	// ids: "<TransactionalID>.<relay>.<n>", where <relay> is random per
	// relay and <n> numbers its workers. No other producer may use ids
	// with this prefix. Default "fxoutbox.<table>" with no Table.Schema,
	// "fxoutbox.<schema>.<table>" with one.
	TransactionalID string `env:"OUTBOX_TRANSACTIONAL_ID"`
	// Lanes is the number of lanes keys are hashed into under PerKey
	// ordering: the unit one relay replica claims. More lanes spread keys
	// over more replicas; every relay on a table must use the same number
	// (change it only with all relays stopped). 1-4096. Default 64.
	Lanes int `env:"OUTBOX_LANES"`
	// MaxAttempts is how many permanent failures (see outbox.PermanentError) an
	// event may have before it is parked; its attempts are paced like its
	// retries (see Failures in the package documentation). Events the relay
	// cannot read or send, those the broker refuses alone for good (too
	// large for the topic) and those for a missing topic are parked at once.
	// Default 5.
	MaxAttempts int `env:"OUTBOX_MAX_ATTEMPTS"`
	// Poison says what happens to an event that keeps failing permanently:
	// Park (default) sets it aside, so its key's later events flow on
	// without it; Hold retries it forever, keeping its key's order but
	// blocking the key until an operator acts.
	Poison outbox.PoisonPolicy `env:"OUTBOX_POISON"`
	// MaxMessageBytes is the largest record the relay sends, counted as
	// the writers count it (key, value, headers, and the record and
	// batch overhead a broker compares with message.max.bytes); larger
	// events are parked at once. Give the writers the same number as
	// outbox.Limits.MaxRecordBytes (the fxoutbox module does), so that every
	// event they accept can be sent. It must not exceed the topics'
	// max.message.bytes (by default the broker's message.max.bytes,
	// 1,048,588), and sarama's Producer.MaxMessageBytes (default 1,048,576)
	// must be at least MaxMessageBytes - 61, since sarama counts a record
	// without the 61-byte batch header. Default 1,048,588
	// (outbox.DefaultMaxRecordBytes), which fits all three defaults.
	MaxMessageBytes int
	// Listen makes the relay LISTEN on the table's channel
	// (<name>_wakeup; see docs/operating.md) on a dedicated connection and poll as soon as a
	// writer in another process sends a NOTIFY (unitofwork.Notifier). The
	// connection comes from the DB, which must then be a *pgxpool.Pool; it
	// is re-established with backoff when lost, and the ticker covers the
	// gap. In Stream mode the relay does not listen (the stream wakes it).
	// Default false.
	Listen bool
	// Retention is how long published rows are kept before the relay
	// deletes them, in batches of CleanupBatch rows every CleanupInterval.
	// Default 72h; a negative value disables the deletion. On a partitioned
	// table (migrations.Partitioned) the relay deletes no row: it drops a
	// partition once Retention has passed since its upper bound and every
	// lane delivered it (docs/partitions.md).
	Retention time.Duration `env:"OUTBOX_RETENTION,forever"`
	// CleanupInterval is the period of the deletion of old published rows.
	// Default 1m.
	CleanupInterval time.Duration `env:"OUTBOX_CLEANUP_INTERVAL"`
	// CleanupBatch is the most rows one deletion statement removes, so it
	// never holds many locks or a long transaction. 1-100000. Default 1000.
	CleanupBatch int `env:"OUTBOX_CLEANUP_BATCH"`
	// BatchTimeout bounds one batch: claim, publish, mark and commit. On
	// expiry the batch is abandoned and its rows stay unpublished. It also
	// sets the server-side idle_in_transaction_session_timeout of the batch's
	// transaction (BatchTimeout + 5s). Default 30s.
	BatchTimeout time.Duration `env:"OUTBOX_BATCH_TIMEOUT"`
	// SynchronousCommit makes each batch's COMMIT wait for its WAL flush,
	// as the session's synchronous_commit says. By default a batch commits
	// with synchronous_commit=off: its marks are all it writes, and marks
	// lost in a crash of the database server (at most 3 x wal_writer_delay,
	// 600ms by default) only make the next relay publish those events again,
	// as at-least-once delivery allows (same x-event-id, order kept). The
	// relay then does not wait for a disk flush per batch, and its commits do
	// not queue behind the writers' flushes. Default false.
	SynchronousCommit bool `env:"OUTBOX_SYNCHRONOUS_COMMIT"`
	// MaxBackoff caps the wait after consecutive failed batches, and between
	// the retries of a failed event; the wait starts at PollInterval and
	// doubles, with jitter. Default 30s (or PollInterval, if longer).
	MaxBackoff time.Duration `env:"OUTBOX_MAX_BACKOFF"`
	// Logger receives the relay's logs: one line when publishing starts to
	// fail, and one when it recovers. No payloads or header values are
	// logged. Default: slog.Default().
	Logger *slog.Logger
	// TracerProvider creates the publish spans. Default: otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// MeterProvider creates the relay's metrics (see the Metric constants).
	// Default: otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// StatsInterval is how often the relay that reports the table-wide
	// gauges (outbox.backlog, outbox.oldest.age, outbox.parked) reads them,
	// and how often the other relays try to become that reporter; scrapes
	// read the last result. The reporter holds a session-level advisory lock
	// on a connection it takes out of the pool (a *pgxpool.Pool; with any
	// other DB every relay reports). After a slow read (a large backlog to
	// count) the next waits at least ten times as long as it took.
	// Default 1s.
	StatsInterval time.Duration `env:"OUTBOX_STATS_INTERVAL"`
	// Propagator reads the stored trace context and writes the publish
	// span's into the Kafka headers. Default: W3C trace context and baggage.
	Propagator propagation.TextMapPropagator
	// CloudEvents makes the relay also send each record in the binary
	// content mode of the CloudEvents Kafka protocol binding (Mode
	// outbox.CloudEventsBinary): headers ce_specversion "1.0", ce_id (the
	// event id), ce_source (CloudEvents.Source, required then), ce_type (the
	// event type), ce_time (the row's created_at, RFC 3339 in UTC) and
	// content-type "application/json", besides x-event-id, x-event-type and
	// the trace context; key and value stay the same. A stored header of one
	// of those six names is replaced by the relay's. Give the writers the
	// same value (outbox.Limits.CloudEvents) so that they count these
	// headers in MaxRecordBytes. Both modes, Poll and Stream, send them.
	// Default: off.
	CloudEvents outbox.CloudEvents `env:""`
}

// The defaults and bounds of Config: the one place each is written. The
// field comments, withDefaults, validate, and through fxoutbox the
// environment variables' documentation, all follow these (a test compares
// the field comments with them).
const (
	defaultPollInterval    = 500 * time.Millisecond
	minPollInterval        = time.Millisecond
	defaultBatchSize       = 50
	maxBatchSize           = 10000 // bound of BatchSize and MaxBatchSize
	defaultMaxBatchSize    = 500   // or BatchSize, if larger
	defaultEOMaxBatchSize  = 5000  // under ExactlyOnce in Mode Poll
	defaultWorkers         = 1
	maxWorkers             = 64
	defaultLanes           = 64
	maxLanes               = 4096
	defaultMaxAttempts     = 5
	defaultRetention       = 72 * time.Hour
	defaultCleanupInterval = time.Minute
	defaultCleanupBatch    = 1000
	maxCleanupBatch        = 100000
	defaultBatchTimeout    = 30 * time.Second
	minBatchTimeout        = 100 * time.Millisecond
	defaultMaxBackoff      = 30 * time.Second // or PollInterval, if longer
	defaultStatsInterval   = time.Second
	defaultTxnTimeout      = 10 * time.Second
	minTxnTimeout          = time.Second
	minStatsInterval       = 10 * time.Millisecond
	// defaultMaxMessageBytes is outbox.DefaultMaxRecordBytes.
	defaultMaxMessageBytes = outbox.DefaultMaxRecordBytes
)

// withDefaults sets each zero field to its default. It leaves other values,
// negative ones included, to validate.
func (c Config) withDefaults() Config {
	c.Table = c.Table.WithDefaults()
	if c.Mode == Stream {
		c.Stream = c.Stream.withDefaults()
	}
	defaults.Set(&c.PollInterval, defaultPollInterval)
	defaults.Set(&c.BatchSize, defaultBatchSize)
	maxBatch := defaultMaxBatchSize
	if c.Delivery == ExactlyOnce && c.Mode == Poll {
		maxBatch = defaultEOMaxBatchSize
	}
	defaults.Set(&c.MaxBatchSize, max(maxBatch, c.BatchSize))
	defaults.Set(&c.MaxAttempts, defaultMaxAttempts)
	defaults.Set(&c.MaxMessageBytes, defaultMaxMessageBytes)
	defaults.Set(&c.Retention, defaultRetention)
	defaults.Set(&c.CleanupInterval, defaultCleanupInterval)
	defaults.Set(&c.CleanupBatch, defaultCleanupBatch)
	defaults.Set(&c.Lanes, defaultLanes)
	defaults.Set(&c.Workers, defaultWorkers)
	defaults.Set(&c.BatchTimeout, defaultBatchTimeout)
	defaults.Set(&c.MaxBackoff, max(defaultMaxBackoff, c.PollInterval))
	defaults.Set(&c.StatsInterval, defaultStatsInterval)
	defaults.Set(&c.TransactionTimeout, min(defaultTxnTimeout, c.BatchTimeout))
	if c.Delivery == ExactlyOnce {
		defaults.Set(&c.ProgressTopic, eo.TopicName("fxoutbox.progress.", c.Table.String()))
		defaults.Set(&c.TransactionalID, eo.TopicName("fxoutbox.", c.Table.String()))
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.MeterProvider == nil {
		c.MeterProvider = otel.GetMeterProvider()
	}
	if c.Propagator == nil {
		c.Propagator = defaults.Propagator()
	}
	return c
}

// Validate returns the configuration error New would return for c, with
// the defaults applied, without a database or a publisher: to check a
// configuration read at start-up before anything is built.
func (c Config) Validate() error { return c.withDefaults().validate() }

// validate checks a Config after withDefaults: a negative value is an
// error (except Retention, where it disables the deletion), and each error
// names the field, its range and its default.
func (c Config) validate() error {
	if err := c.Table.Validate(); err != nil {
		return err
	}
	bad := func(field string, v any, want string) error {
		return &outbox.ConfigError{Field: field, Reason: fmt.Sprintf("is %v: %s", v, want)}
	}
	switch {
	case c.PollInterval < minPollInterval:
		return bad("PollInterval", c.PollInterval, fmt.Sprintf("use at least %v (zero means the default, %v)", minPollInterval, defaultPollInterval))
	case c.BatchSize < 1 || c.BatchSize > maxBatchSize:
		return bad("BatchSize", c.BatchSize, fmt.Sprintf("use 1 to %d (zero means the default, %d)", maxBatchSize, defaultBatchSize))
	case c.MaxBatchSize < c.BatchSize || c.MaxBatchSize > maxBatchSize:
		return bad("MaxBatchSize", c.MaxBatchSize, fmt.Sprintf("use BatchSize (%d) to %d (zero means the default, %d or BatchSize if larger)", c.BatchSize, maxBatchSize, defaultMaxBatchSize))
	case c.Mode != Poll && c.Mode != Stream:
		return bad("Mode", c.Mode, "use relay.Poll or relay.Stream")
	case c.Ordering != PerKey && c.Ordering != Unordered:
		return bad("Ordering", c.Ordering, "use relay.PerKey or relay.Unordered")
	case c.Workers < 1 || c.Workers > maxWorkers:
		return bad("Workers", c.Workers, fmt.Sprintf("use 1 to %d (zero means the default, %d)", maxWorkers, defaultWorkers))
	case c.Lanes < 1 || c.Lanes > maxLanes:
		return bad("Lanes", c.Lanes, fmt.Sprintf("use 1 to %d (zero means the default, %d)", maxLanes, defaultLanes))
	case c.BatchTimeout < minBatchTimeout:
		return bad("BatchTimeout", c.BatchTimeout, fmt.Sprintf("use at least %v (zero means the default, %v)", minBatchTimeout, defaultBatchTimeout))
	case c.MaxAttempts < 1:
		return bad("MaxAttempts", c.MaxAttempts, fmt.Sprintf("use a positive number (zero means the default, %d)", defaultMaxAttempts))
	case c.MaxMessageBytes < 1:
		return bad("MaxMessageBytes", c.MaxMessageBytes, fmt.Sprintf("use a positive number of bytes (zero means the default, %d)", defaultMaxMessageBytes))
	case c.Poison != outbox.Park && c.Poison != outbox.Hold:
		return bad("Poison", int(c.Poison), "use outbox.Park or outbox.Hold")
	case c.CleanupInterval < 0:
		return bad("CleanupInterval", c.CleanupInterval, fmt.Sprintf("use a positive duration (zero means the default, %v)", defaultCleanupInterval))
	case c.CleanupBatch < 0 || c.CleanupBatch > maxCleanupBatch:
		return bad("CleanupBatch", c.CleanupBatch, fmt.Sprintf("use 1 to %d (zero means the default, %d)", maxCleanupBatch, defaultCleanupBatch))
	case c.StatsInterval < minStatsInterval:
		return bad("StatsInterval", c.StatsInterval, fmt.Sprintf("use at least %v (zero means the default, %v)", minStatsInterval, defaultStatsInterval))
	case c.MaxBackoff < c.PollInterval:
		return bad("MaxBackoff", c.MaxBackoff, fmt.Sprintf("use at least PollInterval (%v); zero means the default, %v or PollInterval if longer", c.PollInterval, defaultMaxBackoff))
	}
	if err := c.validateDelivery(); err != nil {
		return err
	}
	if err := c.validateProgress(); err != nil {
		return err
	}
	if err := c.CloudEvents.Validate(); err != nil {
		return err
	}
	if c.Mode == Stream {
		return c.Stream.validate()
	}
	return nil
}

// validateDelivery checks Delivery and the settings ExactlyOnce uses.
func (c Config) validateDelivery() error {
	bad := func(field string, v any, want string) error {
		return &outbox.ConfigError{Field: field, Reason: fmt.Sprintf("is %v: %s", v, want)}
	}
	switch {
	case c.Delivery == AtLeastOnce:
		return nil
	case c.Delivery != ExactlyOnce:
		return bad("Delivery", c.Delivery, "use relay.AtLeastOnce or relay.ExactlyOnce")
	case c.Mode == Stream && c.Progress == ProgressMarks:
		return bad("Delivery", c.Delivery, "needs Progress cursor in Mode Stream: the exactly-once stream publishes what it decodes and keeps its progress in the progress topic; set Progress to relay.ProgressCursor (OUTBOX_PROGRESS=cursor, with the cursor migration), or use Mode Poll")
	case c.Ordering != PerKey:
		return bad("Delivery", c.Delivery, "needs Ordering PerKey: its transactions are bound to lanes")
	case c.TransactionTimeout < minTxnTimeout || c.TransactionTimeout > c.BatchTimeout:
		return bad("TransactionTimeout", c.TransactionTimeout, fmt.Sprintf("use %v to BatchTimeout (%v) (zero means the default, %v or BatchTimeout if shorter)", minTxnTimeout, c.BatchTimeout, defaultTxnTimeout))
	}
	return nil
}
