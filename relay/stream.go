package relay

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/defaults"
	"github.com/fxoutbox/outbox/internal/tablesql"
	"github.com/fxoutbox/outbox/relay/internal/failure"
	"github.com/fxoutbox/outbox/relay/internal/pgoutput"
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
	MaxLagBytes int64 `env:"OUTBOX_STREAM_MAX_LAG_BYTES"`
	// MaxLag makes Health fail (check "stream") when the oldest transaction
	// the relay received and has not finished committed longer ago than
	// this. Default 30s.
	MaxLag time.Duration `env:"OUTBOX_STREAM_MAX_LAG"`
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
	// for a retry (while some do, it sweeps every PollInterval). Under
	// cursor progress there is no sweep (failed events wait in the relay, a
	// requeued event is a new insert the stream decodes) and it is not used.
	// Default 2s.
	SweepInterval time.Duration
	// Linger is how long the first event of a batch waits for more before
	// the batch is published (or less, once MaxBatchSize events wait):
	// longer batches cost PostgreSQL less per event, at that much latency.
	// Default 1ms.
	Linger time.Duration
	// RetryInterval is how long a relay whose slot was invalidated (it fell
	// further behind than the server's max_slot_wal_keep_size) and that could
	// not drop it publishes by polling before it tries again. (A relay drops
	// the lost slot itself and creates a new one, polling meanwhile; its role
	// has REPLICATION, which suffices unless another role owns the slot.)
	// Default 1m.
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
	defaults.Set(&c.MaxLagBytes, defaultStreamMaxLagBytes)
	defaults.Set(&c.MaxLag, defaultStreamMaxLag)
	defaults.Set(&c.StandbyRetry, defaultStreamStandbyRetry)
	defaults.Set(&c.StatusInterval, defaultStreamStatusInterval)
	defaults.Set(&c.SweepInterval, defaultStreamSweepInterval)
	defaults.Set(&c.RetryInterval, defaultStreamRetryInterval)
	defaults.Set(&c.Linger, defaultStreamLinger)
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
	// StreamFallback: the slot was invalidated, or is missing after this
	// relay used it (see StreamStatus.SlotLost); this relay publishes by
	// polling (from its last checkpoint) while it drops the slot (an
	// invalidated one) and makes a new one, until it streams again (or,
	// when it cannot drop it, looks at the slot again every RetryInterval).
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
	// Checkpoint is when the stream last wrote its checkpoint (zero before
	// the first): under cursor progress, the lanes' positions where a
	// relay that cannot stream resumes by polling.
	Checkpoint time.Time
	// SlotLost counts the times this relay found its slot lost and made a
	// new one, resuming from the table meanwhile: invalidated (wal_status
	// lost, past max_slot_wal_keep_size), or missing after this relay had
	// used it (dropped, or the server is a promoted standby that did not
	// have it; see docs/streaming.md). A slot missing at a relay's first
	// connection is not counted: the relay cannot tell it from a new table.
	// Each loss counts once: meeting the same lost slot again (retries
	// before it is dropped, or while the relay cannot drop it, then its
	// absence once dropped) does not count until the relay has found or
	// made a usable slot.
	SlotLost int64
}

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
	slot     atomic.Pointer[string] // the slot's name, once the database is known
	state    atomic.Int32
	progress pgoutput.Progress // the positions confirmed and reported by the server
	oldest   atomic.Int64      // unix nanoseconds of the oldest unfinished transaction's commit, 0 when none
	// checkpointAt: unix nanoseconds of the last checkpoint written.
	checkpointAt atomic.Int64
	// slotInvalidated and slotMissing count the slots lost (StreamStatus's
	// SlotLost), each loss once (see countLoss).
	slotInvalidated atomic.Int64
	slotMissing     atomic.Int64
	// slotView is what this relay knows of its slot; only the stream's
	// goroutine uses it.
	slotView slotView
}

// slotView is what a relay knows of its slot, to count each loss once.
type slotView int

const (
	// slotUnknown: the relay has not found its slot usable nor made it
	// (its first connection): a missing slot may be a new table's.
	slotUnknown slotView = iota
	// slotAlive: the relay found its slot usable or made it since the last
	// loss it counted: a slot invalidated or missing next is a new loss.
	slotAlive
	// slotLost: the relay counted a loss and has not found a usable slot
	// since: meeting the lost slot again (the retry that follows, before
	// the drop shows; every RetryInterval while it cannot drop it; missing
	// once it is dropped) is the same loss.
	slotLost
)

// slotFound records that the relay found its slot usable (not
// invalidated) or made it: a loss after this is a new one.
func (s *streamInfo) slotFound() { s.slotView = slotAlive }

// countLoss counts the loss of the relay's slot, invalidated or missing
// (slotInvalidated, slotMissing), after say (which logs it), and reports
// whether it counted it: a loss is counted once, when the relay first meets
// it, and not again until the relay has found or made a usable slot. An
// invalidated slot is a loss even at the relay's first connection (the
// server says what happened); a missing one only after the relay found or
// made the slot (before that it cannot be told from a new table's).
func (s *streamInfo) countLoss(kind string, say func()) bool {
	switch {
	case s.slotView == slotLost:
		return false
	case kind == slotMissing && s.slotView != slotAlive:
		return false
	}
	s.slotView = slotLost
	say() // before the count, which those who watch it may read at once
	if kind == slotMissing {
		s.slotMissing.Add(1)
	} else {
		s.slotInvalidated.Add(1)
	}
	return true
}

func (s *streamInfo) slotName() string {
	if n := s.slot.Load(); n != nil {
		return *n
	}
	return "(not known yet)"
}

func (s *streamInfo) status() StreamStatus {
	st := StreamStatus{State: StreamState(s.state.Load()), Confirmed: s.progress.Confirmed(), SlotLost: s.slotInvalidated.Load() + s.slotMissing.Load()}
	if at := s.checkpointAt.Load(); at > 0 {
		st.Checkpoint = time.Unix(0, at)
	}
	if st.State == Streaming {
		if end := s.progress.WALEnd(); end > st.Confirmed {
			st.LagBytes = int64(end - st.Confirmed)
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

// checkStream runs admin.CheckStream's checks (internal/tablesql) at Start: a server that is not set up
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
		err = tablesql.CheckStream(ctx, tx, r.cfg.Table)
	}
	var se *outbox.StreamSetupError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &se) && se.Check == outbox.StreamCheckSlotLost:
		r.cfg.Logger.Warn("outbox relay: "+se.Error(), "table", r.cfg.Table.String())
		return nil
	case errors.As(err, &se):
		return fmt.Errorf("relay: cannot stream: %w", err)
	default:
		r.cfg.Logger.Warn("outbox relay: could not check the streaming setup at start; streaming is retried with backoff",
			"table", r.cfg.Table.String(), "error", err, "error.type", failure.Type(err))
		return nil
	}
}
