// Package relay is the publish side of the outbox: it claims unpublished
// rows, publishes them to Kafka and marks them published, in one short
// database transaction per batch.
//
// # The loop
//
// A started Relay runs one goroutine (Workers). Each batch it claims up to
// BatchSize events (50), publishes them through its [Publisher] (acks=all,
// idempotent: see [NewSaramaPublisher]), sets published_at on the
// acknowledged ones and commits, with synchronous_commit off unless
// SynchronousCommit is set. While events are waiting it claims the next
// batch at once, twice as large after a full one, up to MaxBatchSize (500),
// so a backlog drains in few large transactions and a relay that keeps up
// claims small ones; when it has caught up it waits for its time.Ticker
// (PollInterval, default 500 ms) or
// for a wake-up: [Relay.Wake], which the fxoutbox module calls when an
// in-process UnitOfWork commits, or, with Listen, a NOTIFY from writers in
// other processes (unitofwork.Notifier). [Relay.RunOnce] runs one batch
// without the loop.
//
// # Order per key, with many replicas
//
// Several relays, in one process or many, may share a table. Under the
// default [PerKey] ordering, partition keys hash into Lanes (64). A claim
// looks at the lanes of the oldest unpublished events and, in the same
// statement, takes transaction-scoped advisory locks on enough of them to
// cover a batch (pg_try_advisory_xact_lock: lanes another relay holds are
// skipped, never waited for); then, in a new statement whose snapshot is
// taken after the locks were granted, it reads those lanes' events in id
// order. One relay at a time publishes a lane, and it sees everything the
// previous holder marked, so each key's first deliveries keep write order
// through crashes.
//
// The claim's window is the oldest unpublished rows (twice the batch); when
// other relays hold the lanes of its first rows it tries the window's other
// lanes, and it grows the window (4x, up to 32 times the batch) only while
// some lane has not been seen: once every lane has been tried it takes what
// it got, possibly a short batch or nothing, and the relays holding the
// other lanes drain them. So replicas share a backlog by lanes, each reading
// about its own share of rows: on 2 cores, 2 to 4 relays drain a backlog at
// least as fast as one, at about the same PostgreSQL CPU per event (see
// docs/benchmarks.md in the repository). A worker that a wake-up found
// only events of lanes other relays hold defers the wake-ups of the next
// PollInterval/10 (at most 50ms) to its end, so that when every commit
// wakes every replica (Listen) the others do not claim once per commit.
// [Unordered] uses the classic "ORDER BY id FOR UPDATE SKIP LOCKED" claim:
// a little faster, but two replicas can publish one key's events out of
// order.
//
// # Streaming from the WAL
//
// With Mode [Stream] the relay does not poll: it reads the table's
// committed inserts from a logical replication slot (the built-in pgoutput
// plugin, protocol 1, over the publication [outbox.Table.Publication],
// FOR TABLE the outbox WITH (publish = 'insert'), which the migrations
// create), in commit order, and publishes them through the same path as
// the polling claim: same messages, headers, spans, metrics, parking and
// marks. PostgreSQL needs wal_level = logical, and the relay's role
// REPLICATION. The relay creates the slot ([outbox.Table.Slot] of the
// database) when it is missing.
//
// On every connection, before it follows the stream, the relay publishes
// the events waiting in the table with the polling claim (a "sweep"): rows
// written before the slot existed, and rows a previous relay left. Each
// stream batch then runs one transaction: one UPDATE claims its rows by
// marking published those still unpublished whose lane it holds or gets
// (try-locks, as polling relays take lanes) and whose key has no older
// unpublished row outside the batch (rows published meanwhile, by a sweep,
// a polling relay or before a restart that made the server send them
// again, are skipped: an UPDATE re-checks rows changed after its
// snapshot); the relay publishes them, takes the mark back from those that
// failed, and commits. Only then does it confirm
// the batch's end to the server ([StreamStatus].Confirmed): a position is
// confirmed only when every event before it is published, parked, or
// waiting in the table. Rows of a key that waits behind an older row (a
// failed event waiting for its paced retry, a requeued one) or whose lane
// another relay holds are left to a sweep, which runs while such rows wait
// (every PollInterval) and every SweepInterval (2s, for requeued events),
// and takes only rows behind the stream's position. So the table stays the
// source of truth: backlog, parking, Requeue, retention and the polling
// relay work as before, and switching modes in either direction, even with
// relays of both modes running at once, loses nothing and keeps each key's
// order.
//
// Duplicates, as in polling: a crash of the relay repeats at most the
// batch in flight (up to MaxBatchSize events); a crash of PostgreSQL also
// the batches whose asynchronously committed marks it lost (those of the
// last 3 x wal_writer_delay, 600ms by default; none with
// SynchronousCommit), which the relay publishes again from the table when
// it reconnects.
//
// One relay per table streams: a slot admits one connection, so the
// others stand by ([StreamStandby]) and try every StandbyRetry (1s); when
// the streaming relay stops or dies its connection closes and a standby
// takes over. A slot the server invalidated (it fell further behind than
// max_slot_wal_keep_size) makes the relay log what happened and how to fix
// it and publish by polling ([StreamFallback]); it looks at the slot again
// every RetryInterval (1m), and creates a new one once an operator dropped
// the invalid one. The slot pins WAL until the relay confirms it: the
// metrics outbox.stream.lag (bytes) and outbox.stream.delay (seconds)
// show how far behind it is, and [Relay.Health] fails past
// StreamConfig.MaxLagBytes (1 GiB) or MaxLag (30s). In-progress
// transactions are never streamed (they could still roll back).
//
// # Exactly once
//
// With Delivery [ExactlyOnce] each batch is one Kafka transaction of the
// worker that runs it (transactional id "<TransactionalID>.<relay>.<n>"),
// holding the batch's events and, per lane, a progress record (the lane's
// owner and the event ids published) in a compacted, one-partition
// progress topic; the marks follow Kafka's commit, committed
// synchronously. A worker that publishes a lane it does not own first
// initialises the lane's recorded owner (which fences it and aborts its
// open transaction), marks the events of the lane's last committed record,
// and commits a record naming itself the owner. So each event reaches each
// read_committed consumer once, in per-key order, across any crash. It
// needs Mode Poll, Ordering PerKey and a [SaramaPublisher]; the README's
// "Exactly once" says why it is correct and what it costs.
//
// # Failures
//
// The relay tells failures of the whole from failures of single events, and
// only the first make it wait.
//
// A batch that fails as a whole (the database errs, or the publish fails
// transiently with nothing acknowledged: broker unavailable, timeout, lost
// connection) leaves its events unpublished and charges nothing; that worker
// backs off exponentially with jitter (PollInterval up to MaxBackoff)
// instead of spinning, logs the failure once and logs again when it
// recovers.
//
// A failure of single events holds back only those events and their keys.
// A permanent failure ([outbox.PermanentError]: too large, invalid or missing topic,
// rejected record) is charged to its event (attempts, last_error); a
// transient one of a single event, in a batch whose other events went
// through, is not. Either way the event and its key are left out of the
// claims until its retry is due: PollInterval after the first failure,
// doubling up to MaxBackoff, kept in the relay's memory (a restarted relay
// or another replica retries at once, then paces too). The other keys flow
// meanwhile, and later events of the failed key wait, so its order holds.
// An event is parked ([outbox.Park]) and no longer blocks its key:
//   - at once, when the relay cannot read, decode or send it: a stored row
//     PostgreSQL cannot print (a data error, SQLSTATE class 22 or 54, found
//     under a savepoint and parked by a statement that does not read it),
//     stored headers that are not a JSON object of strings, an invalid topic
//     name, a message over MaxMessageBytes;
//   - at once, when the broker refuses it sent alone for what it is (too
//     large for the topic, an invalid record; a broker refuses a partition's
//     whole record batch for one bad record, so the events failing in a bulk
//     send are sent again in halves until those failing on their own are
//     found, and only those are charged), or its topic does not exist;
//   - after MaxAttempts paced attempts for the other permanent failures.
//
// Under [outbox.Hold] nothing is parked: the event is charged and retried, paced,
// forever, its key waiting. Parked or held events never make [Relay.Health]
// fail (a held one shows in the backlog's age). last_error says what was
// wrong and what to do. Package admin (admin.ListParked, admin.Requeue)
// and the outboxctl command filter, show, requeue and delete them, and
// replay published events.
//
// # Bounds
//
// Each batch runs under BatchTimeout (default 30 s). Its transaction also sets
// idle_in_transaction_session_timeout, so a relay that hangs or is frozen
// while holding rows loses its locks on the server side and another relay
// takes them over. Published rows are deleted after Retention (72 h), in
// statements of CleanupBatch rows.
//
// # Observability
//
// For every event the relay starts a span "publish <topic>" (kind producer,
// attributes messaging.system=kafka, messaging.operation.name=publish,
// messaging.operation.type=send, messaging.destination.name,
// messaging.message.id, messaging.kafka.message.key) whose parent is the
// trace context stored with the event, and sends the span's context as the
// W3C traceparent/tracestate headers. A consumer that extracts them continues
// the trace of the request that wrote the event. A failed span has status
// Error and error.type; when the Publisher reports where the broker stored
// the message ([Message].Stored) the span gets
// messaging.destination.partition.id, messaging.kafka.offset, server.address
// and server.port, and a [ClientIdentifier] adds messaging.client.id.
//
// Metrics: the messaging conventions' client metrics
// (messaging.client.sent.messages, messaging.client.operation.duration) and
// the outbox's own: published events, publish errors, failed steps and the
// duration of each step (claim, publish, mark, commit, cleanup), batch
// size, write-to-ack latency, time since the last publish, and the
// table-wide backlog, oldest age and parked events, which one relay per
// table reports (see [MetricPublished] for every name, unit and attribute,
// and docs/operating.md in the repository for the Prometheus names, alert
// rules and a dashboard). Every error is named by its cause with
// [ErrorType] (broker_unreachable, tls, authentication, kafka.<code>,
// database.connection, ...) on metrics, spans, logs and in a parked event's
// last_error. [Relay.Health] serves readiness probes; logs never carry
// payloads or header values.
package relay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/backoff"
	"github.com/fxoutbox/outbox/internal/dberr"
	"github.com/fxoutbox/outbox/internal/parklog"
	"github.com/fxoutbox/outbox/relay/internal/cursor"
	"github.com/fxoutbox/outbox/relay/internal/tablestats"
)

