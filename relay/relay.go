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
	"github.com/fxoutbox/outbox/relay/internal/eo"
	"github.com/fxoutbox/outbox/relay/internal/failure"
	"github.com/fxoutbox/outbox/relay/internal/marks"
	"github.com/fxoutbox/outbox/relay/internal/pace"
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
	// txSettings and idleMillis set each batch transaction, and
	// sessionSettings the session of a connection a worker keeps (see
	// txSettings).
	txSettings, sessionSettings, idleMillis string

	tracer  trace.Tracer
	metrics *metrics
	stats   *tablestats.Reporter // the table-wide gauges' statistics
	health  health

	wakes   []chan struct{} // one per worker
	kicks   []chan struct{} // one per worker: end its backoff now (Health)
	failLog failLog
	pacer   pace.Pacer
	missing pace.MissingTopics
	parkLog *parklog.Log // lines of parked events: the first per cause, then summaries
	// failedLog: lines of permanent failures not parked yet (MaxAttempts),
	// likewise.
	failedLog *parklog.Log
	stream    streamInfo
	eo        *eo.Pool // Delivery ExactlyOnce: the lanes' transactional producers
	// progress is the relay's progress mode, cur (ProgressCursor: the
	// lanes' positions) and prog (how a polling batch claims and records)
	// go with it; under ProgressAuto they are set when the table was read
	// (settleProgress), and read only after settled.
	progress Progress
	cur      *cursor.Engine
	marks    *marks.Engine // the marks claims (both progress modes read rows by id through it)
	prog     progressMode
	settled  atomic.Bool
	settleMu sync.Mutex
	// marksChecked: when a check last found the table not in cursor mode
	// (unix nanoseconds; see checkMarks).
	marksChecked atomic.Int64
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
	var src kafkaSource // ExactlyOnce's producers' brokers
	if c.Delivery == ExactlyOnce {
		var err error
		if src, err = exactlyOnceSource(pub); err != nil {
			return nil, err
		}
	}
	r := &Relay{
		db:     db,
		pub:    pub,
		cfg:    c,
		q:      newQueries(c.Table),
		tracer: c.TracerProvider.Tracer("github.com/fxoutbox/outbox/relay"),
		wakes:  make([]chan struct{}, c.Workers),
		kicks:  make([]chan struct{}, c.Workers),
	}
	if p, ok := c.fixedProgress(); ok {
		r.useProgress(p)
	}
	r.parkLog, r.failedLog = newParkLog(c.Logger), newFailedLog(c.Logger)
	for i := range r.wakes {
		r.wakes[i] = make(chan struct{}, 1)
		r.kicks[i] = make(chan struct{}, 1)
	}
	r.health.init(c.Workers)
	m, err := newMetrics(r, c.MeterProvider)
	if err != nil {
		return nil, fmt.Errorf("relay: metrics: %w", err)
	}
	r.metrics = m
	if src != nil {
		r.eo = newExactlyOnce(src, c, m)
	}
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
	// start; a database that cannot be reached does not (the batches, or
	// the stream's connections, check again as they wait for it).
	err := r.settleProgress(ctx)
	if err == nil {
		err = r.streamProgressErr()
	}
	if err == nil && r.cur != nil {
		err = r.cur.Ready(ctx)
	} else if err == nil {
		err = r.checkMarks(ctx, nil)
	}
	if err != nil && !dberr.Is(err) {
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
	// Cursor lanes kept across batches, once the progress is known (see
	// settleProgress).
	var keep *cursor.Keeper
	defer func() { keep.Close(ctx) }()
	eoKeep := r.newEOKeeper() // exactly-once lanes kept across batches
	defer eoKeep.Close(ctx)
	for kept := false; ; {
		if !kept && r.settled.Load() {
			keep, kept = r.newKeeper(), true
		}
		info := batchInfo{keep: keep, eoKeep: eoKeep}
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
		tick, stopTick := (<-chan time.Time)(ticker.C), func() {}
		if due, stop := keep.Wait(); due != nil {
			// The kept lanes' positions are written when due, if no batch
			// runs before.
			tick, stopTick = due, stop
		}
		woken, ok = r.waitWake(tick, wake, quiet)
		stopTick()
		if !ok {
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
		r.cfg.Logger.Warn(msg, "table", r.cfg.Table.String(), "error", err, "error.type", failure.Type(err), "consecutive_failures", b.Failures())
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
	return r.eo.Close()
}
