package feed

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox/relay/internal/claim"
	"github.com/fxoutbox/outbox/relay/internal/eo"
	"github.com/fxoutbox/outbox/relay/internal/kafkaproducer"
	"github.com/fxoutbox/outbox/relay/internal/snapshot"
)

// Exactly once in Stream mode (cursor progress): the feed's side of the
// stream's record (relay/internal/eo: eo.Stream) and its batches' Kafka
// transactions.

// eoCandEvery is how often the exactly-once stream takes a snapshot that,
// once its transactions are resolved, replaces its record's done (and
// drops the ids it sees): the record's ids hold about that much.
const eoCandEvery = 100 * time.Millisecond

// errRestart says the stream must start over from its record: its
// producer was fenced (another relay took the slot), or a commit's outcome
// is not known.
var errRestart = errors.New("relay: exactly-once stream: start over from the stream's record")

// dispatch sends a batch, as the feed's batch in flight.
func (f *feed) dispatch(ctx context.Context, batch []*feedRow) {
	f.busy = true
	if f.eo == nil {
		go f.publish(ctx, batch)
		return
	}
	for _, x := range batch {
		if x.bad == nil {
			f.eo.AddTopic(x.Topic)
		}
	}
	rec, ids := f.eo.Record(f.cfg.Table.String())
	go f.eoPublish(ctx, batch, rec, ids)
}

// eoPublish sends a batch in one Kafka transaction with the stream's
// record (the feed's goroutine of the batch in flight).
func (f *feed) eoPublish(ctx context.Context, batch []*feedRow, rec eo.StreamRecord, ids []int64) {
	ctx, cancel := context.WithTimeout(ctx, f.cfg.BatchTimeout)
	defer cancel()
	res, rows, at := splitBatch(batch)
	if len(rows) > 0 && !f.eo.Txn.Ready() {
		// Fenced or unsure of a transaction: only a new start (with
		// the slot held) may initialise the id again.
		res.restart = fmt.Errorf("%w: the producer needs initialising", errRestart)
	} else if len(rows) > 0 {
		t := time.Now()
		errs, alone := f.host.Publish(ctx, rows, f.eo.Txn, func(errs []error) {
			res.restart = f.eoCommit(ctx, rows, errs, rec, ids, t)
		})
		for j, i := range at {
			res.errs[i] = errs[j]
		}
		for _, j := range alone {
			res.alone = append(res.alone, at[j])
		}
	}
	f.results <- res
}

// eoCommit ends a batch's transaction: with the stream's record (rec,
// with ids and the batch's acknowledged rows) when some rows were
// acknowledged, aborted otherwise. When it does not commit, the
// acknowledged rows fail (errs). It returns errRestart when the
// producer was fenced or the commit's outcome is unknown.
func (f *feed) eoCommit(ctx context.Context, rows []claim.Row, errs []error, rec eo.StreamRecord, ids []int64, started time.Time) error {
	txn := f.eo.Txn
	var acked []int64
	var first error
	for i, err := range errs {
		if err == nil {
			acked = append(acked, rows[i].ID)
		} else if first == nil || errors.Is(err, kafkaproducer.ErrFenced) {
			first = err
		}
	}
	fail := func(err error) {
		for i := range errs {
			if errs[i] == nil {
				errs[i] = fmt.Errorf("relay: exactly-once: the stream's Kafka transaction did not commit, its events are sent again: %w", err)
			}
		}
	}
	abort := func(err error) error {
		if aerr := txn.Abort(ctx); aerr != nil {
			txn.Invalidate()
			// An abort that finds the producer fenced restarts the
			// stream as a fenced batch does, even when the batch failed
			// for another reason first (its time ran out).
			if errors.Is(aerr, kafkaproducer.ErrFenced) && !errors.Is(err, kafkaproducer.ErrFenced) {
				err = errors.Join(aerr, err)
			}
		}
		f.cfg.Observer.TxnEnded(ctx, eo.TxnAborted, started, err)
		if errors.Is(err, kafkaproducer.ErrFenced) {
			f.cfg.Observer.Fenced(ctx, eo.FenceFenced, 1)
			f.cfg.Logger.Info("outbox relay: exactly-once stream: this relay was fenced (another relay took the slot over); its transaction is aborted",
				"table", f.cfg.Table.String(), "transactional_id", txn.ID(), "error", err)
			return fmt.Errorf("%w: %w", errRestart, err)
		}
		return nil
	}
	if first != nil && errors.Is(first, kafkaproducer.ErrFenced) {
		fail(first)
		return abort(first)
	}
	if len(acked) == 0 {
		return abort(first)
	}
	rec.IDs = eo.IDRanges(append(ids, acked...))
	out, err := f.cfg.EO.StreamRecord(rec)
	if err == nil {
		err = eo.FirstResult(txn.Produce(ctx, []kafkaproducer.Record{out}))
	}
	if err != nil {
		fail(err)
		return abort(fmt.Errorf("write the stream's record: %w", err))
	}
	if err := txn.Commit(ctx); err != nil {
		fail(err)
		outcome := eo.TxnUnknown
		if errors.Is(err, kafkaproducer.ErrTxnAborted) {
			outcome = eo.TxnAborted
		}
		txn.Invalidate()
		f.cfg.Observer.TxnEnded(ctx, outcome, started, err)
		if errors.Is(err, kafkaproducer.ErrFenced) {
			f.cfg.Observer.Fenced(ctx, eo.FenceFenced, 1)
		}
		return fmt.Errorf("%w: commit: %w", errRestart, err)
	}
	f.cfg.Observer.TxnEnded(ctx, eo.TxnCommitted, started, nil)
	return nil
}