// DB begins transactions: normally the application's *pgxpool.Pool.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Relay publishes committed outbox events. Start it once; Stop it once.
// RunOnce may be used instead of Start, e.g. from a scheduler.
type Relay struct {
	db  DB
	pub Publisher
	cfg Config
	q   queries
	// txSettings and idleMillis set each batch transaction (see txSettings).
	txSettings, idleMillis string
	tracer                 trace.Tracer
	metrics                *metrics
	stats                  *tablestats.Reporter // the table-wide gauges' statistics
	health                 health

	wakes   []chan struct{} // one per worker
	kicks   []chan struct{} // one per worker: end its backoff now (Health)
	failLog failLog
	pacer   pacer
	missing missingTopics
	parkLog *parklog.Log // lines of parked events: the first per cause, then summaries
	// failedLog: lines of permanent failures not parked yet (MaxAttempts),
	// likewise.
	failedLog *parklog.Log
	// growAfter (unix nanoseconds): until then claims do not grow their
	// window (see lockLanes).
	growAfter atomic.Int64
	stream    streamInfo
	eo        *exactlyOnce // Delivery ExactlyOnce: the lanes' transactional producers
	cur       *cursorState // Progress ProgressCursor: the lanes' positions
	// marksChecked: a check found the table not in cursor mode (see
	// checkMarks).
	marksChecked atomic.Bool
	// parts: whether the table is partitioned, and the last upkeep's word
	// (partitions.go).
	parts partitions

	mu       sync.Mutex
	started  bool
	stop     chan struct{}      // closed by Stop: finish the batch, then return
	cancel   context.CancelFunc // aborts the in-flight batch
	done     chan struct{}      // closed when the publish loop has returned
	bgCancel context.CancelFunc // ends the listener and the cleaner
	bg       sync.WaitGroup
	gauges   metric.Registration
}

