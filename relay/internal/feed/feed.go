// Package feed is the streaming relay's side of one replication connection
// under cursor progress: it publishes what the slot decodes, keeps each
// key's order through failures, confirms positions, writes the stream's
// checkpoint into the lanes' positions, hands over from polling at start,
// and, exactly once, keeps the stream's record in the progress topic.
//
// The relay owns the connection, the slot, the publishing (Host.Publish:
// its publisher, spans and metrics) and the charges of failed rows; the
// feed owns what it holds in memory and when a position is confirmed.
package feed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/relay/internal/claim"
	"github.com/fxoutbox/outbox/relay/internal/cursor"
	"github.com/fxoutbox/outbox/relay/internal/eo"
	"github.com/fxoutbox/outbox/relay/internal/failure"
	"github.com/fxoutbox/outbox/relay/internal/kafkaproducer"
	"github.com/fxoutbox/outbox/relay/internal/pgoutput"
	"github.com/fxoutbox/outbox/relay/internal/snapshot"
	"github.com/fxoutbox/outbox/relay/internal/streamsql"
)

// Host is what a feed needs of its relay.
type Host interface {
	// PollOnce runs one polling batch of up to size rows (the handover)
	// and returns the size of the next one, 0 once caught up.
	PollOnce(ctx context.Context, size int) (next int, err error)
	// Publish sends rows, in order, through the relay's publisher, or,
	// with txn, in that Kafka transaction; commit, when not nil, runs
	// after the sends (and may fail acknowledged rows), before the
	// relay's spans and metrics. It returns each row's error (nil:
	// acknowledged) and the rows found failing on their own.
	Publish(ctx context.Context, rows []claim.Row, txn *kafkaproducer.Txn, commit func(errs []error)) (errs []error, alone []int)
	// ChargeUnreadable charges (and parks, unless Poison Hold) the rows
	// that could not be decoded, in tx, and returns the ids it charged.
	ChargeUnreadable(ctx context.Context, tx pgx.Tx, bad []claim.Unreadable) ([]int64, error)
	// ParkLimit is the attempts after which a row that failed with err
	// parks (0: at once).
	ParkLimit(err error, alone bool) int32
	// QueueCharge queues a try counted on each of the failed rows ids
	// (cursor.Engine.QueueCharge); seen gets each row charged and whether
	// it was parked.
	QueueCharge(b *pgx.Batch, ids []int64, reasons []string, limits []int32, errs []error, seen func(id int64, parked bool))
	// LogFailures logs the failed rows rows[failed[j]] (parked: by id).
	LogFailures(rows []claim.Row, errs []error, failed []int, reasons []string, parked map[int64]bool)
	// NoteTopics tells the relay the outcome of a batch's rows by topic
	// (topics the broker says are missing park their events for a while).
	NoteTopics(topics []string, errs []error, now time.Time)
	// Streaming says the feed streams: the relay's state and health.
	Streaming()
	// Health sets the relay's health (nil: healthy).
	Health(err error)
	// Failed and Recovered say whether to log a failed batch (err) or the
	// first batch after failures.
	Failed(err error) bool
	Recovered() bool
	// Backoff is the wait before a key's retry after fails failures.
	Backoff(fails int) time.Duration
	// Sleep waits d, false when the relay stops meanwhile.
	Sleep(d time.Duration) bool
	// Stop is closed when the relay stops; Stopping says it was.
	Stop() <-chan struct{}
	Stopping() bool
}

// Config is the relay's settings and parts a feed uses.
type Config struct {
	Table                              outbox.Table
	Logger                             *slog.Logger
	Lanes, BatchSize, MaxBatchSize     int
	BatchTimeout, PollInterval, Linger time.Duration
	Hold                               bool  // Poison Hold: nothing parks
	Held                               error // relay.ErrHeld: a row not sent because its key waits
	DB                                 interface {
		Begin(ctx context.Context) (pgx.Tx, error)
	}
	Cur      *cursor.Engine
	Durable  string // makes a transaction's commit synchronous
	Stream   streamsql.Queries
	NS       int32
	EO       *eo.Pool    // Delivery ExactlyOnce, nil otherwise
	Observer eo.Observer // the relay's metrics of Kafka transactions
	// The stream's state that others read (StreamStatus, metrics).
	Progress     *pgoutput.Progress
	Oldest       *atomic.Int64 // unix nanoseconds of the oldest unfinished transaction's commit
	CheckpointAt *atomic.Int64 // unix nanoseconds of the last checkpoint written
}

