package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/admin"
)

// Mode says where a relay finds the events it publishes.
type Mode int

const (
	// Poll (the default) claims unpublished rows from the table on a
	// ticker and on wake-ups. It needs nothing from the server.
	Poll Mode = iota
	// Stream reads the table's inserts from a logical replication slot
	// (the built-in pgoutput plugin, over the publication
	// outbox.Table.Publication) in commit order: it claims, locks and scans
	// nothing on the happy path. See StreamConfig and the package
	// documentation.
	Stream
)

func (m Mode) String() string {
	switch m {
	case Poll:
		return "poll"
	case Stream:
		return "stream"
	}
	return "Mode(" + strconv.Itoa(int(m)) + ")"
}

// StreamConfig configures the Stream mode. The zero value means every
// default.
type StreamConfig struct {
	// ConnConfig is the replication connection's configuration; the relay
	// adds replication=database to a copy of it. Default: the
	// configuration of the DB, which must then be a *pgxpool.Pool.
	ConnConfig *pgconn.Config
	// MaxLagBytes makes Health fail (check "stream") when the WAL written
	// since the position the relay confirmed exceeds it: the slot pins that
	// WAL on the server. Default 1 GiB.
	MaxLagBytes int64
	// MaxLag makes Health fail (check "stream") when the oldest transaction
	// the relay received and has not finished committed longer ago than
	// this. Default 30s.
	MaxLag time.Duration
	// StandbyRetry is how often a relay whose slot another relay holds
	// tries to take it over: the most a standby waits after the streaming
	// relay died or stopped. Default 1s.
	StandbyRetry time.Duration
	// StatusInterval is the longest the relay waits between two reports of
	// its position to the server (it also reports after each batch).
	// Default 1s.
	StatusInterval time.Duration
	// SweepInterval is the period at which the streaming relay claims the
	// unpublished rows behind the stream's position, as the polling relay
	// would: events requeued by an operator, and events that failed and wait
	// for a retry (while some do, it sweeps every PollInterval). Default 2s.
	SweepInterval time.Duration
	// Linger is how long the first event of a batch waits for more before
	// the batch is published (or less, once MaxBatchSize events wait):
	// longer batches cost PostgreSQL less per event, at that much latency.
	// Default 1ms.
	Linger time.Duration
	// RetryInterval is how long a relay whose slot was invalidated (it fell
	// further behind than the server's max_slot_wal_keep_size) publishes by
	// polling before it looks at the slot again; a slot an operator dropped
	// meanwhile is created anew and streaming resumes. Default 1m.
	RetryInterval time.Duration
}

// The defaults and bounds of StreamConfig (see Config's).
const (
	defaultStreamMaxLagBytes    = 1 << 30
	defaultStreamMaxLag         = 30 * time.Second
	defaultStreamStandbyRetry   = time.Second
	defaultStreamStatusInterval = time.Second
	defaultStreamSweepInterval  = 2 * time.Second
	defaultStreamLinger         = time.Millisecond
	maxStreamLinger             = time.Second
	defaultStreamRetryInterval  = time.Minute
	minStreamInterval           = 10 * time.Millisecond // of StandbyRetry, StatusInterval, SweepInterval, RetryInterval
)

func (c StreamConfig) withDefaults() StreamConfig {
	setDefault(&c.MaxLagBytes, defaultStreamMaxLagBytes)
	setDefault(&c.MaxLag, defaultStreamMaxLag)
	setDefault(&c.StandbyRetry, defaultStreamStandbyRetry)
	setDefault(&c.StatusInterval, defaultStreamStatusInterval)
	setDefault(&c.SweepInterval, defaultStreamSweepInterval)
	setDefault(&c.RetryInterval, defaultStreamRetryInterval)
	setDefault(&c.Linger, defaultStreamLinger)
	return c
}

func (c StreamConfig) validate() error {
	bad := func(field string, v any, want string) error {
		return &outbox.ConfigError{Field: "Stream." + field, Reason: fmt.Sprintf("is %v: %s", v, want)}
	}
	switch {
	case c.Linger < 0 || c.Linger > maxStreamLinger:
		return bad("Linger", c.Linger, fmt.Sprintf("use 0 (the default, %v) to %v", defaultStreamLinger, maxStreamLinger))
	case c.MaxLagBytes < 0:
		return bad("MaxLagBytes", c.MaxLagBytes, fmt.Sprintf("use a positive number of bytes (zero means the default, %d)", defaultStreamMaxLagBytes))
	case c.MaxLag < 0:
		return bad("MaxLag", c.MaxLag, fmt.Sprintf("use a positive duration (zero means the default, %v)", defaultStreamMaxLag))
	}
	for _, d := range []struct {
		field string
		v     time.Duration
		def   time.Duration
	}{
		{"StandbyRetry", c.StandbyRetry, defaultStreamStandbyRetry},
		{"StatusInterval", c.StatusInterval, defaultStreamStatusInterval},
		{"SweepInterval", c.SweepInterval, defaultStreamSweepInterval},
		{"RetryInterval", c.RetryInterval, defaultStreamRetryInterval},
	} {
		if d.v < minStreamInterval {
			return bad(d.field, d.v, fmt.Sprintf("use at least %v (zero means the default, %v)", minStreamInterval, d.def))
		}
	}
	return nil
}

// StreamState says what a relay in Stream mode is doing.
type StreamState int32