// ErrStarted is returned by Start on a relay that was already started.
var ErrStarted = errors.New("relay: already started")

// New returns a relay that claims rows from db and publishes them through
// pub. A nil cfg means the defaults. It does no I/O.
func New(db DB, pub Publisher, cfg *Config) (*Relay, error) {
	if db == nil {
		return nil, &outbox.ConfigError{Field: "db", Reason: "is nil: pass the application's *pgxpool.Pool"}
	}
	if pub == nil {
		return nil, &outbox.ConfigError{Field: "publisher", Reason: "is nil: pass a Publisher, e.g. from NewSaramaPublisher"}
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	c = c.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	if _, ok := db.(*pgxpool.Pool); c.Mode == Stream && c.Stream.ConnConfig == nil && !ok {
		return nil, &outbox.ConfigError{Field: "Stream.ConnConfig", Reason: "is needed for the replication connection when the DB is not a *pgxpool.Pool"}
	}
	if _, ok := db.(acquirer); c.Listen && !ok {
		return nil, &outbox.ConfigError{Field: "Listen", Reason: "needs a dedicated connection: pass a *pgxpool.Pool as the DB"}
	}
	var err error
	r := &Relay{
		db:     db,
		pub:    pub,
		cfg:    c,
		q:      newQueries(c.Table),
		tracer: c.TracerProvider.Tracer("github.com/fxoutbox/outbox/relay"),
		wakes:  make([]chan struct{}, c.Workers),
		kicks:  make([]chan struct{}, c.Workers),
	}
	if c.Delivery == ExactlyOnce {
		if r.eo, err = newExactlyOnce(pub, c); err != nil {
			return nil, err
		}
	}
	if c.Progress == ProgressCursor {
		r.cur = &cursorState{q: cursor.NewQueries(c.Table, cursorTable(c.Table), cursorCols)}
		r.q.cleanup = r.cur.q.Cleanup
	}
	r.parkLog, r.failedLog = newParkLog(c.Logger), newFailedLog(c.Logger)
	for i := range r.wakes {
		r.wakes[i] = make(chan struct{}, 1)
		r.kicks[i] = make(chan struct{}, 1)
	}
	r.health.init(c.Workers)
	r.txSettings, r.idleMillis = txSettings(c)
	m, err := newMetrics(r, c.MeterProvider)
	if err != nil {
		return nil, fmt.Errorf("relay: metrics: %w", err)
	}
	r.metrics = m
	r.stats = newStatsReporter(r)
	return r, nil
}

// Config returns the relay's configuration, defaults filled in.
func (r *Relay) Config() Config { return r.cfg }

// Start starts the relay's goroutine and returns at once. The goroutine does
// not use ctx; Stop ends it.
func (r *Relay) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started {
		return ErrStarted
	}
	if r.cfg.Mode == Stream {
		if err := r.checkStream(ctx); err != nil {
			return err
		}
	}
	// A table that is not ready, or in the other progress mode, fails the
	// start; a database that cannot be reached does not (the batches check
	// again, as they wait for it).
	check := r.checkMarks
	if r.cur != nil {
		check = r.cursorReady
	}
	if err := check(ctx); err != nil && !dberr.Is(err) {
		return err
	}
	gauges, err := r.metrics.register()
	if err != nil {
		return fmt.Errorf("relay: register metrics: %w", err)
	}
	r.started, r.gauges = true, gauges
	base := context.WithoutCancel(ctx)
	runCtx, cancel := context.WithCancel(base)
	bgCtx, bgCancel := context.WithCancel(base)
	r.stop, r.cancel, r.done, r.bgCancel = make(chan struct{}), cancel, make(chan struct{}), bgCancel
	var loops sync.WaitGroup
	if r.cfg.Mode == Stream {
		loops.Add(1)
		go func() { defer loops.Done(); r.runStream(runCtx) }()
	} else {
		for i := range r.wakes {
			loops.Add(1)
			go func() { defer loops.Done(); r.loop(runCtx, i, nil) }()
		}
	}
	go func() { loops.Wait(); close(r.done) }()
	if r.cfg.Listen && r.cfg.Mode == Poll {
		r.bg.Add(1)
		go func() { defer r.bg.Done(); r.listen(bgCtx) }()
	}
	r.bg.Add(1)
	go func() { defer r.bg.Done(); r.stats.Run(bgCtx) }()
	r.bg.Add(1)
	go func() { defer r.bg.Done(); r.parkLog.Run(bgCtx) }()
	r.bg.Add(1)
	go func() { defer r.bg.Done(); r.failedLog.Run(bgCtx) }()
	if r.cfg.Retention > 0 {
		r.bg.Add(1)
		go func() { defer r.bg.Done(); r.clean(bgCtx) }()
	}
	return nil
}