// The stream under cursor progress publishes what it decodes: a decoded
// insert carries every column the Kafka record needs, so the relay builds
// the record from it (the pipeline's messages and publish), reads nothing
// back, waits for no visibility and writes nothing per event. A feed is one
// replication connection's worth of that:
//
//   - Decoding and publishing overlap. The reader (pgoutput.Conn.Read)
//     decodes into a channel of MaxBatchSize transactions; the feed takes
//     them into its queue while one batch is in flight (a goroutine of its
//     own), up to feedMaxRows rows or feedMaxBytes of payload in memory, and
//     sends the next batch when that one is settled.
//   - Per-key order: a batch holds the queue's rows in commit order (a
//     transaction's rows in their order). A key that fails waits with its
//     later rows (held, in order) for its paced retry while the other keys
//     flow; a permanent failure is charged in the row and, out of
//     attempts, the row moves to <table>_parked (cursor.Charge, Unpark).
//   - Progress: a transaction's end is confirmed once all its rows are
//     acknowledged or parked, and those before it too. Once a second the
//     feed writes a checkpoint: every lane's done snapshot becomes a
//     snapshot that the confirmed position covers (see checkpoint), so that
//     the table's own progress (counts, cleanup, polling) follows the stream
//     and a relay that cannot stream (the slot lost or dropped) polls on
//     from there.
//   - Start (handover): rows committed before the slot's position are not in
//     the stream. The relay polls the table (the cursor claim) until every
//     lane's done snapshot covers a snapshot taken after replication
//     started, then streams, skipping the decoded rows that every lane's
//     position already holds (see handover).
//
// Duplicates per crash: the events the stream published after the
// snapshot of the last checkpoint, which the next start's polling (or the
// slot, from its confirmed position) sends again. A checkpoint's snapshot
// is taken at one tick and written at the next once the confirmed position
// passed it: about two checkpointEvery, plus the stream's lag at the
// crash. The handover adds the rows that the lanes whose positions went
// furthest delivered past the others' (rows written during the last
// polling batch).

// checkpointEvery is the period of the stream's checkpoint: its one write
// (the lanes' positions, in one statement) per period at most.
const checkpointEvery = time.Second

// feedMaxRows and feedMaxBytes bound the decoded rows the feed keeps
// (queued, in flight, or held behind their key's failure): beyond them it
// stops taking transactions from the reader, which stops reading, so the
// server keeps the WAL instead. While keys wait for their retries the other
// keys go on for that many rows, then everything waits.
const (
	feedMaxRows  = 10000
	feedMaxBytes = 64 << 20
)

// feedTx is a decoded transaction whose rows are not all resolved.
type feedTx struct {
	end    pglogrepl.LSN
	commit time.Time
	left   int // rows neither acknowledged nor parked nor skipped
}

// feedRow is a decoded row waiting to be published.
type feedRow struct {
	claim.Row
	tx   *feedTx
	bad  error  // could not be decoded: parked by id
	txid uint64 // its transaction's id (exactly-once: the stream's record)
}

// heldKey is a key that failed: its rows from the failed one on, in order,
// wait for the retry at at.
type heldKey struct {
	rows  []*feedRow
	at    time.Time
	fails int
}

// feedResult is the outcome of one batch's publish.
type feedResult struct {
	rows  []*feedRow
	errs  []error
	alone []int
	// restart (exactly-once): the stream starts over from its record
	// (errRestart); nothing of the batch is settled.
	restart error
}

