package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/dberr"
	"github.com/fxoutbox/outbox/relay/internal/claim"
	"github.com/fxoutbox/outbox/relay/internal/cursor"
	"github.com/fxoutbox/outbox/relay/internal/eo"
	"github.com/fxoutbox/outbox/relay/internal/kafkaproducer"
)

// Delivery says how often a relay promises each event reaches Kafka.
type Delivery int

const (
	// AtLeastOnce (the default): a crash between the broker's
	// acknowledgement and the database mark sends the batch again (same
	// x-event-id); consumers drop the repeats (the inbox does).
	AtLeastOnce Delivery = iota
	// ExactlyOnce publishes each batch in a Kafka transaction that also
	// writes a progress record for each of its lanes to the table's
	// progress topic, and marks the rows after the commit: every event
	// reaches each read_committed consumer once, in per-key order, across
	// relay, broker and database crashes (see docs/exactly-once.md). It
	// needs Ordering PerKey and a SaramaPublisher. In Mode Stream it needs
	// ProgressCursor, and each batch of the stream is one transaction with
	// the stream's record (docs/streaming.md).
	ExactlyOnce
)

func (d Delivery) String() string {
	switch d {
	case AtLeastOnce:
		return "at-least-once"
	case ExactlyOnce:
		return "exactly-once"
	}
	return "Delivery(" + strconv.Itoa(int(d)) + ")"
}

// kafkaSource is a publisher that can give the relay its brokers and
// sarama configuration, for the transactional producers of ExactlyOnce.
// SaramaPublisher (and a type embedding it) is one.
type kafkaSource interface {
	kafka() ([]string, *sarama.Config, string)
}

// kafka returns the brokers, the configuration and how connection errors
// name the brokers (NameBrokers).
func (p *SaramaPublisher) kafka() ([]string, *sarama.Config, string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.addrs, p.cfg, brokersText(p.setting, p.addrs)
}

// exactlyOnceSource is pub as ExactlyOnce needs it: a kafkaSource.
func exactlyOnceSource(pub Publisher) (kafkaSource, error) {
	src, ok := pub.(kafkaSource)
	if !ok {
		return nil, &outbox.ConfigError{Field: "Delivery", Reason: "is exactly-once, which publishes through the relay's own transactional producer: pass a *relay.SaramaPublisher (or a type embedding it) as the publisher"}
	}
	return src, nil
}

// newExactlyOnce returns ExactlyOnce's transactional producers, on the
// brokers of src.
func newExactlyOnce(src kafkaSource, cfg Config, m *metrics) *eo.Pool {
	addrs, conf, brokers := src.kafka()
	return eo.New(eo.Config{Addrs: addrs, Brokers: brokers, Sarama: conf, Topic: cfg.ProgressTopic, Prefix: cfg.TransactionalID,
		Timeout: cfg.TransactionTimeout, Table: cfg.Table.String(), Closed: ErrPublisherClosed, Observer: m, Logger: cfg.Logger})
}

// eoBatch is an ExactlyOnce batch: its worker, its lanes, and what became
// of its Kafka transaction.
type eoBatch struct {
	w         *eo.Worker
	keep      *eo.Keeper // the worker's kept lanes (nil: none)
	lanes     map[int32]bool
	laneOf    map[uuid.UUID]int32 // event id -> lane
	committed bool                // the batch's Kafka transaction committed (or may have)
	started   time.Time           // when the batch's claim took its worker
	// written is, per lane, the event ids of the last progress record
	// written in the transaction, nil when its outcome is not known to be
	// stored (see txnPublisher).
	written map[int32][]uuid.UUID
	// Under ProgressCursor: the cursor batch, each lane's position if
	// every row sent is acknowledged (sent with the events), and the
	// position in the last progress record written.
	cur        *cursor.Batch
	predicted  map[int32]cursor.Lane
	writtenPos map[int32]string
	// topics are, per lane, the topics of the events the transaction sent
	// (its progress records name them).
	topics map[int32][]string
}

// kafkaStepError is a failure of Kafka inside a database step (the
// exactly-once claim's acquisitions): not classified as the database's.
type kafkaStepError struct{ err error }

func (e *kafkaStepError) Error() string { return e.err.Error() }
func (e *kafkaStepError) Unwrap() error { return e.err }

