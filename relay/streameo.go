package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox/internal/backoff"
	"github.com/fxoutbox/outbox/relay/internal/cursor"
	"github.com/fxoutbox/outbox/relay/internal/eo"
	"github.com/fxoutbox/outbox/relay/internal/kafkaproducer"
	"github.com/fxoutbox/outbox/relay/internal/pgoutput"
)

// Exactly once in Stream mode (cursor progress). One relay at a time holds
// the table's slot, so the stream has one transactional producer, whose id
// is fixed per table ("<TransactionalID>.stream"): a relay that takes the
// slot initialises that id, which fences the previous streamer and decides
// its open transaction. Each batch is one Kafka transaction holding its
// events and the stream's record in the progress topic (key "stream"): what
// the stream resolved so far, as
//
//   - lsn: every decoded transaction that ended at or before it is resolved;
//   - done and base: a snapshot whose transactions are all resolved (every
//     transaction it sees ended before a position the stream passed), or,
//     just after a handover from polling, each lane's done snapshot and base;
//   - ids: the rows resolved (published in a committed transaction, or
//     parked) that done (their lane's) does not see, as ranges of ids.
//
// The slot's position is confirmed only after the Kafka commit. A streamer
// that starts on a slot that existed reads the record back (after the
// fence, read_committed) and skips the decoded rows it holds, instead of
// polling the table. Before the relay polls the table for want of a slot
// (created, invalidated, dropped), it turns the record into the lanes'
// positions (done, a window opened now, the record's ids of the lane as
// skip): in one Kafka transaction, a lane record per lane (the position,
// no owner) and a stream record saying the table holds the stream's
// progress; then the same positions in the table. The polling claim
// (exactlyonce.go) reads the lane records back before it publishes a lane.

// The stream record's key and modes.
const (
	streamKey        = "stream"
	streamModeStream = "stream" // resume from the slot, skipping what the record holds
	streamModeTable  = "table"  // the lanes' positions hold the stream's progress: hand over by polling
)

// eoCandEvery is how often the exactly-once stream takes a snapshot that,
// once its transactions are resolved, replaces its record's done (and
// drops the ids it sees): the record's ids hold about that much.
const eoCandEvery = 100 * time.Millisecond

// eoMaxIDs bounds the ids a stream record holds: beyond it (a key that
// fails holds done back while the others flow) only the held keys' retries
// are sent, until done moves on.
const eoMaxIDs = 20000

// streamLane is a lane's done snapshot and base in a stream record.
type streamLane struct {
	Done string `json:"done"`
	Base int64  `json:"base"`
}

// streamProgress is the value of the stream's record.
type streamProgress struct {
	Table string       `json:"table"`
	Mode  string       `json:"mode"`
	LSN   uint64       `json:"lsn,omitempty"`
	Done  string       `json:"done,omitempty"`
	Base  int64        `json:"base,omitempty"`
	Lanes []streamLane `json:"lanes,omitempty"`
	IDs   [][2]int64   `json:"ids,omitempty"`
	// Topics are the topics the stream published to (at most
	// eoMaxTopics): a relay that takes the stream over settles what the
	// previous streamer's last transaction may have left there without a
	// marker (kafkaproducer.Txn.SettleTopics).
	Topics []string `json:"topics,omitempty"`
}

// eoMaxTopics bounds the topics a stream record names.
const eoMaxTopics = 256

// eoStream is a feed's exactly-once state: what its record says.
type eoStream struct {
	txn   *kafkaproducer.Txn
	lsn   pglogrepl.LSN
	done  snapshot
	dtext string
	base  int64
	// lanes, when not nil: each lane's done snapshot and base (after a
	// handover from polling); inter sees what all of them see.
	lanes  []streamLane
	snaps  []snapshot
	inter  snapshot
	laneOf map[string]int32
	// ids: the rows resolved that done does not see, with their txid (0
	// when not known: read from the record at start; a snapshot taken
	// later sees them).
	ids map[int64]uint64
	// cand is the next done, taken at candSeq resolved rows.
	cand      *checkpointCand
	candAt    time.Time
	candSeq   int64
	committed bool // a stream record was committed by this feed
	// topics: what the stream published to, sorted, for its records'
	// Topics (a new slice when one is added: records share it).
	topics []string
}

// streamTxnPublisher publishes in the stream's transaction.
type streamTxnPublisher struct{ txn *kafkaproducer.Txn }

func (p streamTxnPublisher) Publish(ctx context.Context, msgs []Message) error {
	return results(msgs, p.txn.Produce(ctx, records(msgs)))
}