// feed follows one replication connection under cursor progress.
type feed struct {
	cfg  Config
	host Host
	conn *pgoutput.Conn
	skip snapshot.Snapshot // rows whose transaction it sees were delivered by polling

	txs     []*feedTx // in commit order, oldest first
	queue   []*feedRow
	since   time.Time // when the queue's first row arrived
	held    map[string]*heldKey
	rows    int // rows in memory
	bytes   int // their payloads
	busy    bool
	results chan feedResult
	b       backoffState
	// lastFails: the consecutive failures of the keys that failed and
	// have not had a row resolved since (their retries' pacing).
	lastFails map[string]int

	cand     *snapshot.Candidate // the next checkpoint, once the position passed it
	cpAt     time.Time           // when the last checkpoint was attempted
	resolved int64               // rows resolved so far
	written  int64               // resolved when the last checkpoint written was taken
	cpWarned bool
	lastEnd  pglogrepl.LSN // the end of the last transaction received

	eo *eo.Stream // Delivery ExactlyOnce: the stream's record (eo.go)
}

// backoffState counts the feed's consecutive failed batches (nothing
// acknowledged, the broker failing), for the health and the log.
type backoffState struct{ failures int }

// Run publishes from conn (replication started, the reader not yet)
// until Stop or an error; created says this relay made the slot.
func Run(ctx context.Context, cfg Config, host Host, conn *pgoutput.Conn, created bool) error {
	f := &feed{cfg: cfg, host: host, conn: conn, held: map[string]*heldKey{}, lastFails: map[string]int{}, results: make(chan feedResult, 1)}
	rctx, stopReader := context.WithCancel(ctx)
	go conn.Read(rctx)
	var err error
	resume := false
	if cfg.EO != nil {
		resume, err = f.eoStart(ctx, created)
	}
	if err == nil && !resume {
		err = f.handover(ctx)
	}
	if err == nil {
		err = f.follow(ctx)
	}
	stopReader()
	<-conn.Done()
	return err
}

// handover polls the table (the cursor claim) until every lane's position
// covers a snapshot taken now, after replication started: every row
// committed before the slot's position is then delivered, and every row
// committed after that snapshot is in the stream. The stream skips the
// rows every lane delivered (the intersection of the lanes' snapshots).
func (f *feed) handover(ctx context.Context) error {
	if err := f.cfg.Cur.Ready(ctx); err != nil {
		return err
	}
	var start string
	if err := f.query(ctx, f.cfg.Stream.Snapshot, nil, func(rows pgx.Rows) error {
		_, err := pgx.ForEachRow(rows, []any{&start}, func() error { return nil })
		return err
	}); err != nil {
		return fmt.Errorf("relay: stream handover of %s: %w", f.cfg.Table, err)
	}
	size := f.cfg.BatchSize
	for began := time.Now(); ; {
		if f.host.Stopping() {
			return nil
		}
		select {
		case <-f.conn.Done():
			return f.readerErr()
		default:
		}
		next, err := f.host.PollOnce(ctx, size)
		if err != nil {
			return err
		}
		if next > 0 {
			size = next
			continue
		}
		size = f.cfg.BatchSize
		for try := 0; try < 2; try++ {
			dones, covered, err := f.lanesCover(ctx, start)
			if err != nil {
				return fmt.Errorf("relay: stream handover of %s: %w", f.cfg.Table, err)
			}
			if covered {
				return f.handedOver(ctx, dones, began)
			}
			if try == 0 {
				// Windows that a batch left open at its limit close when
				// read to their end, and lanes without events move on to
				// now; a lane whose key waits for a retry waits for it.
				if err := f.closeWindows(ctx, start); err != nil {
					return err
				}
			}
		}
		if !f.host.Sleep(f.cfg.PollInterval) {
			return nil
		}
	}
}

// handedOver starts streaming: the decoded rows that every lane's done
// snapshot sees were delivered by polling.
func (f *feed) handedOver(ctx context.Context, dones []string, began time.Time) error {
	snaps := make([]snapshot.Snapshot, 0, len(dones))
	for _, d := range dones {
		s, err := snapshot.Parse(d)
		if err != nil {
			return fmt.Errorf("relay: stream handover of %s: %w", f.cfg.Table, err)
		}
		snaps = append(snaps, s)
	}
	f.skip = snapshot.Intersect(snaps)
	if f.eo != nil {
		if err := f.eoHandedOver(ctx); err != nil {
			return err
		}
	}
	f.host.Streaming()
	f.cfg.Logger.Info("outbox relay: streaming; the table's waiting events were published by polling first",
		"table", f.cfg.Table.String(), "slot", f.conn.Slot(), "handover", time.Since(began).Round(time.Millisecond))
	return nil
}