const (
	// StreamStarting: connecting, creating the slot, or publishing the
	// events that were waiting in the table.
	StreamStarting StreamState = iota
	// Streaming: this relay holds the slot and publishes from it.
	Streaming
	// StreamStandby: another relay holds the slot; this one retries every
	// StandbyRetry and takes over when it is free.
	StreamStandby
	// StreamFallback: the slot was invalidated; this relay publishes by
	// polling and looks at the slot again every RetryInterval.
	StreamFallback
	// StreamRetrying: the replication connection failed (the database
	// restarts, the network); the relay reconnects with backoff.
	StreamRetrying
)

func (s StreamState) String() string {
	switch s {
	case StreamStarting:
		return "starting"
	case Streaming:
		return "streaming"
	case StreamStandby:
		return "standby"
	case StreamFallback:
		return "fallback"
	case StreamRetrying:
		return "retrying"
	}
	return "StreamState(" + strconv.Itoa(int(s)) + ")"
}

// StreamStatus is a relay's view of its stream.
type StreamStatus struct {
	State StreamState
	// Confirmed is the position the relay last confirmed to the server:
	// every event committed before it is published, parked, or waiting in
	// the table for a sweep.
	Confirmed pglogrepl.LSN
	// LagBytes is the WAL between the server's last reported end and
	// Confirmed; Lag is the age of the oldest transaction received and not
	// finished (0 when there is none). Both are 0 unless Streaming.
	LagBytes int64
	Lag      time.Duration
}

// ErrSlotInvalidated is the cause of the fall-back to polling: the server
// invalidated the slot (it pinned more WAL than max_slot_wal_keep_size).
var ErrSlotInvalidated = errors.New("relay: replication slot invalidated")

// StreamStatus returns the stream's state; a relay in Poll mode returns the
// zero value.
func (r *Relay) StreamStatus() StreamStatus {
	if r.cfg.Mode != Stream {
		return StreamStatus{}
	}
	return r.stream.status()
}

// streamInfo is the streamer's state that other goroutines read (metrics,
// Health, StreamStatus).
type streamInfo struct {
	slot      atomic.Pointer[string] // the slot's name, once the database is known
	state     atomic.Int32
	confirmed atomic.Uint64
	walEnd    atomic.Uint64
	oldest    atomic.Int64 // unix nanoseconds of the oldest unfinished transaction's commit, 0 when none
}

func (s *streamInfo) slotName() string {
	if n := s.slot.Load(); n != nil {
		return *n
	}
	return "(not known yet)"
}

func (s *streamInfo) status() StreamStatus {
	st := StreamStatus{State: StreamState(s.state.Load()), Confirmed: pglogrepl.LSN(s.confirmed.Load())}
	if st.State == Streaming {
		if end := s.walEnd.Load(); end > uint64(st.Confirmed) {
			st.LagBytes = int64(end - uint64(st.Confirmed))
		}
		if o := s.oldest.Load(); o > 0 {
			st.Lag = max(0, time.Since(time.Unix(0, o)))
		}
	}
	return st
}

// streamHealth returns why the stream is unhealthy, or nil.
func (r *Relay) streamHealth() error {
	st := r.stream.status()
	c := r.cfg.Stream
	switch {
	case st.LagBytes > c.MaxLagBytes:
		return fmt.Errorf("slot %s is %d bytes of WAL behind, over MaxLagBytes %d: the server keeps that WAL until the relay catches up (see max_slot_wal_keep_size)", r.stream.slotName(), st.LagBytes, c.MaxLagBytes)
	case st.Lag > c.MaxLag:
		return fmt.Errorf("slot %s: the oldest transaction not yet published committed %s ago, over MaxLag %s", r.stream.slotName(), st.Lag.Round(time.Millisecond), c.MaxLag)
	}
	return nil
}

// streamRow is a row from the stream.
type streamRow struct {
	row
	bad error // the row could not be decoded: it is parked by id
	// visibleBy is when (the relay's clock) the row must be visible:
	// visibleWait after its transaction committed, measured on the
	// server's clock (commit to send) and carried over to the relay's
	// from the moment it arrived, so that clock skew does not count.
	visibleBy time.Time
}

// streamer is one connection's stream. Its reader goroutine owns the
// replication connection: it receives and decodes the stream, hands each
// committed transaction with outbox rows to the publishing side over txs,
// and reports the confirmed position to the server. The publishing side
// (follow) claims, publishes and marks batches meanwhile, so receiving and
// publishing overlap.
type streamer struct {
	r     *Relay
	slot  string // the slot's name: Table.Slot of the connection's database
	conn  *pgconn.PgConn
	txs   chan streamTx
	rerr  error // why the reader stopped; read after txs is closed
	rdone chan struct{}

	// The reader's.
	rels       map[uint32]*pglogrepl.RelationMessage
	types      *pgtype.Map
	open       []streamRow // rows of the transaction being received
	openAt     time.Time   // its commit time
	sentAt     time.Time   // the server's clock when it sent the last data message
	inTx       bool
	pushed     pglogrepl.LSN // end of the last transaction handed over
	lastStatus time.Time

	// The publishing side's.
	ready      []streamRow // rows of committed transactions, not yet handled
	readySince time.Time   // when the first of them was received
	readyTo    pglogrepl.LSN
	maxSeen    int64 // highest id the stream delivered: sweeps stop there
	sweepAt    time.Time
	needSweep  bool
}

// streamTx is a committed transaction's outbox rows.
type streamTx struct {
	rows     []streamRow
	end      pglogrepl.LSN
	commit   time.Time // when it committed
	received time.Time
}

