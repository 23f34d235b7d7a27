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
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox"
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
	// Slot is the logical replication slot the relay reads, created (with
	// the pgoutput plugin) when it is missing. Every relay of a table uses
	// the same slot: one streams, the others stand by. Default
	// Table.Slot().
	Slot string
	// Publication is the publication the slot's plugin reads: FOR TABLE the
	// outbox table WITH (publish = 'insert'), created by the migrations
	// (migrations.UpStream). Default Table.Publication().
	Publication string
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
	// RetryInterval is how long a relay whose slot was invalidated (it fell
	// further behind than the server's max_slot_wal_keep_size) publishes by
	// polling before it looks at the slot again; a slot an operator dropped
	// meanwhile is created anew and streaming resumes. Default 1m.
	RetryInterval time.Duration
}

func (c StreamConfig) withDefaults(t outbox.Table) StreamConfig {
	if c.Slot == "" {
		c.Slot = t.Slot()
	}
	if c.Publication == "" {
		c.Publication = t.Publication()
	}
	if c.MaxLagBytes == 0 {
		c.MaxLagBytes = 1 << 30
	}
	if c.MaxLag == 0 {
		c.MaxLag = 30 * time.Second
	}
	if c.StandbyRetry == 0 {
		c.StandbyRetry = time.Second
	}
	if c.StatusInterval == 0 {
		c.StatusInterval = time.Second
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = 2 * time.Second
	}
	if c.RetryInterval == 0 {
		c.RetryInterval = time.Minute
	}
	return c
}

func (c StreamConfig) validate() error {
	switch {
	case !validSlotName(c.Slot):
		return &outbox.ConfigError{Field: "Stream.Slot", Reason: fmt.Sprintf("%q is not a slot name: use 1 to 63 lower-case letters, digits and underscores", truncate(c.Slot, 80))}
	case len(c.Publication) > 63:
		return &outbox.ConfigError{Field: "Stream.Publication", Reason: "is longer than 63 bytes"}
	case c.MaxLagBytes < 0 || c.MaxLag < 0:
		return &outbox.ConfigError{Field: "Stream.MaxLagBytes/MaxLag", Reason: "must be positive (zero means the default)"}
	case c.StandbyRetry < 10*time.Millisecond || c.StatusInterval < 10*time.Millisecond || c.SweepInterval < 10*time.Millisecond || c.RetryInterval < 10*time.Millisecond:
		return &outbox.ConfigError{Field: "Stream.StandbyRetry/StatusInterval/SweepInterval/RetryInterval", Reason: "use at least 10ms (zero means the default)"}
	}
	return nil
}

func validSlotName(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for _, c := range []byte(s) {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
			return false
		}
	}
	return true
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
	state     atomic.Int32
	confirmed atomic.Uint64
	walEnd    atomic.Uint64
	oldest    atomic.Int64 // unix nanoseconds of the oldest unfinished transaction's commit, 0 when none
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
		return fmt.Errorf("slot %s is %d bytes of WAL behind, over MaxLagBytes %d: the server keeps that WAL until the relay catches up (see max_slot_wal_keep_size)", c.Slot, st.LagBytes, c.MaxLagBytes)
	case st.Lag > c.MaxLag:
		return fmt.Errorf("slot %s: the oldest transaction not yet published committed %s ago, over MaxLag %s", c.Slot, st.Lag.Round(time.Millisecond), c.MaxLag)
	}
	return nil
}

// streamRow is a row from the stream with the end of its transaction.
type streamRow struct {
	row
	bad error         // the row could not be decoded: it is parked by id
	end pglogrepl.LSN // end of the row's transaction; 0 until its commit arrived
}