// closeWindows reads on the lanes nobody holds whose position does not
// cover snapshot snap (open windows, and closed ones behind it), as the
// cursor's sweep of idle lanes does (publishing nothing): a window with no
// row left in it closes, at this moment's snapshot for a closed lane; one
// with rows stops before them, for the next claim.
func (f *feed) closeWindows(ctx context.Context, snap string) error {
	ctx, cancel := context.WithTimeout(ctx, f.cfg.BatchTimeout)
	defer cancel()
	err := pgx.BeginFunc(ctx, f.cfg.DB, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, f.cfg.Cur.Q.Uncovered, pgx.NamedArgs{"ns": f.cfg.NS, "s": snap})
		if err != nil {
			return err
		}
		open, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil || len(open) == 0 {
			return err
		}
		_, err = f.cfg.Cur.MoveOn(ctx, tx, open)
		return err
	})
	f.cfg.Cur.Forget() // the positions changed outside a batch: read them again
	if err != nil {
		return fmt.Errorf("relay: stream handover of %s: read on the open windows: %w", f.cfg.Table, err)
	}
	return nil
}

// lanesCover reads the lanes' done snapshots and whether every lane is
// closed and sees every transaction snap sees.
func (f *feed) lanesCover(ctx context.Context, snap string) (dones []string, covered bool, err error) {
	n, all := 0, true
	err = f.query(ctx, f.cfg.Cur.Q.Covers, pgx.NamedArgs{"s": snap}, func(rows pgx.Rows) error {
		var d string
		var ok bool
		_, err := pgx.ForEachRow(rows, []any{&d, &ok}, func() error {
			n++
			dones = append(dones, d)
			all = all && ok
			return nil
		})
		return err
	})
	return dones, err == nil && all && n == f.cfg.Lanes, err
}

// query runs one statement in a transaction of its own, bounded by
// BatchTimeout.
func (f *feed) query(ctx context.Context, sql string, args pgx.NamedArgs, scan func(pgx.Rows) error) error {
	ctx, cancel := context.WithTimeout(ctx, f.cfg.BatchTimeout)
	defer cancel()
	return pgx.BeginFunc(ctx, f.cfg.DB, func(tx pgx.Tx) error {
		var a []any
		if args != nil {
			a = []any{args}
		}
		rows, err := tx.Query(ctx, sql, a...)
		if err != nil {
			return err
		}
		return scan(rows)
	})
}

// readerErr is why the reader stopped.
func (f *feed) readerErr() error {
	if err := f.conn.Err(); err != nil {
		return err
	}
	return errors.New("relay: the replication reader stopped")
}

// follow is the feed's loop: it takes transactions from the reader, sends
// batches (one in flight), settles their outcomes, confirms positions and
// writes checkpoints, until Stop (after the batch in flight) or an error.
func (f *feed) follow(ctx context.Context) error {
	stopping := false
	var err error
	for {
		if stopping || err != nil {
			if f.busy {
				res := <-f.results
				f.busy = false
				if serr := f.settle(ctx, res); err == nil {
					err = serr
				}
			}
			if err == nil {
				f.finish(ctx)
			}
			return err
		}
		now := time.Now()
		if !f.busy {
			if batch := f.next(now); len(batch) > 0 {
				f.dispatch(ctx, batch)
			}
		}
		var txs <-chan pgoutput.Tx
		if f.rows < feedMaxRows && f.bytes < feedMaxBytes {
			txs = f.conn.Txs()
		}
		t := time.NewTimer(f.wait(now))
		select {
		case <-f.host.Stop():
			stopping = true
		case tx, ok := <-txs:
			if !ok {
				err = f.readerErr()
			} else {
				err = f.take(ctx, tx)
			}
		case res := <-f.results:
			f.busy = false
			err = f.settle(ctx, res)
		case <-t.C:
		}
		t.Stop()
		if err == nil && time.Since(f.cpAt) >= checkpointEvery {
			f.checkpoint(ctx, false)
		}
		if err == nil {
			f.eoAdvance(ctx)
		}
	}
}