// runStream is the goroutine of a relay in Stream mode.
func (r *Relay) runStream(ctx context.Context) {
	failures := 0
	logged := ""
	for {
		err := r.streamOnce(ctx)
		select {
		case <-r.stop:
			return
		default:
		}
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr) && pgErr.Code == "55006":
			// The slot is active for another relay: stand by.
			failures = 0
			if r.stream.state.Swap(int32(StreamStandby)) != int32(StreamStandby) {
				r.cfg.Logger.Info("outbox relay: standing by: another relay streams from the slot; taking over when it is free",
					"table", r.cfg.Table.String(), "slot", r.stream.slotName())
			}
			r.health.set(0, nil)
			if !r.sleep(r.cfg.Stream.StandbyRetry, nil) {
				return
			}
		case errors.Is(err, ErrSlotInvalidated):
			failures = 0
			r.stream.state.Store(int32(StreamFallback))
			r.cfg.Logger.Error("outbox relay: the replication slot was invalidated (it fell further behind than max_slot_wal_keep_size); publishing by polling instead. Drop the slot (outboxctl stream drop-slot, or SELECT pg_drop_replication_slot('"+r.stream.slotName()+"')) to make the relay create a new one and stream again",
				"table", r.cfg.Table.String(), "slot", r.stream.slotName(), "error", err, "retry_in", r.cfg.Stream.RetryInterval)
			until := make(chan struct{})
			t := time.AfterFunc(r.cfg.Stream.RetryInterval, func() { close(until) })
			r.loop(ctx, 0, until)
			t.Stop()
		default:
			failures++
			r.stream.state.Store(int32(StreamRetrying))
			r.health.set(0, err)
			if k := errorKind(err); k != logged {
				logged = k
				r.cfg.Logger.Warn("outbox relay: streaming failed; reconnecting with backoff (events stay in the table, nothing is lost)",
					"table", r.cfg.Table.String(), "slot", r.stream.slotName(), "error", err, "error.type", ErrorType(err), "consecutive_failures", failures)
			}
			if !r.sleep(r.backoff(failures), r.kicks[0]) {
				return
			}
			continue
		}
		logged = ""
	}
}

// checkStream runs admin.CheckStream at Start: a server that is not set up
// for streaming (wal_level, the publication, the role's REPLICATION, the
// slot capacity) fails the start with what to change. An invalidated slot
// does not (the relay publishes by polling and says so), nor does a
// database it cannot reach (the relay retries as it would in polling).
func (r *Relay) checkStream(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, min(r.cfg.BatchTimeout, 10*time.Second))
	defer cancel()
	tx, err := r.db.Begin(ctx)
	if err == nil {
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		err = admin.CheckStream(ctx, tx, r.cfg.Table)
	}
	var se *admin.StreamSetupError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &se) && se.Check == admin.CheckSlotLost:
		r.cfg.Logger.Warn("outbox relay: "+se.Error(), "table", r.cfg.Table.String())
		return nil
	case errors.As(err, &se):
		return fmt.Errorf("relay: cannot stream: %w", err)
	default:
		r.cfg.Logger.Warn("outbox relay: could not check the streaming setup at start; streaming is retried with backoff",
			"table", r.cfg.Table.String(), "error", err, "error.type", ErrorType(err))
		return nil
	}
}

// replicationConfig returns the replication connection's configuration.
func (r *Relay) replicationConfig() (*pgconn.Config, error) {
	var c *pgconn.Config
	switch {
	case r.cfg.Stream.ConnConfig != nil:
		c = r.cfg.Stream.ConnConfig.Copy()
	default:
		p, ok := r.db.(*pgxpool.Pool)
		if !ok {
			return nil, &outbox.ConfigError{Field: "Stream.ConnConfig", Reason: "is nil and the DB is not a *pgxpool.Pool: pass the replication connection's configuration"}
		}
		c = p.Config().ConnConfig.Config.Copy()
	}
	if c.RuntimeParams == nil {
		c.RuntimeParams = map[string]string{}
	}
	c.RuntimeParams["replication"] = "database"
	c.RuntimeParams["application_name"] = "fxoutbox-relay"
	// pgoutput sends values as text in the session's DateStyle, which the
	// decoder reads in ISO only (a server set to SQL, German or Postgres
	// style would make every streamed row unreadable).
	c.RuntimeParams["DateStyle"] = "ISO"
	// A receive that times out (every StatusInterval when idle) must not
	// send the server a cancel request, which ends a walsender's streaming.
	c.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: pc.Conn()}
	}
	return c, nil
}