// eoClaim is the ExactlyOnce finder: the PerKey claim's lanes (locked as
// always, the worker's own lanes first), taken over by the batch's worker
// (see eoAcquire) before their rows are read, in a new statement after the
// locks and the acquisitions.
func (r *Relay) eoClaim(ctx context.Context, tx pgx.Tx, n int, held []string, b *eoBatch) (claimed, error) {
	client, err := r.eo.Connect(ctx)
	if err != nil {
		return claimed{}, &kafkaStepError{err}
	}
	b.w, b.started = r.eoTake(client, b), time.Now()
	owned := make([]int32, 0, len(b.w.Owned))
	for lane := range b.w.Owned {
		owned = append(owned, lane)
	}
	laneOf := map[int64]int32{}
	ids, more, err := r.marks.LockLanes(ctx, tx, n, held, 0, laneOf, owned)
	if err != nil || len(ids) == 0 {
		return claimed{heldElsewhere: err == nil && more}, err
	}
	lanes := map[int32]bool{}
	for _, lane := range laneOf {
		lanes[lane] = true
	}
	if c, done, err := r.eoTakeOver(ctx, tx, client, b, lanes); done {
		return c, err
	}
	// A new statement: its snapshot is taken after the locks were granted
	// and the lanes' committed events marked.
	c, err := marksClaimed(r.marks.ReadGuarded(ctx, tx, ids, n))
	c.more = c.more || more || len(c.rows) == n
	b.laneOf = make(map[uuid.UUID]int32, len(c.rows))
	for _, x := range c.rows {
		b.laneOf[x.EventID] = laneOf[x.ID]
	}
	return c, err
}

// eoTakeOver readies the batch's worker (eoBegin) and makes it the owner
// of lanes (eoAcquire), which its worker keeps from then on when it keeps
// lanes (see eo.Keeper.Own, in tx). done says the claim ends there, with c and err:
// a step failed, or another worker took one of this worker's lanes
// meanwhile, and then nothing was claimed and the next batch, at once,
// starts over with a new epoch.
func (r *Relay) eoTakeOver(ctx context.Context, tx pgx.Tx, client sarama.Client, b *eoBatch, lanes map[int32]bool) (c claimed, done bool, err error) {
	if err := r.eoBegin(ctx, b.w); err != nil {
		return claimed{}, true, &kafkaStepError{err}
	}
	b.lanes = lanes
	err = r.eoAcquire(ctx, client, b)
	if err == nil {
		err = b.keep.Own(ctx, tx, lanes)
	}
	switch {
	case err == nil:
		return claimed{}, false, nil
	case errors.Is(err, kafkaproducer.ErrFenced) && !b.w.Txn.Ready():
		r.eoFenced(b.w, err)
		return claimed{retry: true}, true, nil
	case dberr.Is(err):
		return claimed{}, true, err
	}
	return claimed{}, true, &kafkaStepError{err}
}

// eoBegin readies the worker's producer: one that needs Init (new, fenced
// since its last transaction because a lane it owned was taken, or with a
// transaction of unknown outcome) is initialised, and the worker owns no
// lane any more. A worker that does not know yet it was fenced finds out
// at its transaction's first request, which fails: none of its records can
// commit, so what it believed it owned sends nothing twice (see eoSettle).
func (r *Relay) eoBegin(ctx context.Context, w *eo.Worker) error {
	if w.Txn.Ready() {
		// Before its lanes are read back: a transaction it aborted may
		// have left records without a marker (kafkaproducer.Settle).
		return w.Txn.Settle(ctx)
	}
	clear(w.Owned)
	return w.Txn.Init(ctx)
}

// eoAcquire makes the batch's worker the owner of the batch's lanes it
// does not own (eo.Pool.Acquire): what their last records say is applied
// to the table first, the lanes' positions under ProgressCursor
// (cursor.Engine.ApplyPositions), their events marked published otherwise
// (markCommitted).
func (r *Relay) eoAcquire(ctx context.Context, client sarama.Client, b *eoBatch) error {
	return r.eo.Acquire(ctx, client, b.w, b.lanes, func(ctx context.Context, ids []uuid.UUID, positions []cursor.Lane) error {
		if r.cur != nil {
			return r.cur.ApplyPositions(ctx, positions, r.q.Durable)
		}
		return r.markCommitted(ctx, ids)
	})
}

