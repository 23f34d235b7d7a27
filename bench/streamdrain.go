package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox/migrations"
	"github.com/fxoutbox/outbox/relay"
)

// streamChunk is the events per transaction of a stream backlog: the
// stream decodes transactions, and a backlog of one transaction of n rows
// is not what a stream meets.
const streamChunk = 500

// drainStream is a streaming relay's drain (relay.Stream, cursor
// progress, delivery as given) of a backlog written while it was down: a
// relay takes the slot on the empty cursor table, streams one event and
// stops; the backlog is written after the slot's position (in transactions
// of streamChunk events); a new relay starts on the slot. What the new
// relay does with the backlog is its delivery's restart: at least once, it
// polls the table from its lanes' positions until they cover a snapshot
// taken after replication started, then streams and skips what they hold
// (the backlog goes by polling); exactly once, it resumes from the stream's
// record in the progress topic and decodes the backlog from the slot. The
// clock runs from the new relay's start until it confirmed the backlog's
// last transaction (every event before it is then published, and under
// exactly-once committed in Kafka): the same end for both deliveries,
// whichever producer publishes.
func (e *env) drainStream(ctx context.Context, topic, warm string, n int, delivery relay.Delivery) (_ drainRun, err error) {
	if err := e.truncate(ctx, e.ctable); err != nil {
		return drainRun{}, err
	}
	// The publication, made afresh (the table was, at the bench's start): a
	// publication without a slot decodes nothing, so the other contenders
	// on the cursor table are unaffected.
	if _, err := e.pool.Exec(ctx, "DROP PUBLICATION IF EXISTS "+pgx.Identifier{e.ctable.Publication()}.Sanitize()); err != nil {
		return drainRun{}, err
	}
	if err := migrations.Stream.Up(ctx, e.pool, e.ctable); err != nil {
		return drainRun{}, err
	}
	slot := benchSlot(ctx, e.pool, e.ctable)
	defer func() {
		if derr := e.dropSlot(context.WithoutCancel(ctx), slot); derr != nil {
			err = errors.Join(err, derr)
		}
	}()
	sp, err := relay.NewSaramaPublisher(e.brokers, producerConfig("fxoutbox"))
	if err != nil {
		return drainRun{}, err
	}
	defer func() { _ = sp.Close() }()
	if err := sp.Publish(ctx, []relay.Message{{Topic: warm, Key: []byte("k"), Value: []byte(`{}`)}}); err != nil {
		return drainRun{}, fmt.Errorf("warm up producer: %w", err)
	}
	cfg := relay.Config{Table: e.ctable, Mode: relay.Stream, Progress: relay.ProgressCursor, Delivery: delivery}
	if delivery == relay.ExactlyOnce {
		// A progress topic of the run's own: the stream's record of an
		// earlier round (its slot dropped, the table's ids restarted) is
		// not this one's.
		cfg.ProgressTopic = topic + ".progress"
	}
	start := func() (*relay.Relay, error) {
		c := cfg
		r, err := relay.New(e.pool, sp, &c)
		if err != nil {
			return nil, err
		}
		if delivery == relay.ExactlyOnce {
			if err := e.createProgressTopic(r.Config().ProgressTopic); err != nil {
				return nil, err
			}
		}
		return r, r.Start(ctx)
	}
	stop := func(r *relay.Relay) error {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		return r.Stop(sctx)
	}
	// The slot, made by a relay that streams an empty table.
	first, err := start()
	if err != nil {
		return drainRun{}, err
	}
	if err := waitStreaming(ctx, first); err != nil {
		_ = stop(first)
		return drainRun{}, err
	}
	// One event streamed and confirmed: under exactly-once the stream's
	// record then holds the stream's progress, and the next relay resumes
	// from the slot (without it, it would hand over from the table again).
	one, err := e.writeStreamBacklog(ctx, topic, 1)
	if err == nil {
		err = waitConfirmed(ctx, first, one, 30*time.Second)
	}
	if err != nil {
		_ = stop(first)
		return drainRun{}, err
	}
	if err := stop(first); err != nil {
		return drainRun{}, err
	}
	last, err := e.writeStreamBacklog(ctx, topic, n)
	if err != nil {
		return drainRun{}, err
	}
	if _, err := e.pool.Exec(ctx, "VACUUM ANALYZE "+ident(e.ctable)); err != nil {
		return drainRun{}, err
	}
	e.checkpoint(ctx)

	// No PostgreSQL CPU per event: the relay's backends (its walsender
	// among them) start with it, after the clock, and pgBackendCPU counts
	// the backends it found at the start.
	t0 := time.Now()
	r, err := start()
	if err != nil {
		return drainRun{}, err
	}
	werr := waitConfirmed(ctx, r, last, e.p.drainCap())
	elapsed := time.Since(t0)
	if err := errors.Join(werr, stop(r)); err != nil {
		return drainRun{}, err
	}
	return result(int64(n), elapsed, false), nil
}

// waitStreaming waits until r streams (its slot made, the start-up
// handover of the table done).
func waitStreaming(ctx context.Context, r *relay.Relay) error {
	deadline := time.Now().Add(30 * time.Second)
	for r.StreamStatus().State != relay.Streaming {
		if time.Now().After(deadline) {
			return fmt.Errorf("the streaming relay did not stream within 30s (state %v)", r.StreamStatus().State)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// waitConfirmed waits until r confirmed a position past lsn.
func waitConfirmed(ctx context.Context, r *relay.Relay, lsn pglogrepl.LSN, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for r.StreamStatus().Confirmed <= lsn {
		if time.Now().After(deadline) {
			return fmt.Errorf("the streaming relay did not confirm past %v within %v (confirmed %v)", lsn, limit, r.StreamStatus().Confirmed)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		time.Sleep(2 * time.Millisecond)
	}
	return nil
}

// writeStreamBacklog writes n events for topic into the cursor table, in
// transactions of streamChunk events, and returns the WAL position before
// the last one: a stream that confirmed past it has confirmed them all.
func (e *env) writeStreamBacklog(ctx context.Context, topic string, n int) (pglogrepl.LSN, error) {
	var last pglogrepl.LSN
	for from := 1; from <= n; from += streamChunk {
		to := min(n, from+streamChunk-1)
		if to == n {
			var text string
			if err := e.pool.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&text); err != nil {
				return 0, err
			}
			var err error
			if last, err = pglogrepl.ParseLSN(text); err != nil {
				return 0, err
			}
		}
		if err := e.insertEvents(ctx, e.ctable, topic, from, to, false); err != nil {
			return 0, fmt.Errorf("write the stream's backlog: %w", err)
		}
	}
	return last, nil
}

// dropSlot drops slot, waiting for its walsender to let it go.
func (e *env) dropSlot(ctx context.Context, slot string) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, err := e.pool.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", slot)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("drop slot %s: %w", slot, err)
		}
		time.Sleep(50 * time.Millisecond) // its walsender is still ending
	}
}