// errStreamRestart says the stream must start over from its record: its
// producer was fenced (another relay took the slot), or a commit's outcome
// is not known.
var errStreamRestart = errors.New("relay: exactly-once stream: start over from the stream's record")

// eoStreamInit initialises the stream's transactional id (fencing the
// previous streamer, deciding its open transaction) and reads the stream's
// last committed record (nil when there is none).
func (r *Relay) eoStreamInit(ctx context.Context) (*kafkaproducer.Txn, *streamProgress, error) {
	client, err := r.eo.Connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	txn := r.eo.StreamProducer()
	if err := txn.Init(ctx); err != nil {
		return nil, nil, fmt.Errorf("relay: exactly-once stream: initialise %q: %w", txn.ID(), err)
	}
	if err := r.eoStreamSettle(ctx, client, txn); err != nil {
		return nil, nil, err
	}
	bo := backoff.Backoff{Initial: time.Millisecond, Max: 100 * time.Millisecond}
	for deadline := time.Now().Add(r.eo.Timeout()); ; {
		vals, err := kafkaproducer.LastCommitted(ctx, client, r.eo.Topic(), 0, []string{streamKey})
		if err != nil {
			return nil, nil, fmt.Errorf("relay: exactly-once stream: read the stream's record: %w", err)
		}
		l := vals[streamKey]
		if len(l.Pending) == 0 {
			if !l.Found {
				return txn, nil, nil
			}
			var p streamProgress
			if err := json.Unmarshal(l.Value, &p); err != nil || (p.Mode != streamModeStream && p.Mode != streamModeTable) {
				return nil, nil, fmt.Errorf("relay: exactly-once stream: the stream's record in %q is not the relay's (%s)", r.eo.Topic(), l.Value)
			}
			return txn, &p, nil
		}
		// The id's last transaction is decided (Init), its marker not
		// written yet.
		if time.Now().After(deadline) {
			return nil, nil, fmt.Errorf("relay: exactly-once stream: the stream's record is still undecided %v after %q was initialised", r.eo.Timeout(), txn.ID())
		}
		if !backoff.Sleep(ctx, bo.Fail(), nil, nil) {
			return nil, nil, ctx.Err()
		}
	}
}

// eoStreamSettle settles what the previous streamer's last transaction may
// have left without a marker (a broker that restarted skipped the markers
// of partitions it found without a leader, and this relay's first commit
// there would decide them): the progress topic and the topics the stream's
// records name, the last committed one's and any still undecided.
func (r *Relay) eoStreamSettle(ctx context.Context, client sarama.Client, txn *kafkaproducer.Txn) error {
	vals, err := kafkaproducer.LastCommitted(ctx, client, r.eo.Topic(), 0, []string{streamKey})
	if err != nil {
		return fmt.Errorf("relay: exactly-once stream: read the stream's record: %w", err)
	}
	l := vals[streamKey]
	topics := map[string]bool{r.eo.Topic(): true}
	for _, v := range append(l.Pending, l.Value) {
		var p streamProgress
		if len(v) > 0 && json.Unmarshal(v, &p) == nil {
			for _, t := range p.Topics {
				topics[t] = true
			}
		}
	}
	if err := txn.SettleTopics(ctx, slices.Sorted(maps.Keys(topics))); err != nil {
		return fmt.Errorf("relay: exactly-once stream: %w", err)
	}
	return nil
}

// newEOStream is the state a record describes (nil: nothing streamed yet).
func newEOStream(txn *kafkaproducer.Txn, p *streamProgress, lanes int) (*eoStream, error) {
	e := &eoStream{txn: txn, ids: map[int64]uint64{}}
	if p == nil {
		return e, nil
	}
	e.keepTopics(p)
	e.lsn = pglogrepl.LSN(p.LSN)
	for _, rg := range p.IDs {
		for id := rg[0]; id <= rg[1]; id++ {
			e.ids[id] = 0
		}
	}
	if len(p.Lanes) > 0 {
		if len(p.Lanes) != lanes {
			return nil, fmt.Errorf("relay: exactly-once stream: the stream's record has %d lanes, the relay %d: every relay of a table must use the same Lanes", len(p.Lanes), lanes)
		}
		return e, e.setLanes(p.Lanes)
	}
	s, err := parseSnapshot(p.Done)
	e.done, e.dtext, e.base = s, p.Done, p.Base
	return e, err
}