// wait is how long the loop may sleep: until the queue's linger ends (when
// no batch is in flight), a held key's retry, or the next checkpoint.
func (f *feed) wait(now time.Time) time.Duration {
	d := time.Until(f.cpAt.Add(checkpointEvery))
	if f.eo != nil {
		d = min(d, time.Until(f.eo.CandAt.Add(eoCandEvery)))
	}
	if !f.busy {
		if len(f.queue) > 0 {
			d = min(d, f.since.Add(f.cfg.Linger).Sub(now))
		}
		for _, h := range f.held {
			d = min(d, h.at.Sub(now))
		}
	}
	return max(d, 0)
}

// take adds a decoded transaction: its rows that every lane delivered
// already (exactly-once: that the stream's record holds) are resolved at
// once, those of a held key join it, the others the queue.
func (f *feed) take(ctx context.Context, x pgoutput.Tx) error {
	var skip []bool
	if f.eo != nil {
		var err error
		if skip, err = f.eo.Skip(ctx, x, f.cfg.Cur.KeyLanes); err != nil {
			return err
		}
	}
	tx := &feedTx{end: x.End, commit: x.Commit}
	f.txs = append(f.txs, tx)
	f.lastEnd = x.End
	if len(f.txs) == 1 {
		f.cfg.Oldest.Store(x.Commit.UnixNano())
	}
	for i, d := range x.Rows {
		if skip != nil && skip[i] || skip == nil && d.Txid != 0 && f.skip.Visible(d.Txid) {
			continue
		}
		if d.Err != nil && d.ID == 0 {
			f.cfg.Logger.Error("outbox relay: a streamed row could not be decoded, not even its id; skipped", "table", f.cfg.Table.String(), "error", d.Err)
			continue
		}
		r := &feedRow{Row: d.Row, tx: tx, bad: d.Err, txid: d.Txid}
		tx.left++
		f.rows++
		f.bytes += len(r.Payload) + len(r.Headers)
		if h := f.held[r.Key]; h != nil {
			h.rows = append(h.rows, r)
			continue
		}
		if len(f.queue) == 0 {
			f.since = x.Received
		}
		f.queue = append(f.queue, r)
	}
	f.confirm()
	return nil
}

// next takes the next batch: the rows of the held keys whose retry is due
// (each key's in order), then the queue's, up to MaxBatchSize; nothing
// while the queue's linger runs and less than a batch waits.
func (f *feed) next(now time.Time) []*feedRow {
	max := f.cfg.MaxBatchSize
	var batch []*feedRow
	for k, h := range f.held {
		// A due key's rows go first (the queue holds none of the key's);
		// those past a full batch stay held, due, for the next one.
		if n := min(len(h.rows), max-len(batch)); n > 0 && !now.Before(h.at) {
			batch = append(batch, h.rows[:n]...)
			if h.rows = h.rows[n:]; len(h.rows) == 0 {
				delete(f.held, k)
			}
		}
	}
	if len(batch) == 0 && len(f.queue) < max && now.Before(f.since.Add(f.cfg.Linger)) || f.eoFull() {
		return batch
	}
	n := min(len(f.queue), max-len(batch))
	if n > 0 {
		batch = append(batch, f.queue[:n]...)
		f.queue = slices.Delete(f.queue, 0, n)
		f.since = now
	}
	return batch
}

// publish sends a batch (the feed's goroutine of the batch in flight).
func (f *feed) publish(ctx context.Context, batch []*feedRow) {
	ctx, cancel := context.WithTimeout(ctx, f.cfg.BatchTimeout)
	defer cancel()
	res, rows, at := splitBatch(batch)
	if len(rows) > 0 {
		errs, alone := f.host.Publish(ctx, rows, nil, nil)
		for j, i := range at {
			res.errs[i] = errs[j]
		}
		for _, j := range alone {
			res.alone = append(res.alone, at[j])
		}
	}
	f.results <- res
}