// Stop asks the relay to stop after its in-flight batch and waits for it.
// If ctx ends first, the batch is abandoned (its transaction rolls back, its
// rows stay unpublished for the next relay), Stop still waits for the
// goroutine to return, and returns ctx's error. Stop on a relay that was
// never started returns nil.
func (r *Relay) Stop(ctx context.Context) error {
	r.mu.Lock()
	if !r.started {
		r.mu.Unlock()
		return r.closeKafka()
	}
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	r.mu.Unlock()
	r.bgCancel()
	_ = r.gauges.Unregister()
	// After the last batch: the summary of the events parked since the
	// last one (see newParkLog).
	defer r.parkLog.Flush()
	defer r.failedLog.Flush()
	defer r.bg.Wait()
	defer func() { _ = r.closeKafka() }()
	select {
	case <-r.done:
		r.cancel()
		return nil
	case <-ctx.Done():
		r.cancel()
		<-r.done
		return fmt.Errorf("relay: stop: in-flight batch abandoned: %w", ctx.Err())
	}
}

// Wake makes an idle relay poll now instead of at its next tick. It never
// blocks; wake-ups that arrive while the relay is busy coalesce into one.
func (r *Relay) Wake() {
	for _, w := range r.wakes {
		select {
		case w <- struct{}{}:
		default:
		}
	}
}