// streamOnce connects, makes sure the slot exists, takes it, publishes the
// events waiting in the table, then follows the stream until an error or
// Stop. It returns nil only when the relay is stopping.
func (r *Relay) streamOnce(ctx context.Context) error {
	if r.stream.state.Load() != int32(StreamStandby) {
		r.stream.state.Store(int32(StreamStarting))
	}
	cfg, err := r.replicationConfig()
	if err != nil {
		return err
	}
	connCtx, cancel := context.WithTimeout(ctx, r.cfg.BatchTimeout)
	conn, err := pgconn.ConnectConfig(connCtx, cfg)
	cancel()
	if err != nil {
		return fmt.Errorf("relay: replication connection: %w", err)
	}
	// Closing the connection ends the walsender and frees the slot.
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	s := &streamer{r: r, conn: conn, rels: map[uint32]*pglogrepl.RelationMessage{}, types: pgtype.NewMap(),
		txs: make(chan streamTx, r.cfg.MaxBatchSize), rdone: make(chan struct{})}
	idCtx, cancel := context.WithTimeout(ctx, r.cfg.BatchTimeout)
	sys, err := pglogrepl.IdentifySystem(idCtx, conn)
	cancel()
	if err != nil {
		return fmt.Errorf("relay: identify the replication connection's database: %w", err)
	}
	s.slot = r.cfg.Table.Slot(sys.DBName)
	r.stream.slot.Store(&s.slot)
	// A position confirmed on an earlier connection may be behind what
	// another relay confirmed since: report none until this connection
	// has handled something (the server ignores a zero position).
	r.stream.confirmed.Store(0)
	if err := s.start(ctx); err != nil {
		return err
	}
	rctx, stopReader := context.WithCancel(ctx)
	go s.read(rctx)
	err = s.follow(ctx)
	stopReader()
	<-s.rdone
	if err == nil && r.stopping() {
		// A last report of the position before the connection closes.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		_ = s.status(sctx, false)
		cancel()
	}
	return err
}

// start creates the slot when it is missing, starts replication (the
// server refuses while another relay holds the slot), then publishes what
// waits in the table: rows written before the slot existed are not in the
// stream, and rows a previous streamer left (failed, requeued) are behind
// its position.
func (s *streamer) start(ctx context.Context) error {
	r := s.r
	if err := s.createSlot(ctx); err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, r.cfg.BatchTimeout)
	defer cancel()
	var pgErr *pgconn.PgError
	err := pglogrepl.StartReplication(cctx, s.conn, s.slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + r.cfg.Table.Publication() + "'"},
	})
	if err != nil {
		if errors.As(err, &pgErr) && pgErr.Code == "55000" && slotInvalidated(pgErr) {
			return fmt.Errorf("%w: %s: %w", ErrSlotInvalidated, s.slot, err)
		}
		return fmt.Errorf("relay: start replication from slot %s: %w", s.slot, err)
	}
	r.stream.state.Store(int32(StreamStarting))
	r.cfg.Logger.Info("outbox relay: streaming from the replication slot", "table", r.cfg.Table.String(), "slot", s.slot, "publication", r.cfg.Table.Publication())
	// Publish what the table holds, reporting to the server between
	// batches so that it does not time the connection out.
	// Later sweeps take only rows up to the highest id the stream
	// delivered; rows this first one leaves (paced, or in a lane another
	// relay holds) must stay within their reach.
	if err := s.readMaxID(ctx); err != nil {
		return err
	}
	if err := s.sweep(ctx, 0, true); err != nil {
		return err
	}
	r.stream.state.Store(int32(Streaming))
	r.health.set(0, nil)
	return nil
}

// createSlot creates the slot when it does not exist. Creating a logical
// slot waits for a consistent point: for the transactions running when it
// began to end, seen in the server's periodic snapshots of running
// transactions (every 15s), so on a busy server it can take tens of
// seconds. Meanwhile the relay publishes by polling.
func (s *streamer) createSlot(ctx context.Context) error {
	r := s.r
	exists, err := s.slotExists(ctx)
	if err != nil || exists {
		return err
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, err = pglogrepl.CreateReplicationSlot(cctx, s.conn, s.slot, "pgoutput", pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication})
	}()
	stopped := context.AfterFunc(ctx, cancel)
	defer stopped()
	r.cfg.Logger.Info("outbox relay: creating the replication slot; publishing by polling until it is ready",
		"table", r.cfg.Table.String(), "slot", s.slot)
	r.loop(ctx, 0, done)
	cancel() // Stop came first: abandon the creation
	<-done
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		r.cfg.Logger.Info("outbox relay: created the replication slot; events written before it are published from the table first",
			"table", r.cfg.Table.String(), "slot", s.slot)
		return nil
	case errors.As(err, &pgErr) && pgErr.Code == "42710": // another relay created it
		return nil
	default:
		return fmt.Errorf("relay: create replication slot %s: %w", s.slot, err)
	}
}