// settle applies a batch's outcomes: acknowledged rows are resolved;
// unreadable rows and rows that failed permanently are charged (and parked
// when out of attempts, or at once when no retry can help); a key that
// failed waits, with its later rows, for its paced retry. It returns an
// error only when the database failed.
func (f *feed) settle(ctx context.Context, res feedResult) error {
	if res.restart != nil {
		// Exactly-once: nothing of the batch committed, or not known;
		// the stream starts over from its record.
		return res.restart
	}
	defer f.eoSettled(res)
	now := time.Now()
	var (
		failed  []int // permanent failures to charge
		bad     []claim.Unreadable
		badAt   = map[int64]int{}
		acked   int
		trans   error
		stopped = map[string]int{} // key -> the index of its first unresolved row
	)
	// A key's first failure stops it; its later rows in the batch are
	// f.cfg.Held (see publish).
	for i, x := range res.rows {
		err := res.errs[i]
		if _, ok := stopped[x.Key]; ok {
			continue
		}
		switch {
		case err == nil:
			acked++
		case x.bad != nil:
			badAt[x.ID] = i
			bad = append(bad, claim.Unreadable{ID: x.ID, Err: x.bad})
		case outbox.IsPermanent(err):
			failed = append(failed, i)
		default:
			if !errors.Is(err, f.cfg.Held) && trans == nil {
				trans = err
			}
			stopped[x.Key] = i
		}
	}
	stop := func(i int) { // the key of row i stops at it, or before
		if j, ok := stopped[res.rows[i].Key]; !ok || i < j {
			stopped[res.rows[i].Key] = i
		}
	}
	if len(failed) > 0 || len(bad) > 0 {
		parked, err := f.charge(ctx, res, failed, bad, badAt)
		for _, i := range failed {
			if !parked[i] {
				stop(i)
				if err == nil {
					res.rows[i].Attempts++ // sent alone first next time
				}
			}
		}
		for _, b := range bad {
			if i := badAt[b.ID]; !parked[i] {
				stop(i)
			}
		}
		if err != nil {
			// Nothing was charged: the rows wait and go again after a
			// reconnection.
			f.host.Health(err)
			f.requeue(res, stopped, now)
			return err
		}
	}
	// Unknown topics are remembered (their events park at once for a
	// while), as the pipeline does.
	topics := make([]string, len(res.rows))
	for i, x := range res.rows {
		topics[i] = x.Topic
	}
	f.host.NoteTopics(topics, res.errs, now)
	for i, x := range res.rows {
		if j, ok := stopped[x.Key]; ok && i >= j {
			continue
		}
		f.resolve(x)
	}
	f.requeue(res, stopped, now)
	switch {
	case acked == 0 && trans != nil:
		f.b.failures++
		f.host.Health(trans)
		if f.host.Failed(trans) {
			f.cfg.Logger.Warn("outbox relay: publishing the stream failed; its events wait in the relay and are retried with backoff (nothing is confirmed past them)",
				"table", f.cfg.Table.String(), "error", trans, "error.type", failure.Type(trans), "consecutive_failures", f.b.failures)
		}
	case acked > 0:
		if f.b.failures > 0 && f.host.Recovered() {
			f.cfg.Logger.Info("outbox relay: publishing again", "table", f.cfg.Table.String(), "after_failures", f.b.failures)
		}
		f.b.failures = 0
		f.host.Health(nil)
	}
	f.confirm()
	return nil
}

// requeue makes each stopped key wait for its retry: its rows of the batch
// from the stopped one on, then its rows that arrived meanwhile (taken out
// of the queue), in order.
func (f *feed) requeue(res feedResult, stopped map[string]int, now time.Time) {
	for k, j := range stopped {
		var rows []*feedRow
		for i := j; i < len(res.rows); i++ {
			if res.rows[i].Key == k {
				rows = append(rows, res.rows[i])
			}
		}
		if h := f.held[k]; h != nil {
			// Cannot happen (a held key's rows are in no batch and the
			// queue), but order first: the batch's rows are older.
			rows = append(rows, h.rows...)
		}
		kept := f.queue[:0]
		for _, x := range f.queue {
			if x.Key == k {
				rows = append(rows, x)
			} else {
				kept = append(kept, x)
			}
		}
		clear(f.queue[len(kept):])
		f.queue = kept
		fails := 1
		if h := f.held[k]; h != nil {
			fails = h.fails + 1
		} else if prev, ok := f.lastFails[k]; ok {
			fails = prev + 1
		}
		f.held[k] = &heldKey{rows: rows, at: now.Add(f.host.Backoff(fails)), fails: fails}
		f.lastFails[k] = fails
	}
}