// loop is one worker: it claims, publishes and marks batches until Stop,
// or, when until is not nil, until it receives (within PollInterval).
func (r *Relay) loop(ctx context.Context, worker int, until <-chan struct{}) {
	wake := r.wakes[worker]
	ticker := time.NewTicker(r.cfg.PollInterval)
	defer ticker.Stop()
	b := r.newBackoff() // this worker's consecutive failures
	size := r.cfg.BatchSize
	woken := false // the batch runs because of a wake-up
	var quiet time.Time
	for {
		var info batchInfo
		n, next, err := r.runOnce(ctx, size, 0, &info)
		r.health.set(worker, err)
		if woken && n == 0 && next == 0 && err == nil && info.heldElsewhere {
			// Woken for events another relay (or worker) is publishing:
			// wake-ups within wakeQuiet wait for its end (see waitWake). A
			// wake-up that finds no event at all (this worker's own last
			// batch took it) does not make the worker quiet: a relay alone
			// answers every commit at once.
			quiet = time.Now().Add(r.wakeQuiet())
		}
		woken = false
		select {
		case <-r.stop:
			return
		default:
		}
		select {
		case <-until:
			return
		default:
		}
		if err != nil {
			size = r.cfg.BatchSize
			if !r.failed(&b, err, "outbox relay: batch failed; its events stay unpublished and are retried with backoff", r.kicks[worker]) {
				return
			}
			continue
		}
		select { // a kick that came while the batch ran is spent
		case <-r.kicks[worker]:
		default:
		}
		r.recovered(&b)
		if next > 0 {
			// More are waiting: drain them, in larger batches.
			size = next
			continue
		}
		size = r.cfg.BatchSize
		var ok bool
		if woken, ok = r.waitWake(ticker.C, wake, quiet); !ok {
			return
		}
	}
}