// slotExists reports whether the slot exists.
func (s *streamer) slotExists(ctx context.Context) (bool, error) {
	r := s.r
	cctx, cancel := context.WithTimeout(ctx, r.cfg.BatchTimeout)
	defer cancel()
	tx, err := r.db.Begin(cctx)
	if err != nil {
		return false, fmt.Errorf("relay: look for replication slot: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(cctx)) }()
	var n int
	if err := tx.QueryRow(cctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", s.slot).Scan(&n); err != nil {
		return false, fmt.Errorf("relay: look for replication slot: %w", err)
	}
	return n > 0, nil
}

// readMaxID sets maxSeen to the table's highest id.
func (s *streamer) readMaxID(ctx context.Context) error {
	r := s.r
	cctx, cancel := context.WithTimeout(ctx, r.cfg.BatchTimeout)
	defer cancel()
	tx, err := r.db.Begin(cctx)
	if err != nil {
		return fmt.Errorf("relay: read the table's highest id: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(cctx)) }()
	if err := tx.QueryRow(cctx, "SELECT coalesce(max(id), 0) FROM "+r.cfg.Table.Ident()).Scan(&s.maxSeen); err != nil {
		return fmt.Errorf("relay: read the table's highest id: %w", err)
	}
	return nil
}

// slotInvalidated reports the server's refusal to stream from a slot whose
// WAL it removed.
func slotInvalidated(e *pgconn.PgError) bool {
	return e.Code == "55000" && (strings.Contains(strings.ToLower(e.Message), "can no longer get changes") || strings.Contains(strings.ToLower(e.Detail), "invalidated"))
}

// sweep publishes the unpublished rows up to id upto (every row when 0)
// with the polling claim, until it finds none it can take, reporting the
// position to the server between batches.
func (s *streamer) sweep(ctx context.Context, upto int64, report bool) error {
	r := s.r
	r.sweepUpto.Store(upto)
	defer r.sweepUpto.Store(0)
	size := r.cfg.BatchSize
	for {
		n, next, err := r.runOnce(ctx, size, nil)
		if err != nil {
			return err
		}
		_ = n
		if report {
			if err := s.status(ctx, false); err != nil {
				return err
			}
		}
		if next == 0 {
			break
		}
		size = next
		select {
		case <-r.stop:
			return nil
		default:
		}
	}
	s.sweepAt = time.Now()
	s.needSweep = len(r.pacer.held(time.Now(), 2*r.cfg.MaxBackoff)) > 0
	return nil
}

// follow publishes the transactions the reader hands over, in batches,
// until an error or Stop: a batch takes what waits, and waits up to Linger
// from the reception of its first row for more (up to MaxBatchSize rows).
func (s *streamer) follow(ctx context.Context) error {
	r := s.r
	failures := 0
	for {
		if r.stopping() {
			return nil
		}
		if len(s.ready) == 0 {
			t := time.NewTimer(max(time.Until(s.nextSweep()), 0))
			select {
			case <-r.stop:
				t.Stop()
				return nil
			case tx, ok := <-s.txs:
				t.Stop()
				if !ok {
					return s.rerr
				}
				s.take(tx)
			case <-t.C:
			}
		}
		for len(s.ready) > 0 && len(s.ready) < r.cfg.MaxBatchSize {
			select {
			case tx, ok := <-s.txs:
				if !ok {
					return s.rerr
				}
				s.take(tx)
				continue
			default:
			}
			d := time.Until(s.readySince.Add(r.cfg.Stream.Linger))
			if d <= 0 {
				break
			}
			t := time.NewTimer(d)
			select {
			case tx, ok := <-s.txs:
				t.Stop()
				if !ok {
					return s.rerr
				}
				s.take(tx)
			case <-t.C:
			}
		}
		if len(s.ready) > 0 {
			if err := s.publish(ctx); err != nil {
				if (errors.As(err, new(*dbError)) || isDatabase(err)) && !errors.Is(err, context.DeadlineExceeded) {
					// The database failed: reconnect (on the new
					// connection the table's waiting rows go first).
					return err
				}
				// The broker fails: keep the rows, back off (the reader
				// keeps reporting the position) and try again.
				failures++
				r.health.set(0, err)
				if r.failLog.failed(errorKind(err)) {
					r.cfg.Logger.Warn("outbox relay: publishing the stream failed; its events stay unpublished and are retried with backoff",
						"table", r.cfg.Table.String(), "error", err, "error.type", ErrorType(err), "consecutive_failures", failures)
				}
				if !r.sleep(r.backoff(failures), r.kicks[0]) {
					return nil
				}
				continue
			}
			if failures > 0 && r.failLog.recovered() {
				r.cfg.Logger.Info("outbox relay: publishing again", "table", r.cfg.Table.String(), "after_failures", failures)
			}
			failures = 0
			r.health.set(0, nil)
		}
		if time.Now().After(s.nextSweep()) {
			if err := s.sweep(ctx, s.maxSeen, false); err != nil {
				if errors.As(err, new(*dbError)) || isDatabase(err) {
					return err
				}
				r.health.set(0, err)
				s.sweepAt = time.Now()
				s.needSweep = true
			}
		}
	}
}

// take adds a transaction to the batch being gathered.
func (s *streamer) take(tx streamTx) {
	if len(s.ready) == 0 {
		s.readySince = tx.received
		s.r.stream.oldest.Store(tx.commit.UnixNano())
	}
	s.ready = append(s.ready, tx.rows...)
	s.readyTo = max(s.readyTo, tx.end)
	for _, x := range tx.rows {
		s.maxSeen = max(s.maxSeen, x.id)
	}
}

func (s *streamer) nextSweep() time.Time {
	if s.needSweep {
		return s.sweepAt.Add(s.r.cfg.PollInterval)
	}
	return s.sweepAt.Add(s.r.cfg.Stream.SweepInterval)
}

// status reports the confirmed position to the server. Only the reader
// (or start, before it runs) uses the connection.
func (s *streamer) status(ctx context.Context, reply bool) error {
	c := pglogrepl.LSN(s.r.stream.confirmed.Load())
	err := pglogrepl.SendStandbyStatusUpdate(ctx, s.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: c,
		WALFlushPosition: c,
		WALApplyPosition: c,
		ClientTime:       time.Now(),
		ReplyRequested:   reply,
	})
	if err != nil {
		return fmt.Errorf("relay: report position to the server: %w", err)
	}
	s.lastStatus = time.Now()
	return nil
}

// confirm records that everything up to lsn is handled; the reader
// reports it to the server.
func (s *streamer) confirm(lsn pglogrepl.LSN) {
	for {
		c := s.r.stream.confirmed.Load()
		if uint64(lsn) <= c || s.r.stream.confirmed.CompareAndSwap(c, uint64(lsn)) {
			return
		}
	}
}

// read is the reader goroutine: it receives until ctx ends or the
// connection fails, then closes txs.
func (s *streamer) read(ctx context.Context) {
	defer close(s.rdone)
	defer close(s.txs)
	for {
		wait := time.Until(s.lastStatus.Add(s.r.cfg.Stream.StatusInterval))
		if wait <= 0 {
			if err := s.status(ctx, false); err != nil {
				s.rerr = err
				return
			}
			continue
		}
		if err := s.receive(ctx, wait); err != nil {
			if ctx.Err() == nil {
				s.rerr = err
			}
			return
		}
	}
}

// hand passes a committed transaction to the publishing side, reporting
// the position to the server while it waits.
func (s *streamer) hand(ctx context.Context, tx streamTx) error {
	for {
		t := time.NewTimer(max(time.Until(s.lastStatus.Add(s.r.cfg.Stream.StatusInterval)), 0))
		select {
		case s.txs <- tx:
			t.Stop()
			s.pushed = tx.end
			return nil
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
			if err := s.status(ctx, false); err != nil {
				return err
			}
		}
	}
}

// receive reads and handles one message, waiting up to wait.
func (s *streamer) receive(ctx context.Context, wait time.Duration) error {
	rctx, cancel := context.WithTimeout(ctx, wait)
	msg, err := s.conn.ReceiveMessage(rctx)
	cancel()
	if err != nil {
		if pgconn.Timeout(err) && ctx.Err() == nil {
			return nil
		}
		return fmt.Errorf("relay: receive from the replication slot: %w", err)
	}
	switch m := msg.(type) {
	case *pgproto3.CopyData:
		if len(m.Data) == 0 {
			return nil
		}
		switch m.Data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			k, err := pglogrepl.ParsePrimaryKeepaliveMessage(m.Data[1:])
			if err != nil {
				return fmt.Errorf("relay: replication keepalive: %w", err)
			}
			s.walEnd(k.ServerWALEnd, true)
			if k.ReplyRequested {
				return s.status(ctx, false)
			}
		case pglogrepl.XLogDataByteID:
			x, err := pglogrepl.ParseXLogData(m.Data[1:])
			if err != nil {
				return fmt.Errorf("relay: replication data: %w", err)
			}
			s.walEnd(x.ServerWALEnd, false)
			s.sentAt = x.ServerTime
			return s.decode(ctx, x.WALData)
		}
		return nil
	case *pgproto3.ErrorResponse:
		return fmt.Errorf("relay: replication: %w", pgconn.ErrorResponseToPgError(m))
	case *pgproto3.CopyDone:
		return errors.New("relay: the server ended the replication stream")
	default:
		return nil
	}
}

// walEnd records the server's end of WAL. A keepalive's end is the
// position up to which the server has sent everything: with nothing
// received and not handled, it is confirmed, so that the slot lets the
// server recycle WAL that holds no outbox insert. (The end in a data
// message is the server's, beyond what it sent.)
func (s *streamer) walEnd(end pglogrepl.LSN, keepalive bool) {
	if end == 0 {
		return
	}
	s.r.stream.walEnd.Store(uint64(end))
	if keepalive && !s.inTx && uint64(s.pushed) <= s.r.stream.confirmed.Load() {
		// Nothing handed over waits: everything sent is handled.
		s.confirm(end)
	}
}

// decode handles one pgoutput message.
func (s *streamer) decode(ctx context.Context, data []byte) error {
	msg, err := pglogrepl.Parse(data)
	if err != nil {
		return fmt.Errorf("relay: decode pgoutput message: %w", err)
	}
	switch m := msg.(type) {
	case *pglogrepl.RelationMessage:
		s.rels[m.RelationID] = m
	case *pglogrepl.BeginMessage:
		s.open, s.openAt, s.inTx = nil, m.CommitTime, true
		if s.openAt.IsZero() {
			s.openAt = time.Now()
		}
	case *pglogrepl.InsertMessage:
		rel, ok := s.rels[m.RelationID]
		if !ok {
			return fmt.Errorf("relay: insert for relation %d before its description", m.RelationID)
		}
		if !s.ours(rel) {
			return nil
		}
		s.open = append(s.open, s.row(rel, m.Tuple))
	case *pglogrepl.CommitMessage:
		rows, at := s.open, s.openAt
		s.open, s.openAt, s.inTx = nil, time.Time{}, false
		if len(rows) == 0 {
			if uint64(s.pushed) <= s.r.stream.confirmed.Load() {
				s.confirm(m.TransactionEndLSN)
			}
			return nil
		}
		now := time.Now()
		age := time.Duration(0) // from the commit to the server's send, on its clock
		if !s.sentAt.IsZero() && s.sentAt.After(at) {
			age = s.sentAt.Sub(at)
		}
		for i := range rows {
			rows[i].visibleBy = now.Add(visibleWait - age)
		}
		return s.hand(ctx, streamTx{rows: rows, end: m.TransactionEndLSN, commit: at, received: now})
	}
	return nil
}

// ours reports a relation that is the outbox table.
func (s *streamer) ours(rel *pglogrepl.RelationMessage) bool {
	t := s.r.cfg.Table
	return rel.RelationName == t.Name && (t.Schema == "" || rel.Namespace == t.Schema)
}

// row decodes an inserted tuple. A row that cannot be decoded keeps its id
// (when that much can be read) and the error, and is parked by id.
func (s *streamer) row(rel *pglogrepl.RelationMessage, tuple *pglogrepl.TupleData) streamRow {
	var x streamRow
	var errs []error
	for i, col := range tuple.Columns {
		if i >= len(rel.Columns) {
			break
		}
		c := rel.Columns[i]
		if col.DataType == 'n' {
			continue
		}
		if col.DataType != 't' {
			errs = append(errs, fmt.Errorf("column %s: unexpected tuple data kind %q", c.Name, col.DataType))
			continue
		}
		v := col.Data
		var err error
		switch c.Name {
		case "id":
			x.id, err = strconv.ParseInt(string(v), 10, 64)
		case "event_id":
			x.eventID, err = uuid.ParseBytes(v)
		case "event_type":
			x.eventType = string(v)
		case "topic":
			x.topic = string(v)
		case "partition_key":
			x.key = string(v)
		case "payload":
			x.payload = v
		case "headers":
			x.headers = v
		case "attempts":
			var a int64
			a, err = strconv.ParseInt(string(v), 10, 32)
			x.attempts = int(a)
		case "created_at":
			err = s.types.Scan(c.DataType, pgtype.TextFormatCode, v, &x.createdAt)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("column %s: %w", c.Name, err))
		}
	}
	if x.id == 0 {
		errs = append(errs, errors.New("no id"))
	}
	if len(errs) > 0 {
		x.bad = errors.Join(errs...)
	}
	return x
}

// publish handles the ready rows as one batch and confirms their end.
//
// In one transaction it locks the lanes of the rows' keys (try-locks, as
// polling relays do, so that a relay polling during a switch of modes never
// publishes a key at the same time), and reads, in a new statement, which
// rows are still unpublished and which keys have an older unpublished row
// outside the batch. Rows published meanwhile (by the sweep, a polling
// relay, or before a restart that made the server send them again) are
// skipped; rows whose lane another relay holds, or whose key waits behind
// an older row (failed and waiting for its retry, requeued, or written
// before the slot existed), are left in the table for the sweep, which
// publishes them in order. The rest goes through the one publish, park and
// mark path. The position is confirmed once the transaction committed.
func (s *streamer) publish(ctx context.Context) error {
	// The server sends a transaction once its commit record is flushed,
	// which is a moment before the transaction is visible to other
	// sessions' snapshots: a row the claim cannot see yet is waited for,
	// up to visibleWait after its transaction committed. A row of an older
	// transaction that is missing was deleted (the stream is replaying what
	// retention has removed since) and is not waited for, or a batch of
	// them would wait visibleWait each.
	var deadline time.Time
	for _, x := range s.ready[:min(len(s.ready), s.r.cfg.MaxBatchSize)] {
		if x.visibleBy.After(deadline) {
			deadline = x.visibleBy
		}
	}
	for attempt, wait := 0, 200*time.Microsecond; ; attempt, wait = attempt+1, min(2*wait, 50*time.Millisecond) {
		err := s.publishOnce(ctx, attempt, time.Now().After(deadline))
		if !errors.Is(err, errNotVisible) {
			return err
		}
		if !s.r.sleep(wait, nil) {
			return nil
		}
	}
}

// visibleWait bounds the wait for streamed rows to become visible, from
// their transaction's commit (server's clock); rows still missing after it
// were deleted (by an operator, or by the retention of published rows when
// the stream is that far behind) and are skipped, and a sweep follows for
// any that was merely slow to become visible.
const visibleWait = 5 * time.Second

// visibleRetries is how many times an Unordered batch is claimed again
// when a row it did not claim is unpublished (its transaction not visible
// yet, or a polling relay holds the row); after that it is left to the
// sweep. Under PerKey the claim knows which: it waits for a row that is
// not visible yet (up to visibleWait) and leaves at once a row whose lane
// another relay holds or whose key waits.
const visibleRetries = 3

// errNotVisible says a streamed row is not visible to the claim yet.
var errNotVisible = errors.New("relay: streamed row not visible yet")

func (s *streamer) publishOnce(ctx context.Context, attempt int, skipMissing bool) error {
	r := s.r
	// At most MaxBatchSize rows a batch: a transaction that wrote more is
	// published in several, in order, and its end confirmed after the last.
	rows := s.ready[:min(len(s.ready), r.cfg.MaxBatchSize)]
	bctx, cancel := context.WithTimeout(ctx, r.cfg.BatchTimeout)
	defer cancel()
	t := time.Now()
	tx, err := r.db.Begin(bctx)
	if err != nil {
		_, err = r.metrics.lap(bctx, StepClaim, t, fmt.Errorf("relay: begin: %w", err))
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(bctx)) }()

	take, bad, deferred, err := s.claim(bctx, tx, rows, attempt, skipMissing)
	if errors.Is(err, errNotVisible) {
		return err
	}
	var badParked []int64
	if err == nil && len(bad) > 0 {
		_, badParked, err = r.chargeUnreadable(bctx, tx, bad, nil)
	}
	if t, err = r.metrics.lap(bctx, StepClaim, t, err); err != nil {
		return err
	}
	if deferred {
		s.needSweep = true
	}
	if len(take) > 0 || len(bad) > 0 {
		d, err := r.deliver(bctx, tx, take, t, len(bad) > 0, badParked, true)
		if err != nil {
			// The database failed (nothing is confirmed; on the next
			// connection the table's waiting rows go first), or nothing
			// went through: the batch is tried again after a backoff, its
			// failed events (paced now) left to the sweep.
			return err
		}
		if len(d.transient) > 0 || len(d.failed) > 0 || d.heldBehind {
			s.needSweep = true
		}
	}
	s.ready = append(s.ready[:0], s.ready[len(rows):]...)
	if len(s.ready) > 0 {
		return nil
	}
	s.confirm(s.readyTo)
	r.stream.oldest.Store(0)
	// The position reaches the server with the next status report, within
	// StatusInterval: a report per batch would cost the server a wake-up
	// of its walsender per batch, and the position matters only to what a
	// restart sends again (rows already published are skipped).
	return nil
}