// setDone makes a snapshot taken after the stream's start, whose
// transactions are all resolved, its done: it drops the ids it sees, and
// those read from the record at start (it sees them all).
func (e *eoStream) setDone(text string, base int64) error {
	s, err := parseSnapshot(text)
	if err != nil {
		return err
	}
	e.done, e.dtext, e.base, e.lanes, e.snaps, e.laneOf = s, text, base, nil, nil, nil
	for id, x := range e.ids {
		if x == 0 || s.visible(x) {
			delete(e.ids, id)
		}
	}
	return nil
}

func (e *eoStream) setLanes(lanes []streamLane) error {
	e.lanes, e.snaps, e.laneOf = lanes, make([]snapshot, len(lanes)), map[string]int32{}
	for i, l := range lanes {
		s, err := parseSnapshot(l.Done)
		if err != nil {
			return err
		}
		e.snaps[i] = s
	}
	e.inter = intersect(e.snaps)
	return nil
}

// skip returns which rows of a decoded transaction the record holds
// resolved. Rows that only some lanes' done snapshots see have their lane
// read from the server.
func (e *eoStream) skip(ctx context.Context, r *Relay, x pgoutput.Tx) ([]bool, error) {
	out := make([]bool, len(x.Rows))
	var ask []string
	for i, d := range x.Rows {
		if _, ok := e.ids[d.ID]; ok {
			e.ids[d.ID] = d.Txid
			out[i] = true
			continue
		}
		switch {
		case x.End <= e.lsn:
			out[i] = true
		case d.Txid == 0:
		case e.lanes == nil:
			out[i] = e.done.visible(d.Txid)
		case e.inter.visible(d.Txid):
			out[i] = true
		default:
			if _, ok := e.laneOf[d.Key]; !ok && slices.ContainsFunc(e.snaps, func(s snapshot) bool { return s.visible(d.Txid) }) {
				ask = append(ask, d.Key)
			}
		}
	}
	if len(ask) > 0 {
		rows, err := r.db.Begin(ctx)
		if err != nil {
			return nil, fmt.Errorf("relay: exactly-once stream: read the lanes of keys: %w", err)
		}
		defer func() { _ = rows.Rollback(context.WithoutCancel(ctx)) }()
		rs, err := rows.Query(ctx, r.cur.q.KeyLanes, ask, r.cfg.Lanes)
		if err == nil {
			var k string
			var lane int32
			_, err = pgx.ForEachRow(rs, []any{&k, &lane}, func() error { e.laneOf[k] = lane; return nil })
		}
		if err != nil {
			return nil, fmt.Errorf("relay: exactly-once stream: read the lanes of keys: %w", err)
		}
	}
	if e.lanes != nil {
		for i, d := range x.Rows {
			if lane, ok := e.laneOf[d.Key]; ok && !out[i] && d.Txid != 0 && int(lane) < len(e.snaps) {
				out[i] = e.snaps[lane].visible(d.Txid)
			}
		}
	}
	return out, nil
}

// keepTopics adds the topics p names to the stream's.
func (e *eoStream) keepTopics(p *streamProgress) {
	if p == nil {
		return
	}
	for _, t := range p.Topics {
		e.addTopic(t)
	}
}

// addTopic adds a topic the stream publishes to, up to eoMaxTopics.
func (e *eoStream) addTopic(t string) {
	i, found := slices.BinarySearch(e.topics, t)
	if !found && len(e.topics) < eoMaxTopics {
		e.topics = slices.Insert(slices.Clone(e.topics), i, t)
	}
}

// record is the stream's record before a batch, its ids sorted.
func (e *eoStream) record(table string) (streamProgress, []int64) {
	p := streamProgress{Table: table, Mode: streamModeStream, LSN: uint64(e.lsn), Done: e.dtext, Base: e.base, Lanes: e.lanes,
		Topics: e.topics}
	ids := make([]int64, 0, len(e.ids))
	for id := range e.ids {
		ids = append(ids, id)
	}
	return p, ids
}

// idRanges merges ids into sorted ranges of consecutive ids.
func idRanges(ids []int64) [][2]int64 {
	slices.Sort(ids)
	ids = slices.Compact(ids)
	var out [][2]int64
	for _, id := range ids {
		if n := len(out); n > 0 && out[n-1][1]+1 == id {
			out[n-1][1] = id
			continue
		}
		out = append(out, [2]int64{id, id})
	}
	return out
}