// resolve counts a row acknowledged, parked or skipped.
func (f *feed) resolve(x *feedRow) {
	x.tx.left--
	f.rows--
	f.bytes -= len(x.Payload) + len(x.Headers)
	f.resolved++
	delete(f.lastFails, x.Key)
	f.eoResolved(x)
}

// confirm confirms the end of the oldest transactions whose rows are all
// resolved.
func (f *feed) confirm() {
	n := 0
	for n < len(f.txs) && f.txs[n].left == 0 {
		n++
	}
	if n == 0 {
		return
	}
	f.conn.Confirm(f.txs[n-1].end)
	clear(f.txs[:n])
	f.txs = slices.Delete(f.txs, 0, n)
	if len(f.txs) > 0 {
		f.cfg.Oldest.Store(f.txs[0].commit.UnixNano())
	} else {
		f.cfg.Oldest.Store(0)
	}
}

// charge counts a try on the failed rows and the unreadable ones, in one
// transaction: a row out of attempts (or that no retry can help) moves to
// the parked table. It returns the batch indexes parked.
func (f *feed) charge(ctx context.Context, res feedResult, failed []int, bad []claim.Unreadable, badAt map[int64]int) (map[int]bool, error) {
	ctx, cancel := context.WithTimeout(ctx, f.cfg.BatchTimeout)
	defer cancel()
	parked := map[int]bool{}
	rows := make([]claim.Row, len(res.rows))
	for i, x := range res.rows {
		rows[i] = x.Row
	}
	reasons := make([]string, len(failed))
	var logged map[int64]bool
	err := pgx.BeginFunc(ctx, f.cfg.DB, func(tx pgx.Tx) error {
		if len(bad) > 0 {
			ids, err := f.host.ChargeUnreadable(ctx, tx, bad)
			if err != nil {
				return err
			}
			for _, id := range ids {
				parked[badAt[id]] = true
			}
			if !f.cfg.Hold {
				// Not parked now: the row is gone (parked, or deleted,
				// already), nothing is left to do.
				for _, b := range bad {
					parked[badAt[b.ID]] = true
				}
			}
		}
		if len(failed) == 0 {
			return nil
		}
		ids := make([]int64, len(failed))
		limits := make([]int32, len(failed))
		errs := make([]error, len(failed))
		at := map[int64]int{}
		for j, i := range failed {
			ids[j], errs[j], at[rows[i].ID] = rows[i].ID, res.errs[i], i
			reasons[j] = failure.Reason(res.errs[i], rows[i].Topic)
			limits[j] = f.host.ParkLimit(res.errs[i], slices.Contains(res.alone, i))
		}
		logged = map[int64]bool{}
		b := &pgx.Batch{}
		f.host.QueueCharge(b, ids, reasons, limits, errs, func(id int64, p bool) {
			logged[id] = p
			if p {
				parked[at[id]] = true
			}
		})
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		for _, i := range failed {
			if _, ok := logged[rows[i].ID]; !ok {
				// Not in the table any more (parked, or deleted, by an
				// operator or another relay): nothing is left to do.
				parked[i] = true
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("relay: charge %d failed and %d unreadable streamed events: %w", len(failed), len(bad), &failure.DBStep{Err: err})
	}
	if len(failed) > 0 {
		byID := map[int64]bool{}
		for id, p := range logged {
			byID[id] = p
		}
		errs := make([]error, len(rows))
		copy(errs, res.errs)
		f.host.LogFailures(rows, errs, failed, reasons, byID)
	}
	return parked, nil
}

// splitBatch is a batch's result to fill, its readable rows and their
// places in the batch; the rows that could not be read have their errors.
func splitBatch(batch []*feedRow) (res feedResult, rows []claim.Row, at []int) {
	res = feedResult{rows: batch, errs: make([]error, len(batch))}
	for i, x := range batch {
		if x.bad != nil {
			res.errs[i] = x.bad
			continue
		}
		rows = append(rows, x.Row)
		at = append(at, i)
	}
	return res, rows, at
}
