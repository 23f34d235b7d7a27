package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/relay/internal/claim"
	"github.com/fxoutbox/outbox/relay/internal/failure"
	"github.com/fxoutbox/outbox/relay/internal/feed"
	"github.com/fxoutbox/outbox/relay/internal/pgoutput"
)

// streamRow is a row from the stream.
type streamRow struct {
	claim.Row
	bad error // the row could not be decoded: it is parked by id
	// visibleBy is when (the relay's clock) the row must be visible (see
	// take).
	visibleBy time.Time
}

// streamer is the relay's side of one replication connection: it finds
// the rows to publish in the transactions the connection's reader
// (pgoutput.Conn) decodes, publishes them in batches through the pipeline
// (see publish), sweeps the table behind the stream's position, and
// confirms positions once everything before them is handled. The reader
// receives meanwhile, so receiving and publishing overlap.
type streamer struct {
	r       *Relay
	conn    *pgoutput.Conn
	created bool // this relay made the slot (createSlot)

	ready      []streamRow // rows of committed transactions, not yet handled
	readySince time.Time   // when the first of them was received
	readyTo    pglogrepl.LSN
	maxSeen    int64 // highest id the stream delivered: sweeps stop there
	sweepAt    time.Time
	needSweep  bool
}

// runStream is the goroutine of a relay in Stream mode.
func (r *Relay) runStream(ctx context.Context) {
	b := r.newBackoff()
	logged := ""
	for {
		err := r.streamOnce(ctx)
		select {
		case <-r.stop:
			return
		default:
		}
		switch {
		case pgoutput.SlotInUse(err):
			// The slot is active for another relay: stand by.
			b.Reset()
			if r.stream.state.Swap(int32(StreamStandby)) != int32(StreamStandby) {
				r.cfg.Logger.Info("outbox relay: standing by: another relay streams from the slot; taking over when it is free",
					"table", r.cfg.Table.String(), "slot", r.stream.slotName())
			}
			r.health.set(0, nil)
			if !r.sleep(r.cfg.Stream.StandbyRetry, nil) {
				return
			}
		case errors.Is(err, outbox.ErrSlotInvalidated):
			b.Reset()
			r.stream.state.Store(int32(StreamFallback))
			// The table holds every event and the lanes' positions (or the
			// marks) say which were delivered: drop the lost slot and
			// create a new one; meanwhile, and until the new slot's
			// handover, the relay publishes by polling from there. The
			// loss is counted when the relay first meets it, not again
			// on the retries that meet the same lost slot.
			dropped, derr := r.dropLostSlot(ctx)
			if r.stopping() {
				return
			}
			say := func() {
				if derr == nil {
					r.cfg.Logger.Error("outbox relay: the replication slot was invalidated (it fell further behind than max_slot_wal_keep_size, or was dropped and made anew); publishing from the table by polling, from the last checkpoint, while a new slot is created, then streaming again",
						"table", r.cfg.Table.String(), "slot", r.stream.slotName(), "dropped", dropped, "error", err)
					return
				}
				r.cfg.Logger.Error("outbox relay: the replication slot was invalidated (it fell further behind than max_slot_wal_keep_size), and dropping it failed; publishing by polling instead. Drop the slot (outboxctl stream drop-slot, or SELECT pg_drop_replication_slot('"+r.stream.slotName()+"')) to make the relay create a new one and stream again",
					"table", r.cfg.Table.String(), "slot", r.stream.slotName(), "error", err, "drop_error", derr, "retry_in", r.cfg.Stream.RetryInterval)
			}
			if !r.stream.countLoss(slotInvalidated, say) {
				// The same loss met again: said (and counted) already,
				// unless the relay still cannot drop the slot.
				if derr != nil {
					say()
				} else {
					r.cfg.Logger.Info("outbox relay: the invalidated replication slot is dealt with; creating a new one",
						"table", r.cfg.Table.String(), "slot", r.stream.slotName(), "dropped", dropped)
				}
			}
			if derr == nil {
				continue
			}
			if err := r.eoStreamFallback(ctx); err != nil {
				// Exactly once: the stream's progress must reach the
				// lanes' positions before the relay polls.
				r.health.set(0, err)
				if !r.sleep(b.Fail(), r.kicks[0]) {
					return
				}
				continue
			}
			until := make(chan struct{})
			t := time.AfterFunc(r.cfg.Stream.RetryInterval, func() { close(until) })
			r.loop(ctx, 0, until)
			t.Stop()
		default:
			d := b.Fail()
			r.stream.state.Store(int32(StreamRetrying))
			r.health.set(0, err)
			if k := errorKind(err); k != logged {
				logged = k
				r.cfg.Logger.Warn("outbox relay: streaming failed; reconnecting with backoff (events stay in the table, nothing is lost)",
					"table", r.cfg.Table.String(), "slot", r.stream.slotName(), "error", err, "error.type", failure.Type(err), "consecutive_failures", b.Failures())
			}
			if !r.sleep(d, r.kicks[0]) {
				return
			}
			continue
		}
		logged = ""
	}
}