// dispatch sends a batch, as the feed's batch in flight.
func (f *feed) dispatch(ctx context.Context, batch []*feedRow) {
	f.busy = true
	if f.eo == nil {
		go f.publish(ctx, batch)
		return
	}
	for _, x := range batch {
		if x.bad == nil {
			f.eo.addTopic(x.topic)
		}
	}
	rec, ids := f.eo.record(f.r.cfg.Table.String())
	go f.eoPublish(ctx, batch, rec, ids)
}

// eoPublish sends a batch in one Kafka transaction with the stream's
// record (the feed's goroutine of the batch in flight).
func (f *feed) eoPublish(ctx context.Context, batch []*feedRow, rec streamProgress, ids []int64) {
	r := f.r
	ctx, cancel := context.WithTimeout(ctx, r.cfg.BatchTimeout)
	defer cancel()
	res, rows, at := splitBatch(batch)
	if len(rows) > 0 && !f.eo.txn.Ready() {
		// Fenced or unsure of a transaction: only a new start (with
		// the slot held) may initialise the id again.
		res.restart = fmt.Errorf("%w: the producer needs initialising", errStreamRestart)
	} else if len(rows) > 0 {
		t := time.Now()
		msgs, spans, encErrs := r.messages(ctx, rows)
		errs, alone := r.publish(ctx, streamTxnPublisher{f.eo.txn}, rows, msgs, encErrs)
		res.restart = f.eoCommit(ctx, rows, errs, rec, ids, t)
		acked := r.metrics.publishLap(ctx, t, rows, errs)
		r.endSpans(spans, msgs, errs)
		r.metrics.record(ctx, rows, errs, acked)
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
// acknowledged rows fail (errs). It returns errStreamRestart when the
// producer was fenced or the commit's outcome is unknown.
func (f *feed) eoCommit(ctx context.Context, rows []row, errs []error, rec streamProgress, ids []int64, started time.Time) error {
	r, txn := f.r, f.eo.txn
	var acked []int64
	var first error
	for i, err := range errs {
		if err == nil {
			acked = append(acked, rows[i].id)
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
		r.metrics.TxnEnded(ctx, eo.TxnAborted, started, err)
		if errors.Is(err, kafkaproducer.ErrFenced) {
			r.metrics.Fenced(ctx, eo.FenceFenced, 1)
			r.cfg.Logger.Info("outbox relay: exactly-once stream: this relay was fenced (another relay took the slot over); its transaction is aborted",
				"table", r.cfg.Table.String(), "transactional_id", txn.ID(), "error", err)
			return fmt.Errorf("%w: %w", errStreamRestart, err)
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
	rec.IDs = idRanges(append(ids, acked...))
	val, err := json.Marshal(rec)
	if err == nil {
		err = eo.FirstResult(txn.Produce(ctx, []kafkaproducer.Record{{Topic: r.eo.Topic(), Key: []byte(streamKey), Value: val}}))
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
		r.metrics.TxnEnded(ctx, outcome, started, err)
		if errors.Is(err, kafkaproducer.ErrFenced) {
			r.metrics.Fenced(ctx, eo.FenceFenced, 1)
		}
		return fmt.Errorf("%w: commit: %w", errStreamRestart, err)
	}
	r.metrics.TxnEnded(ctx, eo.TxnCommitted, started, nil)
	return nil
}

// eoResolved adds a resolved row to the stream's ids.
func (f *feed) eoResolved(x *feedRow) {
	if f.eo != nil {
		f.eo.ids[x.id] = x.txid
	}
}

// eoSettled notes a batch committed and the position confirmed.
func (f *feed) eoSettled(res feedResult) {
	if f.eo == nil {
		return
	}
	for _, err := range res.errs {
		if err == nil {
			f.eo.committed = true
			break
		}
	}
	f.eo.lsn = max(f.eo.lsn, f.r.stream.progress.Confirmed())
}

// eoFull says the record holds as many ids as it may: only held keys go.
func (f *feed) eoFull() bool { return f.eo != nil && len(f.eo.ids) >= eoMaxIDs }

// eoAdvance moves the record's done on, every eoCandEvery: to the snapshot
// taken last time once every transaction it sees is resolved; then it takes
// the next one (when rows were resolved since).
func (f *feed) eoAdvance(ctx context.Context) {
	e := f.eo
	if e == nil || time.Since(e.candAt) < eoCandEvery {
		return
	}
	e.candAt = time.Now()
	if e.cand != nil && f.passed(e.cand) {
		if err := e.setDone(e.cand.snap, e.cand.base); err != nil {
			f.r.cfg.Logger.Warn("outbox relay: exactly-once stream: a snapshot could not be read", "table", f.r.cfg.Table.String(), "error", err)
		}
		e.cand = nil
	}
	if e.cand != nil || (e.candSeq == f.resolved && e.lanes == nil) {
		return
	}
	var c checkpointCand
	var lsn string
	err := f.query(ctx, f.r.q.stream.Candidate, nil, func(rows pgx.Rows) error {
		_, err := pgx.ForEachRow(rows, []any{&c.snap, &c.base, &lsn}, func() error { return nil })
		return err
	})
	if err == nil {
		c.lsn, err = pglogrepl.ParseLSN(lsn)
	}
	if err != nil {
		return // taken again at the next period
	}
	e.cand, e.candSeq = &c, f.resolved
}

// eoStart readies the exactly-once stream on a slot this relay holds: it
// fences the previous streamer and reads the record. resume says the slot
// existed and the record holds the stream's progress: the feed skips what
// it holds instead of handing over from polling.
func (f *feed) eoStart(ctx context.Context, created bool) (resume bool, err error) {
	r := f.r
	// Bounded as a batch is (and as eoStreamFallback's): with the broker
	// unreachable, Init's retries would otherwise last until the broker
	// came back, the relay neither failing (health, backoff, reconnect)
	// nor stopping until Stop's deadline.
	ictx, cancel := context.WithTimeout(ctx, r.cfg.BatchTimeout)
	txn, p, err := r.eoStreamInit(ictx)
	cancel()
	if err != nil {
		return false, err
	}
	if p != nil {
		// The previous streamer's id is this one's: fenced by the Init.
		r.metrics.Fenced(ctx, eo.FenceFencing, 1)
	}
	if created || p == nil || p.Mode != streamModeStream {
		f.eo = &eoStream{txn: txn, ids: map[int64]uint64{}}
		f.eo.keepTopics(p)
		return false, nil
	}
	if f.eo, err = newEOStream(txn, p, r.cfg.Lanes); err != nil {
		return false, err
	}
	if err := r.cursorReady(ctx); err != nil {
		return false, err
	}
	r.stream.state.Store(int32(Streaming))
	r.health.set(0, nil)
	r.cfg.Logger.Info("outbox relay: exactly-once stream: resuming from the stream's record in the progress topic",
		"table", r.cfg.Table.String(), "slot", f.conn.Slot(), "lsn", f.eo.lsn, "transactional_id", txn.ID())
	return true, nil
}

// eoHandedOver sets the stream's state after a handover from polling:
// each lane's done snapshot and base hold what polling delivered.
func (f *feed) eoHandedOver(ctx context.Context) error {
	var lanes []streamLane
	err := f.query(ctx, f.r.cur.q.Dones, nil, func(rows pgx.Rows) error {
		var l streamLane
		_, err := pgx.ForEachRow(rows, []any{&l.Done, &l.Base}, func() error { lanes = append(lanes, l); return nil })
		return err
	})
	if err == nil && len(lanes) != f.r.cfg.Lanes {
		err = fmt.Errorf("%d lanes' positions, want %d", len(lanes), f.r.cfg.Lanes)
	}
	if err == nil {
		err = f.eo.setLanes(lanes)
	}
	if err != nil {
		return fmt.Errorf("relay: exactly-once stream handover of %s: %w", f.r.cfg.Table, err)
	}
	f.eo.lsn = 0
	return nil
}

// eoStreamFallback hands the stream's progress to the table before the
// relay polls it for want of a slot: the record's resolved rows become the
// lanes' positions, in a Kafka transaction (the lane records, and a stream
// record that says the table holds the progress) and then in the table.
// Nothing to do when the record says so already, or there is none.
func (r *Relay) eoStreamFallback(ctx context.Context) error {
	if r.eo == nil || r.cur == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.BatchTimeout)
	defer cancel()
	txn, p, err := r.eoStreamInit(ctx)
	if err != nil || p == nil || p.Mode != streamModeStream {
		return err
	}
	e, err := newEOStream(txn, p, r.cfg.Lanes)
	if err != nil {
		return err
	}
	if err := r.cursorReady(ctx); err != nil {
		return err
	}
	kept := make([]cursor.Lane, r.cfg.Lanes)
	all := make([]int32, r.cfg.Lanes)
	for i := range kept {
		all[i] = int32(i)
		kept[i] = cursor.Lane{Lane: int32(i), Done: p.Done, Base: p.Base}
		if len(p.Lanes) > 0 {
			kept[i].Done, kept[i].Base = p.Lanes[i].Done, p.Lanes[i].Base
		}
	}
	ids := make([]int64, 0, len(e.ids))
	for id := range e.ids {
		ids = append(ids, id)
	}
	tx, err := r.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("relay: exactly-once stream: hand the stream's progress to the table: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	pos, err := r.eoOpenPositions(ctx, tx, kept, all, ids)
	if err != nil {
		return fmt.Errorf("relay: exactly-once stream: hand the stream's progress to the table: %w", err)
	}
	recs := make([]kafkaproducer.Record, 0, len(pos)+1)
	for i := range pos {
		rec, err := r.eo.Record(pos[i].Lane, "", nil, &pos[i], nil)
		if err != nil {
			return err
		}
		recs = append(recs, rec)
	}
	val, err := json.Marshal(streamProgress{Table: r.cfg.Table.String(), Mode: streamModeTable, Topics: p.Topics})
	if err != nil {
		return err
	}
	recs = append(recs, kafkaproducer.Record{Topic: r.eo.Topic(), Key: []byte(streamKey), Value: val})
	started := time.Now()
	if err := eo.FirstResult(txn.Produce(ctx, recs)); err != nil {
		_ = txn.Abort(ctx)
		r.metrics.TxnEnded(ctx, eo.TxnAborted, started, err)
		return fmt.Errorf("relay: exactly-once stream: write the lanes' positions to the progress topic: %w", err)
	}
	if err := txn.Commit(ctx); err != nil {
		txn.Invalidate()
		r.metrics.TxnEnded(ctx, eo.TxnUnknown, started, err)
		return fmt.Errorf("relay: exactly-once stream: write the lanes' positions to the progress topic: %w", err)
	}
	r.metrics.TxnEnded(ctx, eo.TxnCommitted, started, nil)
	// The workers read every lane back before they publish it again.
	r.eo.Disown()
	r.cur.forget()
	b := &pgx.Batch{}
	b.Queue(r.q.Durable)
	r.cursorSaveLanes(b, pos)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("relay: exactly-once stream: write the lanes' positions: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("relay: exactly-once stream: write the lanes' positions: %w", err)
	}
	r.cfg.Logger.Info("outbox relay: exactly-once stream: the stream's progress is in the lanes' positions; polling resumes from there",
		"table", r.cfg.Table.String(), "events_past_done", len(ids))
	return nil
}

// eoOpenPositions locks every lane in tx and returns their positions from
// kept (closed at the stream's done snapshots), each window opened now with
// the lane's rows among ids as its skip list.
func (r *Relay) eoOpenPositions(ctx context.Context, tx pgx.Tx, kept []cursor.Lane, all []int32, ids []int64) ([]cursor.Lane, error) {
	var busy int
	if err := tx.QueryRow(ctx, r.cur.q.TryLockLanes, r.q.ns, all).Scan(&busy); err != nil {
		return nil, err
	}
	if busy > 0 {
		return nil, fmt.Errorf("another relay holds %d lanes of %s (a relay polling it?); run every relay of a table in the same mode", busy, r.cfg.Table)
	}
	skip := map[int32][]int64{}
	if len(ids) > 0 {
		rows, err := tx.Query(ctx, r.cur.q.RowLanes, ids, r.cfg.Lanes)
		if err != nil {
			return nil, err
		}
		var id int64
		var lane int32
		if _, err := pgx.ForEachRow(rows, []any{&id, &lane}, func() error { skip[lane] = append(skip[lane], id); return nil }); err != nil {
			return nil, err
		}
	}
	args := cursor.KeptArgs(kept)
	args["locked"], args["lanes"] = all, r.cfg.Lanes
	rows, err := tx.Query(ctx, r.cur.q.Load, pgx.NamedArgs(args))
	if err != nil {
		return nil, err
	}
	var out []cursor.Lane
	var l cursor.Lane
	var floor *int64
	if _, err := pgx.ForEachRow(rows, []any{&l.Lane, &l.Done, &l.Upto, &l.Base, &l.Pos, &floor, &l.Skip, &l.Top}, func() error {
		l.Floor = l.Base + 1
		if floor != nil {
			l.Floor = *floor
		}
		l.Skip = skip[l.Lane]
		slices.Sort(l.Skip)
		out = append(out, l)
		l = cursor.Lane{}
		return nil
	}); err != nil {
		return nil, err
	}
	if len(out) != len(kept) {
		return nil, fmt.Errorf("%d lanes' positions opened, want %d", len(out), len(kept))
	}
	return out, nil
}