// claim claims the batch's rows in one statement (streamClaim): it marks
// published, in tx, the rows still unpublished whose lane this transaction
// holds or gets (try-locks, as polling relays take lanes, so that a relay
// polling during a switch of modes never publishes a key at the same time)
// and whose key has no older unpublished row outside the batch. An UPDATE
// re-checks a row another transaction changed after its snapshot, so a row
// a polling relay published meanwhile is not claimed again. Rows of keys
// the pacer holds, and rows that could not be decoded, are not claimed.
//
// It returns the rows to publish (claimed, in stream order), the rows to
// park unread, and whether rows were left to the sweep. It returns
// errNotVisible when a row is missing (its transaction not yet visible;
// unless skipMissing), or when a row it left is unpublished and would have
// been claimed (its transaction became visible just after the claim's
// snapshot); under Unordered, where it cannot tell, on the first
// visibleRetries attempts.
func (s *streamer) claim(ctx context.Context, tx pgx.Tx, rows []streamRow, attempt int, skipMissing bool) (take []row, bad []unreadable, deferred bool, err error) {
	r := s.r
	held := map[string]bool{}
	for _, k := range r.pacer.held(time.Now(), 2*r.cfg.MaxBackoff) {
		held[k] = true
	}
	ids := make([]int64, 0, len(rows))
	for _, x := range rows {
		switch {
		case x.id == 0:
		case x.bad != nil:
			bad = append(bad, unreadable{id: x.id, err: x.bad})
		case held[x.key]:
			deferred = true
		default:
			ids = append(ids, x.id)
		}
	}
	if len(ids) == 0 {
		return nil, bad, deferred, nil
	}
	claimed := make(map[int64]bool, len(ids))
	b := &pgx.Batch{}
	b.Queue(r.txSettings, r.idleMillis)
	sql, args := r.q.streamClaim, pgx.NamedArgs{"ids": ids, "batch": ids, "ns": r.q.ns, "lanes": r.cfg.Lanes, "top": slices.Max(ids)}
	if r.cfg.Ordering == Unordered {
		sql, args = r.q.streamClaimUnordered, pgx.NamedArgs{"ids": ids}
	}
	b.Queue(sql, args).Query(func(rs pgx.Rows) error {
		var id int64
		_, err := pgx.ForEachRow(rs, []any{&id}, func() error { claimed[id] = true; return nil })
		return err
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, nil, false, fmt.Errorf("relay: claim streamed rows in %s: %w", r.cfg.Table, err)
	}
	if len(claimed) < len(ids) {
		var rest []int64
		for _, id := range ids {
			if !claimed[id] {
				rest = append(rest, id)
			}
		}
		type state struct{ pending, claimable bool }
		states := map[int64]state{} // the present rows
		sql, args := r.q.streamState, pgx.NamedArgs{"ids": rest, "batch": ids, "ns": r.q.ns, "lanes": r.cfg.Lanes, "top": slices.Max(ids)}
		if r.cfg.Ordering == Unordered {
			sql, args = r.q.streamStateUnordered, pgx.NamedArgs{"ids": rest}
		}
		rs, err := tx.Query(ctx, sql, args)
		if err == nil {
			var id int64
			var st state
			_, err = pgx.ForEachRow(rs, []any{&id, &st.pending, &st.claimable}, func() error { states[id] = st; return nil })
		}
		if err != nil {
			return nil, nil, false, fmt.Errorf("relay: claim streamed rows in %s: %w", r.cfg.Table, err)
		}
		var missing []int64
		defer func() {
			if len(missing) > 0 && err == nil {
				// Gone (deleted after another relay published them), or, with
				// the relay's clock far ahead of the server's, not visible
				// yet: then the sweep publishes them.
				r.cfg.Logger.Warn("outbox relay: streamed events are missing from the table (deleted by retention or by hand, or not visible yet); skipped, a sweep follows",
					"table", r.cfg.Table.String(), "events", len(missing), "first_id", missing[0])
				deferred = true
			}
		}()
		for _, id := range rest {
			st, present := states[id]
			switch {
			case !present && !skipMissing, st.pending && st.claimable && !skipMissing,
				st.pending && r.cfg.Ordering == Unordered && attempt < visibleRetries:
				// Not visible yet to the claim (or, under Unordered,
				// perhaps locked by a polling relay): claim again.
				return nil, nil, false, errNotVisible
			case !present:
				missing = append(missing, id)
			case st.pending:
				// Another relay holds the lane, or the key waits behind
				// an older row: the sweep publishes it, in order.
				deferred = true
			}
		}
	}
	for _, x := range rows {
		if claimed[x.id] {
			take = append(take, x.row)
		}
	}
	return take, bad, deferred, nil
}

// stopping reports whether Stop was called.
func (r *Relay) stopping() bool {
	select {
	case <-r.stop:
		return true
	default:
		return false
	}
}