// dropLostSlot drops the relay's slot if the server invalidated it (its
// wal_status is lost), and reports whether it did; a slot that is not
// there (dropped meanwhile) or no longer lost (made anew) is no error. The
// walsender that refused to stream from the lost slot holds it until it
// has sent the refusal and cleaned up, after the relay read the refusal:
// a lost slot that is still active is waited for (up to BatchTimeout),
// rather than taken for dropped by someone else.
func (r *Relay) dropLostSlot(ctx context.Context) (bool, error) {
	slot := r.stream.slot.Load()
	if slot == nil {
		return false, errors.New("relay: the slot's name is not known")
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.BatchTimeout)
	defer cancel()
	const wait = 10 * time.Millisecond
	for {
		var dropped, exists, lost bool
		var pid *int32
		err := pgx.BeginFunc(ctx, r.db, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, r.q.stream.DropLost, *slot)
			if err != nil {
				return err
			}
			if dropped = tag.RowsAffected() > 0; dropped {
				return nil
			}
			err = tx.QueryRow(ctx, r.q.stream.Slot, *slot).Scan(&exists, &lost, &pid)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			return err
		})
		switch {
		case err != nil:
			return false, fmt.Errorf("relay: drop the invalidated slot %s: %w", *slot, err)
		case dropped:
			return true, nil
		case !exists || !lost:
			return false, nil
		case pid == nil:
			continue // released between the two statements: drop it now
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-r.stop:
			t.Stop()
			return false, nil
		case <-ctx.Done():
			t.Stop()
			return false, fmt.Errorf("relay: drop the invalidated slot %s: it is still in use by the server process %d after %v (another relay's connection?): %w", *slot, *pid, r.cfg.BatchTimeout, ctx.Err())
		}
	}
}

// streamProgressErr refuses exactly-once streaming on a table whose
// progress is marks (chosen by Progress auto; Config refuses Progress
// marks): the stream's record needs the lanes' positions.
func (r *Relay) streamProgressErr() error {
	if r.cfg.Mode != Stream || r.eo == nil || r.progress == ProgressCursor {
		return nil
	}
	return fmt.Errorf("%w: %s: exactly-once streaming needs cursor progress, and Progress auto chose marks for this table: give a new table the cursor migration (migrations.Install), move an existing one as docs/progress.md says (Turning it on) and set Progress to relay.ProgressCursor, or use Mode Poll", ErrCursorNotReady, r.cfg.Table)
}

// replicationConfig returns the replication connection's configuration
// (pgoutput.Connect adds the replication parameters to a copy).
func (r *Relay) replicationConfig() (*pgconn.Config, error) {
	if r.cfg.Stream.ConnConfig != nil {
		return r.cfg.Stream.ConnConfig, nil
	}
	p, ok := r.db.(*pgxpool.Pool)
	if !ok {
		return nil, &outbox.ConfigError{Field: "Stream.ConnConfig", Reason: "is nil and the DB is not a *pgxpool.Pool: pass the replication connection's configuration"}
	}
	return &p.Config().ConnConfig.Config, nil
}