// streamer is one connection's stream: the replication connection, the
// relation it decodes, and the rows received and not yet handled.
type streamer struct {
	r       *Relay
	conn    *pgconn.PgConn
	rels    map[uint32]*pglogrepl.RelationMessage
	types   *pgtype.Map
	open    []streamRow // rows of the transaction being received
	openAt  time.Time   // its commit time
	ready   []streamRow // rows of committed transactions, not yet handled
	readyTo pglogrepl.LSN
	// commits holds the commit times of the transactions in ready, oldest
	// first, for the lag.
	commits    []time.Time
	confirmed  pglogrepl.LSN
	lastStatus time.Time
	maxSeen    int64 // highest id the stream delivered: sweeps stop there
	sweepAt    time.Time
	needSweep  bool
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
					"table", r.cfg.Table.String(), "slot", r.cfg.Stream.Slot)
			}
			r.health.set(0, nil)
			if !r.sleep(r.cfg.Stream.StandbyRetry, nil) {
				return
			}
		case errors.Is(err, ErrSlotInvalidated):
			failures = 0
			r.stream.state.Store(int32(StreamFallback))
			r.cfg.Logger.Error("outbox relay: the replication slot was invalidated (it fell further behind than max_slot_wal_keep_size); publishing by polling instead. Drop the slot (outboxctl stream drop-slot, or SELECT pg_drop_replication_slot('"+r.cfg.Stream.Slot+"')) to make the relay create a new one and stream again",
				"table", r.cfg.Table.String(), "slot", r.cfg.Stream.Slot, "error", err, "retry_in", r.cfg.Stream.RetryInterval)
			r.loop(ctx, 0, time.Now().Add(r.cfg.Stream.RetryInterval))
		default:
			failures++
			r.stream.state.Store(int32(StreamRetrying))
			r.health.set(0, err)
			if k := errorKind(err); k != logged {
				logged = k
				r.cfg.Logger.Warn("outbox relay: streaming failed; reconnecting with backoff (events stay in the table, nothing is lost)",
					"table", r.cfg.Table.String(), "slot", r.cfg.Stream.Slot, "error", err, "error.type", ErrorType(err), "consecutive_failures", failures)
			}
			if !r.sleep(r.backoff(failures), r.kicks[0]) {
				return
			}
			continue
		}
		logged = ""
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
	s := &streamer{r: r, conn: conn, rels: map[uint32]*pglogrepl.RelationMessage{}, types: pgtype.NewMap()}
	if err := s.start(ctx); err != nil {
		return err
	}
	return s.follow(ctx)
}