// markCommitted marks the events ids (committed to Kafka by a lane's last
// transaction) published, in a transaction of its own committed
// synchronously. A row an operator replayed since (attempts 0 with a last
// error, as Replay leaves it) is left to be sent again.
func (r *Relay) markCommitted(ctx context.Context, ids []uuid.UUID) error {
	if len(ids) == 0 {
		return nil
	}
	tx, err := r.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("relay: exactly-once: mark a lane's committed events: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	b := &pgx.Batch{}
	b.Queue(r.q.Durable)
	b.Queue(r.q.MarkCommitted, ids)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("relay: exactly-once: mark a lane's committed events: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("relay: exactly-once: mark a lane's committed events: %w", err)
	}
	return nil
}

// txnPublisher publishes in the batch's worker's transaction. With each
// call's events it sends, in the same request, a progress record for each
// of their lanes listing them: when every event is acknowledged (the
// common case) that record is the lane's, and the commit needs no other
// request; eoSettle writes a corrected one for a lane where some failed.
type txnPublisher struct {
	r *Relay
	b *eoBatch
}

func (p txnPublisher) Publish(ctx context.Context, msgs []Message) error {
	b, txn := p.b, p.b.w.Txn
	byLane := map[int32][]uuid.UUID{}
	if b.topics == nil {
		b.topics = map[int32][]string{}
	}
	var lanes []int32
	for _, m := range msgs {
		lane := b.laneOf[m.EventID]
		if byLane[lane] == nil {
			lanes = append(lanes, lane)
		}
		byLane[lane] = append(byLane[lane], m.EventID)
		if !slices.Contains(b.topics[lane], m.Topic) {
			b.topics[lane] = append(b.topics[lane], m.Topic)
		}
	}
	slices.Sort(lanes)
	recs := records(msgs)
	positions := make([]string, len(lanes))
	for j, lane := range lanes {
		var pos *cursor.Lane
		if b.cur != nil {
			l := b.predicted[lane]
			pos = &l
		}
		rec, err := p.r.eo.Record(lane, txn.ID(), byLane[lane], pos, b.topics[lane])
		if err != nil {
			return err
		}
		recs = append(recs, rec)
		positions[j] = eo.PositionKey(pos)
	}
	res := txn.Produce(ctx, recs)
	if b.written == nil {
		b.written, b.writtenPos = map[int32][]uuid.UUID{}, map[int32]string{}
	}
	for j, lane := range lanes {
		if res[len(msgs)+j].Err == nil {
			b.written[lane], b.writtenPos[lane] = byLane[lane], positions[j]
		} else {
			b.written[lane], b.writtenPos[lane] = nil, ""
		}
	}
	return results(msgs, res[:len(msgs)])
}

// eoSettle ends the batch's Kafka transaction after its publish: when some
// events were acknowledged it makes each lane's last progress record in the
// transaction list exactly the lane's acknowledged events (writing a
// corrected record where the one sent with the events does not) and
// commits; otherwise it aborts. If the transaction does not commit, the
// acknowledged events fail transiently (errs is updated): none of them is
// visible to read_committed consumers, and they are sent again. Events not
// sent because the worker was fenced are held (ErrHeld): the next batch
// sends them at once, after the worker took its lanes again.
func (r *Relay) eoSettle(ctx context.Context, b *eoBatch, rows []claim.Row, errs []error) {
	txn := b.w.Txn
	// held marks an error of a fenced worker: its events wait for the next
	// batch, which sends them at once (not after a backoff), once the
	// worker took its lanes again. The fence is logged once per batch.
	logged := false
	held := func(err error) error {
		if !logged {
			logged = true
			r.eoFenced(b.w, err)
		}
		return fmt.Errorf("%w: %w", err, ErrHeld)
	}
	for i, err := range errs {
		if err != nil && errors.Is(err, kafkaproducer.ErrFenced) && !errors.Is(err, ErrHeld) {
			errs[i] = held(err)
		}
	}
	acked := map[int32][]uuid.UUID{}
	for i, err := range errs {
		if err == nil {
			lane := b.laneOf[rows[i].EventID]
			acked[lane] = append(acked[lane], rows[i].EventID)
		}
	}
	if len(acked) == 0 {
		if err := txn.Abort(ctx); err != nil {
			txn.Invalidate()
		}
		var first error
		for _, err := range errs {
			if err != nil {
				first = err
				break
			}
		}
		r.metrics.TxnEnded(ctx, eo.TxnAborted, b.started, first)
		return
	}
	fail := func(err error) {
		err = fmt.Errorf("relay: exactly-once: the batch's Kafka transaction did not commit, its events are sent again: %w", err)
		if errors.Is(err, kafkaproducer.ErrFenced) {
			err = held(err) // another worker took one of the lanes
		}
		for i := range errs {
			if errs[i] == nil {
				errs[i] = err
			}
		}
	}
	var fix []kafkaproducer.Record
	lanes := make([]int32, 0, len(b.written))
	for lane := range b.written {
		lanes = append(lanes, lane)
	}
	slices.Sort(lanes)
	// Under ProgressCursor each lane's record holds its position after the
	// acknowledged rows, as the batch's database transaction writes it.
	actual := map[int32]*cursor.Lane{}
	if b.cur != nil {
		ok := map[int64]bool{}
		for i, err := range errs {
			if err == nil {
				ok[rows[i].ID] = true
			}
		}
		for _, l := range b.cur.Advance(func(id int64) bool { return ok[id] }) {
			actual[l.Lane] = &l
		}
	}
	for _, lane := range lanes {
		if w := b.written[lane]; w != nil && slices.Equal(w, acked[lane]) && (b.cur == nil || b.writtenPos[lane] == eo.PositionKey(actual[lane])) {
			continue
		}
		rec, err := r.eo.Record(lane, txn.ID(), acked[lane], actual[lane], b.topics[lane])
		if err != nil {
			_ = txn.Abort(ctx)
			fail(err)
			return
		}
		fix = append(fix, rec)
	}
	if len(fix) > 0 {
		if err := eo.FirstResult(txn.Produce(ctx, fix)); err != nil {
			if aerr := txn.Abort(ctx); aerr != nil {
				txn.Invalidate()
			}
			r.metrics.TxnEnded(ctx, eo.TxnAborted, b.started, err)
			fail(fmt.Errorf("write the lanes' progress records: %w", err))
			return
		}
	}
	if err := txn.Commit(ctx); err != nil {
		// Not committed, or not known: Init decides it, before the
		// worker's next transaction, and its lanes are read back.
		b.committed = !errors.Is(err, kafkaproducer.ErrTxnAborted)
		txn.Invalidate()
		outcome := eo.TxnAborted
		if b.committed {
			outcome = eo.TxnUnknown
		}
		r.metrics.TxnEnded(ctx, outcome, b.started, err)
		fail(err)
		return
	}
	b.committed = true
	r.metrics.TxnEnded(ctx, eo.TxnCommitted, b.started, nil)
}

// eoFenced logs, at Debug, that w's producer lost its transactional id:
// a worker of this or another relay took one of w's lanes over (w was
// slower than its lease, or frozen past it), so w's open transaction is
// aborted and its batch's events are held and sent again at once, once w
// took its lanes again. Lanes move between live relays in normal running,
// so this is never above Debug; the worker that took them logs it too.
func (r *Relay) eoFenced(w *eo.Worker, err error) {
	r.metrics.Fenced(context.Background(), eo.FenceFenced, 1)
	r.cfg.Logger.Debug("outbox relay: exactly-once: this worker was fenced; its transaction is aborted and its batch's events are sent again at once",
		"transactional_id", w.Txn.ID(), "error", err)
}

// eoFinish ends an ExactlyOnce batch that returned err: a transaction it
// left open is aborted; lanes whose Kafka commit the database marks did
// not follow are read back before the worker publishes them again; and the
// worker is free for the next batch.
func (r *Relay) eoFinish(ctx context.Context, b *eoBatch, err error) {
	if b.w == nil {
		if b.keep != nil {
			b.keep.Finished(ctx, b.lanes, err)
		}
		return
	}
	txn := b.w.Txn
	if txn.Open() {
		if aerr := txn.Abort(ctx); aerr != nil {
			txn.Invalidate()
		}
		r.metrics.TxnEnded(ctx, eo.TxnAborted, b.started, err)
	}
	if b.committed && err != nil {
		for lane := range b.lanes {
			delete(b.w.Owned, lane)
		}
	}
	if b.keep.Holds(b.w) {
		b.keep.Finished(ctx, b.lanes, err)
		return
	}
	r.eo.Release(b.w)
}

// eoTake returns the producer of batch b: its worker's, when the worker
// keeps lanes, or a free one.
func (r *Relay) eoTake(client sarama.Client, b *eoBatch) *eo.Worker {
	if b.keep.Usable() {
		return b.keep.Worker(client)
	}
	return r.eo.Take(client)
}