// wakeQuiet is how long a worker that a wake-up found nothing for defers
// the next wake-ups: a tenth of PollInterval, at most 50ms.
func (r *Relay) wakeQuiet() time.Duration {
	return min(r.cfg.PollInterval/10, 50*time.Millisecond)
}

// waitWake waits for the ticker or a wake-up; woken reports a wake-up. A
// wake-up before quiet is deferred to quiet, so that when every commit wakes
// several relays (Listen, or Workers > 1), those that keep finding the
// events taken claim at most once per wakeQuiet instead of once per commit,
// while the one that found events answers at once. It returns false once
// the relay is stopping.
func (r *Relay) waitWake(tick <-chan time.Time, wake <-chan struct{}, quiet time.Time) (woken, ok bool) {
	for {
		select {
		case <-r.stop:
			return false, false
		case <-tick:
			return false, true
		case <-wake:
		}
		d := time.Until(quiet)
		if d <= 0 {
			return true, true
		}
		t := time.NewTimer(d)
		select {
		case <-r.stop:
			t.Stop()
			return false, false
		case <-tick:
			t.Stop()
			return false, true
		case <-t.C:
			return true, true
		}
	}
}

// failLog makes the workers of a relay log a failure once when it starts
// (or changes kind) and once when publishing works again.
type failLog struct {
	mu   sync.Mutex
	kind string
}

func (f *failLog) failed(kind string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	changed := f.kind != kind
	f.kind = kind
	return changed
}

func (f *failLog) recovered() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	was := f.kind != ""
	f.kind = ""
	return was
}

// sleep waits d or until kicked, or returns false once the relay is
// stopping.
func (r *Relay) sleep(d time.Duration, kick <-chan struct{}) bool {
	return backoff.Sleep(context.Background(), d, r.stop, kick)
}

// failed counts a failure of a publishing loop (a worker, the stream) in b,
// logs it once per kind of failure (msg), and waits its backoff or until
// kicked; false once the relay is stopping.
func (r *Relay) failed(b *backoff.Backoff, err error, msg string, kick <-chan struct{}) bool {
	d := b.Fail()
	if r.failLog.failed(errorKind(err)) {
		r.cfg.Logger.Warn(msg, "table", r.cfg.Table.String(), "error", err, "error.type", ErrorType(err), "consecutive_failures", b.Failures())
	}
	return r.sleep(d, kick)
}

// recovered follows a success of a publishing loop: it logs that
// publishing works again, once after the relay's loops failed, and resets b.
func (r *Relay) recovered(b *backoff.Backoff) {
	if r.failLog.recovered() {
		r.cfg.Logger.Info("outbox relay: publishing again", "table", r.cfg.Table.String(), "after_failures", b.Failures())
	}
	b.Reset()
}

// kick ends the backoff of every worker that is waiting in one (see Health).
func (r *Relay) kick() {
	for _, k := range r.kicks {
		select {
		case k <- struct{}{}:
		default:
		}
	}
}

// newBackoff returns the backoff of the relay's publishing loops and of
// paced events: PollInterval * 2^(failures-1), capped at MaxBackoff, with
// ±20% jitter so replicas do not retry in step.
func (r *Relay) newBackoff() backoff.Backoff {
	return backoff.Backoff{Initial: r.cfg.PollInterval, Max: r.cfg.MaxBackoff, Jitter: 0.2}
}

// backoff is the wait after failures consecutive failures (see newBackoff).
func (r *Relay) backoff(failures int) time.Duration {
	b := r.newBackoff()
	return b.Delay(failures)
}

// closeKafka closes the client of ExactlyOnce's transactional producers,
// if any, after the last batch.
func (r *Relay) closeKafka() error {
	if r.eo == nil {
		return nil
	}
	return r.eo.close()
}