// start creates the slot when it is missing, starts replication (the
// server refuses while another relay holds the slot), then publishes what
// waits in the table: rows written before the slot existed are not in the
// stream, and rows a previous streamer left (failed, requeued) are behind
// its position.
func (s *streamer) start(ctx context.Context) error {
	r := s.r
	c := r.cfg.Stream
	cctx, cancel := context.WithTimeout(ctx, r.cfg.BatchTimeout)
	defer cancel()
	_, err := pglogrepl.CreateReplicationSlot(cctx, s.conn, c.Slot, "pgoutput", pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication})
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		r.cfg.Logger.Info("outbox relay: created the replication slot; events written before it are published from the table first",
			"table", r.cfg.Table.String(), "slot", c.Slot)
	case errors.As(err, &pgErr) && pgErr.Code == "42710": // exists
	default:
		return fmt.Errorf("relay: create replication slot %s: %w", c.Slot, err)
	}
	err = pglogrepl.StartReplication(cctx, s.conn, c.Slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + c.Publication + "'"},
	})
	if err != nil {
		if errors.As(err, &pgErr) && pgErr.Code == "55000" && slotInvalidated(pgErr) {
			return fmt.Errorf("%w: %s: %w", ErrSlotInvalidated, c.Slot, err)
		}
		return fmt.Errorf("relay: start replication from slot %s: %w", c.Slot, err)
	}
	r.stream.state.Store(int32(StreamStarting))
	r.cfg.Logger.Info("outbox relay: streaming from the replication slot", "table", r.cfg.Table.String(), "slot", c.Slot, "publication", c.Publication)
	// Publish what the table holds, reporting to the server between
	// batches so that it does not time the connection out.
	if err := s.sweep(ctx, 0); err != nil {
		return err
	}
	r.stream.state.Store(int32(Streaming))
	r.health.set(0, nil)
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
func (s *streamer) sweep(ctx context.Context, upto int64) error {
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
		if err := s.status(ctx, false); err != nil {
			return err
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

// follow receives the stream and publishes it in batches until an error or
// Stop.
func (s *streamer) follow(ctx context.Context) error {
	r := s.r
	failures := 0
	for {
		select {
		case <-r.stop:
			_ = s.status(ctx, true)
			return nil
		default:
		}
		// Receive until a batch is full at a transaction's end, or until
		// nothing more is at hand.
		wait := time.Until(s.lastStatus.Add(r.cfg.Stream.StatusInterval))
		if len(s.ready) > 0 {
			wait = 200 * time.Microsecond
		} else if sw := time.Until(s.nextSweep()); sw < wait {
			wait = sw
		}
		got, err := s.receive(ctx, max(wait, 50*time.Microsecond))
		if err != nil {
			return err
		}
		if got && len(s.ready) < r.cfg.MaxBatchSize {
			continue
		}
		if len(s.ready) > 0 {
			if err := s.publish(ctx); err != nil {
				if errors.As(err, new(*dbError)) || isDatabase(err) {
					return err
				}
				// The broker fails: keep the rows, back off, report the
				// position meanwhile, and try again.
				failures++
				r.health.set(0, err)
				if r.failLog.failed(errorKind(err)) {
					r.cfg.Logger.Warn("outbox relay: publishing the stream failed; its events stay unpublished and are retried with backoff",
						"table", r.cfg.Table.String(), "error", err, "error.type", ErrorType(err), "consecutive_failures", failures)
				}
				if !s.sleep(ctx, r.backoff(failures)) {
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
			if err := s.sweep(ctx, s.maxSeen); err != nil {
				if errors.As(err, new(*dbError)) || isDatabase(err) {
					return err
				}
				r.health.set(0, err)
				s.sweepAt = time.Now()
				s.needSweep = true
			}
		}
		if time.Since(s.lastStatus) >= r.cfg.Stream.StatusInterval {
			if err := s.status(ctx, false); err != nil {
				return err
			}
		}
	}
}

func (s *streamer) nextSweep() time.Time {
	if s.needSweep {
		return s.sweepAt.Add(s.r.cfg.PollInterval)
	}
	return s.sweepAt.Add(s.r.cfg.Stream.SweepInterval)
}

// sleep waits d, reporting the position to the server meanwhile; false when
// the relay is stopping.
func (s *streamer) sleep(ctx context.Context, d time.Duration) bool {
	end := time.Now().Add(d)
	for {
		left := time.Until(end)
		if left <= 0 {
			return true
		}
		if !s.r.sleep(min(left, s.r.cfg.Stream.StatusInterval), s.r.kicks[0]) {
			return false
		}
		_ = s.status(ctx, false)
	}
}

// status reports the confirmed position to the server.
func (s *streamer) status(ctx context.Context, reply bool) error {
	err := pglogrepl.SendStandbyStatusUpdate(ctx, s.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: s.confirmed,
		WALFlushPosition: s.confirmed,
		WALApplyPosition: s.confirmed,
		ClientTime:       time.Now(),
		ReplyRequested:   reply,
	})
	if err != nil {
		return fmt.Errorf("relay: report position to the server: %w", err)
	}
	s.lastStatus = time.Now()
	return nil
}

// confirm records that everything up to lsn is handled.
func (s *streamer) confirm(lsn pglogrepl.LSN) {
	if lsn > s.confirmed {
		s.confirmed = lsn
		s.r.stream.confirmed.Store(uint64(lsn))
	}
}

// receive reads one message, waiting up to wait; got reports a message.
func (s *streamer) receive(ctx context.Context, wait time.Duration) (got bool, err error) {
	rctx, cancel := context.WithTimeout(ctx, wait)
	msg, err := s.conn.ReceiveMessage(rctx)
	cancel()
	if err != nil {
		if pgconn.Timeout(err) && ctx.Err() == nil {
			return false, nil
		}
		return false, fmt.Errorf("relay: receive from the replication slot: %w", err)
	}
	switch m := msg.(type) {
	case *pgproto3.CopyData:
		if len(m.Data) == 0 {
			return true, nil
		}
		switch m.Data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			k, err := pglogrepl.ParsePrimaryKeepaliveMessage(m.Data[1:])
			if err != nil {
				return false, fmt.Errorf("relay: replication keepalive: %w", err)
			}
			s.walEnd(k.ServerWALEnd)
			if k.ReplyRequested {
				return true, s.status(ctx, false)
			}
		case pglogrepl.XLogDataByteID:
			x, err := pglogrepl.ParseXLogData(m.Data[1:])
			if err != nil {
				return false, fmt.Errorf("relay: replication data: %w", err)
			}
			s.walEnd(x.ServerWALEnd)
			if err := s.decode(x.WALData); err != nil {
				return false, err
			}
		}
		return true, nil
	case *pgproto3.ErrorResponse:
		return false, fmt.Errorf("relay: replication: %w", pgconn.ErrorResponseToPgError(m))
	case *pgproto3.CopyDone:
		return false, errors.New("relay: the server ended the replication stream")
	default:
		return true, nil
	}
}

// walEnd records the server's end of WAL; with nothing received and not
// handled, everything up to it is confirmed (the slot then lets the server
// recycle WAL that holds no outbox insert).
func (s *streamer) walEnd(end pglogrepl.LSN) {
	if end == 0 {
		return
	}
	s.r.stream.walEnd.Store(uint64(end))
	if len(s.open) == 0 && len(s.ready) == 0 && !s.inTx() {
		s.confirm(end)
	}
}

func (s *streamer) inTx() bool { return !s.openAt.IsZero() }

// decode handles one pgoutput message.
func (s *streamer) decode(data []byte) error {
	msg, err := pglogrepl.Parse(data)
	if err != nil {
		return fmt.Errorf("relay: decode pgoutput message: %w", err)
	}
	switch m := msg.(type) {
	case *pglogrepl.RelationMessage:
		s.rels[m.RelationID] = m
	case *pglogrepl.BeginMessage:
		s.open = s.open[:0]
		s.openAt = m.CommitTime
		if s.openAt.IsZero() {
			s.openAt = time.Now()
		}
		if len(s.ready) == 0 {
			s.r.stream.oldest.Store(s.openAt.UnixNano())
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
		end := m.TransactionEndLSN
		for i := range s.open {
			s.open[i].end = end
			s.maxSeen = max(s.maxSeen, s.open[i].id)
		}
		if len(s.open) > 0 {
			s.ready = append(s.ready, s.open...)
			s.commits = append(s.commits, s.openAt)
		} else if len(s.ready) == 0 {
			s.confirm(end)
		}
		s.readyTo = max(s.readyTo, end)
		s.open = nil
		s.openAt = time.Time{}
		if len(s.ready) == 0 {
			s.r.stream.oldest.Store(0)
		}
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
	r := s.r
	rows := s.ready
	bctx, cancel := context.WithTimeout(ctx, r.cfg.BatchTimeout)
	defer cancel()
	t := time.Now()
	tx, err := r.db.Begin(bctx)
	if err != nil {
		_, err = r.metrics.lap(bctx, StepClaim, t, fmt.Errorf("relay: begin: %w", err))
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(bctx)) }()

	take, bad, deferred, err := s.claim(bctx, tx, rows)
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
		d, err := r.deliver(bctx, tx, take, t, true, badParked)
		if err != nil && len(d.ids) == 0 && len(d.failed) == 0 {
			return err
		}
		if len(d.transient) > 0 || len(d.failed) > 0 || d.heldBehind {
			s.needSweep = true
		}
		if err != nil {
			// Committed what went through; the rest waits in the table.
			s.needSweep = true
		}
	}
	s.confirm(s.readyTo)
	s.ready = s.ready[:0]
	s.commits = s.commits[:0]
	r.stream.oldest.Store(0)
	if s.inTx() {
		r.stream.oldest.Store(s.openAt.UnixNano())
	}
	return s.status(ctx, false)
}

// claim returns the rows of the batch to publish now, in stream order, the
// rows that cannot be decoded, and whether some rows were left to the sweep.
func (s *streamer) claim(ctx context.Context, tx pgx.Tx, rows []streamRow) (take []row, bad []unreadable, deferred bool, err error) {
	r := s.r
	ids := make([]int64, 0, len(rows))
	for _, x := range rows {
		if x.id != 0 {
			ids = append(ids, x.id)
		}
	}
	held := map[string]bool{}
	for _, k := range r.pacer.held(time.Now(), 2*r.cfg.MaxBackoff) {
		held[k] = true
	}
	b := &pgx.Batch{}
	b.Queue(r.txSettings, r.idleMillis)
	var locked map[string]bool
	if r.cfg.Ordering == PerKey {
		keys := make([]string, 0, len(rows))
		seen := map[string]bool{}
		for _, x := range rows {
			if !seen[x.key] {
				seen[x.key] = true
				keys = append(keys, x.key)
			}
		}
		slices.Sort(keys)
		locked = map[string]bool{}
		b.Queue(r.q.streamLock, pgx.NamedArgs{"keys": keys, "lanes": r.cfg.Lanes, "ns": r.q.ns}).Query(func(rs pgx.Rows) error {
			var k string
			var ok bool
			_, err := pgx.ForEachRow(rs, []any{&k, &ok}, func() error { locked[k] = ok; return nil })
			return err
		})
	}
	pending := map[int64]bool{}
	pendingSQL := r.q.streamPending
	if r.cfg.Ordering == Unordered {
		// Rows a polling relay has locked are left to the sweep.
		pendingSQL = r.q.streamPendingLock
	}
	b.Queue(pendingSQL, pgx.NamedArgs{"ids": ids}).Query(func(rs pgx.Rows) error {
		var id int64
		_, err := pgx.ForEachRow(rs, []any{&id}, func() error { pending[id] = true; return nil })
		return err
	})
	behind := map[string]bool{}
	if r.cfg.Ordering == PerKey {
		first := map[string]int64{}
		for _, x := range rows {
			if x.id != 0 && (first[x.key] == 0 || x.id < first[x.key]) {
				first[x.key] = x.id
			}
		}
		keys := make([]string, 0, len(first))
		firsts := make([]int64, 0, len(first))
		var top int64
		for k, id := range first {
			keys, firsts = append(keys, k), append(firsts, id)
			top = max(top, id)
		}
		b.Queue(r.q.streamBehind, pgx.NamedArgs{"keys": keys, "firsts": firsts, "top": top, "ids": ids}).Query(func(rs pgx.Rows) error {
			var k string
			_, err := pgx.ForEachRow(rs, []any{&k}, func() error { behind[k] = true; return nil })
			return err
		})
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, nil, false, fmt.Errorf("relay: claim streamed rows in %s: %w", r.cfg.Table, err)
	}
	var unseen map[int64]bool
	if r.cfg.Ordering == PerKey {
		if unseen, err = s.unseen(ctx, tx, ids, pending); err != nil {
			return nil, nil, false, err
		}
	}
	for _, x := range rows {
		switch {
		case unseen[x.id]:
			// Committed, not visible yet: the sweep publishes it, in order.
			deferred = true
		case !pending[x.id]:
			// Published or parked already, or deleted.
		case locked != nil && !locked[x.key], behind[x.key], held[x.key]:
			// Another relay holds the lane, or the key waits behind an
			// older row: the sweep publishes it, in order.
			deferred = true
		case x.bad != nil:
			bad = append(bad, unreadable{id: x.id, err: x.bad})
		default:
			take = append(take, x.row)
		}
	}
	return take, bad, deferred, nil
}

// unseen looks again for the rows of ids that the claim did not find
// pending, and returns those it still cannot see. The server sends a
// transaction's commit once its commit record is on disk, a moment before
// the transaction is visible to new snapshots: a row the stream delivered
// may not be visible yet to the claim, which must not take it for
// published: it looks for up to about 130ms (a busy server can take that
// long). Rows found pending are added to pending.
func (s *streamer) unseen(ctx context.Context, tx pgx.Tx, ids []int64, pending map[int64]bool) (map[int64]bool, error) {
	var look []int64
	for _, id := range ids {
		if !pending[id] {
			look = append(look, id)
		}
	}
	for try := 0; len(look) > 0 && try < 8; try++ {
		if try > 0 {
			time.Sleep(min(time.Millisecond<<try, 25*time.Millisecond))
		}
		rows, err := tx.Query(ctx, "SELECT id, published_at IS NULL AND parked_at IS NULL FROM "+s.r.cfg.Table.Ident()+" WHERE id = ANY($1::bigint[])", look)
		if err != nil {
			return nil, fmt.Errorf("relay: claim streamed rows in %s: %w", s.r.cfg.Table, err)
		}
		seen := map[int64]bool{}
		var id int64
		var p bool
		if _, err := pgx.ForEachRow(rows, []any{&id, &p}, func() error {
			seen[id] = true
			if p {
				pending[id] = true
			}
			return nil
		}); err != nil {
			return nil, fmt.Errorf("relay: claim streamed rows in %s: %w", s.r.cfg.Table, err)
		}
		look = slices.DeleteFunc(look, func(id int64) bool { return seen[id] })
	}
	if len(look) == 0 {
		return nil, nil
	}
	out := make(map[int64]bool, len(look))
	for _, id := range look {
		out[id] = true
	}
	return out, nil
}