// eoResolved adds a resolved row to the stream's ids.
func (f *feed) eoResolved(x *feedRow) {
	if f.eo != nil {
		f.eo.IDs[x.ID] = x.txid
	}
}

// eoSettled notes a batch committed and the position confirmed.
func (f *feed) eoSettled(res feedResult) {
	if f.eo == nil {
		return
	}
	for _, err := range res.errs {
		if err == nil {
			f.eo.Committed = true
			break
		}
	}
	f.eo.LSN = max(f.eo.LSN, f.cfg.Progress.Confirmed())
}

// eoFull says the record holds as many ids as it may: only held keys go.
func (f *feed) eoFull() bool { return f.eo != nil && len(f.eo.IDs) >= eo.MaxIDs }

// eoAdvance moves the record's done on, every eoCandEvery: to the snapshot
// taken last time once every transaction it sees is resolved; then it takes
// the next one (when rows were resolved since).
func (f *feed) eoAdvance(ctx context.Context) {
	e := f.eo
	if e == nil || time.Since(e.CandAt) < eoCandEvery {
		return
	}
	e.CandAt = time.Now()
	if e.Cand != nil && f.passed(e.Cand) {
		if err := e.SetDone(e.Cand.Snap, e.Cand.Base); err != nil {
			f.cfg.Logger.Warn("outbox relay: exactly-once stream: a snapshot could not be read", "table", f.cfg.Table.String(), "error", err)
		}
		e.Cand = nil
	}
	if e.Cand != nil || (e.CandSeq == f.resolved && !e.ByLanes()) {
		return
	}
	var c snapshot.Candidate
	var lsn string
	err := f.query(ctx, f.cfg.Stream.Candidate, nil, func(rows pgx.Rows) error {
		_, err := pgx.ForEachRow(rows, []any{&c.Snap, &c.Base, &lsn}, func() error { return nil })
		return err
	})
	if err == nil {
		c.LSN, err = pglogrepl.ParseLSN(lsn)
	}
	if err != nil {
		return // taken again at the next period
	}
	e.Cand, e.CandSeq = &c, f.resolved
}

// eoStart readies the exactly-once stream on a slot this relay holds: it
// fences the previous streamer and reads the record. resume says the slot
// existed and the record holds the stream's progress: the feed skips what
// it holds instead of handing over from polling.
func (f *feed) eoStart(ctx context.Context, created bool) (resume bool, err error) {
	// Bounded as a batch is (and as Fallback's): with the broker
	// unreachable, Init's retries would otherwise last until the broker
	// came back, the relay neither failing (health, backoff, reconnect)
	// nor stopping until Stop's deadline.
	ictx, cancel := context.WithTimeout(ctx, f.cfg.BatchTimeout)
	txn, p, err := f.cfg.EO.StreamInit(ictx)
	cancel()
	if err != nil {
		return false, err
	}
	if p != nil {
		// The previous streamer's id is this one's: fenced by the Init.
		f.cfg.Observer.Fenced(ctx, eo.FenceFencing, 1)
	}
	if created || p == nil || p.Mode != eo.StreamModeStream {
		f.eo = eo.NewStream(txn, p)
		return false, nil
	}
	if f.eo, err = eo.ResumeStream(txn, p, f.cfg.Lanes); err != nil {
		return false, err
	}
	if err := f.cfg.Cur.Ready(ctx); err != nil {
		return false, err
	}
	f.host.Streaming()
	f.cfg.Logger.Info("outbox relay: exactly-once stream: resuming from the stream's record in the progress topic",
		"table", f.cfg.Table.String(), "slot", f.conn.Slot(), "lsn", f.eo.LSN, "transactional_id", txn.ID())
	return true, nil
}

// eoHandedOver sets the stream's state after a handover from polling:
// each lane's done snapshot and base hold what polling delivered.
func (f *feed) eoHandedOver(ctx context.Context) error {
	var lanes []eo.StreamLane
	err := f.query(ctx, f.cfg.Cur.Q.Dones, nil, func(rows pgx.Rows) error {
		var l eo.StreamLane
		_, err := pgx.ForEachRow(rows, []any{&l.Done, &l.Base}, func() error { lanes = append(lanes, l); return nil })
		return err
	})
	if err == nil && len(lanes) != f.cfg.Lanes {
		err = fmt.Errorf("%d lanes' positions, want %d", len(lanes), f.cfg.Lanes)
	}
	if err == nil {
		err = f.eo.SetLanes(lanes)
	}
	if err != nil {
		return fmt.Errorf("relay: exactly-once stream handover of %s: %w", f.cfg.Table, err)
	}
	f.eo.LSN = 0
	return nil
}