// streamOnce connects, makes sure the slot exists, takes it, publishes the
// events waiting in the table, then follows the stream until an error or
// Stop. It returns nil only when the relay is stopping.
func (r *Relay) streamOnce(ctx context.Context) error {
	// The progress picks the stream (cursor: relay/internal/feed); a relay
	// started while the database was down chooses it here.
	if err := r.settleProgress(ctx); err != nil {
		return err
	}
	if err := r.streamProgressErr(); err != nil {
		return err
	}
	if st := r.stream.state.Load(); st != int32(StreamStandby) && st != int32(StreamFallback) {
		r.stream.state.Store(int32(StreamStarting))
	}
	cfg, err := r.replicationConfig()
	if err != nil {
		return err
	}
	conn, err := pgoutput.Connect(ctx, pgoutput.Config{Conn: cfg, Table: r.cfg.Table, Timeout: r.cfg.BatchTimeout,
		StatusInterval: r.cfg.Stream.StatusInterval, Pending: r.cfg.MaxBatchSize, Progress: &r.stream.progress})
	if err != nil {
		return err
	}
	// Closing the connection ends the walsender and frees the slot.
	defer conn.Close(ctx)
	slot := conn.Slot()
	r.stream.slot.Store(&slot)
	s := &streamer{r: r, conn: conn}
	if r.cur != nil {
		// Cursor progress: publish what the stream decodes (relay/internal/feed).
		if err := s.createSlot(ctx); err != nil {
			return err
		}
		if err := conn.StartReplication(ctx); err != nil {
			return err
		}
		if r.stream.state.Load() != int32(StreamFallback) {
			r.stream.state.Store(int32(StreamStarting))
		}
		r.cfg.Logger.Info("outbox relay: streaming from the replication slot, publishing what it decodes", "table", r.cfg.Table.String(), "slot", conn.Slot(), "publication", r.cfg.Table.Publication())
		err = feed.Run(ctx, r.feedConfig(), feedHost{r}, conn, s.created)
	} else {
		if err := s.start(ctx); err != nil {
			return err
		}
		rctx, stopReader := context.WithCancel(ctx)
		go conn.Read(rctx)
		err = s.follow(ctx)
		stopReader()
		<-conn.Done()
	}
	if err == nil && r.stopping() {
		// A last report of the position before the connection closes.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		_ = conn.SendStatus(sctx)
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
	if err := s.conn.StartReplication(ctx); err != nil {
		return err
	}
	r.stream.state.Store(int32(StreamStarting))
	r.cfg.Logger.Info("outbox relay: streaming from the replication slot", "table", r.cfg.Table.String(), "slot", s.conn.Slot(), "publication", r.cfg.Table.Publication())
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

// createSlot creates the slot when it does not exist. That can take tens
// of seconds on a busy server (see pgoutput.Conn.CreateSlot): meanwhile the
// relay publishes by polling.
func (s *streamer) createSlot(ctx context.Context) error {
	r := s.r
	exists, lost, err := s.conn.SlotExists(ctx, r.db)
	if err != nil {
		return err
	}
	if exists {
		// An invalidated slot is not a usable one: StartReplication
		// says so, and runStream counts the loss once.
		if !lost {
			r.stream.slotFound()
		}
		return nil
	}
	// A relay that found or made the slot and finds it gone (dropped, or
	// the server is a promoted standby that never had it) counts a loss,
	// unless it is the invalidated slot it counted and dropped.
	r.stream.countLoss(slotMissing, func() {
		r.stream.state.Store(int32(StreamFallback))
		r.cfg.Logger.Error("outbox relay: the replication slot this relay streamed from is gone (dropped, or the server is a promoted standby without it); publishing from the table by polling (from the last checkpoint under cursor progress, from the marks otherwise) while a new slot is created, then streaming again",
			"table", r.cfg.Table.String(), "slot", s.conn.Slot())
	})
	if err := r.eoStreamFallback(ctx); err != nil {
		return err
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	var created bool
	go func() {
		defer close(done)
		created, err = s.conn.CreateSlot(cctx)
	}()
	stopped := context.AfterFunc(ctx, cancel)
	defer stopped()
	r.cfg.Logger.Info("outbox relay: creating the replication slot; publishing by polling until it is ready",
		"table", r.cfg.Table.String(), "slot", s.conn.Slot())
	r.loop(ctx, 0, done)
	cancel() // Stop came first: abandon the creation
	<-done
	if err == nil {
		// Made by this relay, or by another one meanwhile: a new slot.
		r.stream.slotFound()
	}
	s.created = created
	if created {
		r.cfg.Logger.Info("outbox relay: created the replication slot; events written before it are published from the table first",
			"table", r.cfg.Table.String(), "slot", s.conn.Slot(), "failover", s.conn.Failover())
	}
	return err
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
	if err := tx.QueryRow(cctx, r.q.stream.MaxID).Scan(&s.maxSeen); err != nil {
		return fmt.Errorf("relay: read the table's highest id: %w", err)
	}
	return nil
}

// sweep publishes the unpublished rows up to id upto (every row when 0)
// with the polling claim, until it finds none it can take, reporting the
// position to the server between batches when report is set.
func (s *streamer) sweep(ctx context.Context, upto int64, report bool) error {
	r := s.r
	size := r.cfg.BatchSize
	for {
		_, next, err := r.runOnce(ctx, size, upto, nil)
		if err != nil {
			return err
		}
		if report {
			if err := s.conn.SendStatus(ctx); err != nil {
				return err
			}
		}
		if next == 0 {
			break
		}
		size = next
		if r.stopping() {
			return nil
		}
	}
	s.sweepAt = time.Now()
	s.needSweep = len(r.heldKeys()) > 0
	return nil
}

// follow publishes the transactions the reader hands over, in batches,
// until an error or Stop: a batch takes what waits, and waits up to Linger
// from the reception of its first row for more (up to MaxBatchSize rows).
func (s *streamer) follow(ctx context.Context) error {
	r := s.r
	b := r.newBackoff()
	for {
		if r.stopping() {
			return nil
		}
		if len(s.ready) == 0 {
			if _, done, err := s.await(time.Until(s.nextSweep()), true); done {
				return err
			}
		}
		for len(s.ready) > 0 && len(s.ready) < r.cfg.MaxBatchSize {
			took, done, err := s.await(0, false)
			if done {
				return err
			}
			if took {
				continue
			}
			d := time.Until(s.readySince.Add(r.cfg.Stream.Linger))
			if d <= 0 {
				break
			}
			if _, done, err := s.await(d, false); done {
				return err
			}
		}
		if len(s.ready) > 0 {
			if err := s.publish(ctx); err != nil {
				if failure.FromDatabase(err) && !errors.Is(err, context.DeadlineExceeded) {
					// The database failed: reconnect (on the new
					// connection the table's waiting rows go first).
					return err
				}
				// The broker fails: keep the rows, back off (the reader
				// keeps reporting the position) and try again.
				r.health.set(0, err)
				if !r.failed(&b, err, "outbox relay: publishing the stream failed; its events stay unpublished and are retried with backoff", r.kicks[0]) {
					return nil
				}
				continue
			}
			if b.Failures() > 0 {
				r.recovered(&b)
			}
			r.health.set(0, nil)
		}
		if time.Now().After(s.nextSweep()) {
			if err := s.sweep(ctx, s.maxSeen, false); err != nil {
				if failure.FromDatabase(err) {
					return err
				}
				r.health.set(0, err)
				s.sweepAt = time.Now()
				s.needSweep = true
			}
		}
	}
}

// await takes the next transaction the reader hands over, waiting up to d
// and, with watchStop, until Stop; without watchStop and with d <= 0 it
// does not wait. took reports a transaction taken; done that following
// ends: Stop, or the reader stopped (err says why).
func (s *streamer) await(d time.Duration, watchStop bool) (took, done bool, err error) {
	var tx pgoutput.Tx
	ok := true
	if d <= 0 && !watchStop {
		select {
		case tx, ok = <-s.conn.Txs():
		default:
			return false, false, nil
		}
	} else {
		var stop <-chan struct{}
		if watchStop {
			stop = s.r.stop
		}
		t := time.NewTimer(max(d, 0))
		defer t.Stop()
		select {
		case <-stop:
			return false, true, nil
		case tx, ok = <-s.conn.Txs():
		case <-t.C:
			return false, false, nil
		}
	}
	if !ok {
		return false, true, s.conn.Err()
	}
	s.take(tx)
	return true, false, nil
}

// take adds a transaction to the batch being gathered. Its rows must be
// visible by visibleWait after its commit, measured on the server's clock
// (commit to send) and carried over to the relay's from the moment it
// arrived, so that clock skew does not count.
func (s *streamer) take(tx pgoutput.Tx) {
	if len(s.ready) == 0 {
		s.readySince = tx.Received
		s.r.stream.oldest.Store(tx.Commit.UnixNano())
	}
	visibleBy := tx.Received.Add(visibleWait - tx.Age)
	for _, x := range tx.Rows {
		s.ready = append(s.ready, streamRow{Row: x.Row, bad: x.Err, visibleBy: visibleBy})
		s.maxSeen = max(s.maxSeen, x.ID)
	}
	s.readyTo = max(s.readyTo, tx.End)
}

func (s *streamer) nextSweep() time.Time {
	if s.needSweep {
		return s.sweepAt.Add(s.r.cfg.PollInterval)
	}
	return s.sweepAt.Add(s.r.cfg.Stream.SweepInterval)
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
