package eo

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pglogrepl"

	"github.com/fxoutbox/outbox/internal/backoff"
	"github.com/fxoutbox/outbox/relay/internal/kafkaproducer"
	"github.com/fxoutbox/outbox/relay/internal/pgoutput"
	"github.com/fxoutbox/outbox/relay/internal/snapshot"
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
// progress; then the same positions in the table. The polling claim reads
// the lane records back before it publishes a lane (Pool.Acquire).

// The stream record's key and modes.
const (
	StreamKey        = "stream"
	StreamModeStream = "stream" // resume from the slot, skipping what the record holds
	StreamModeTable  = "table"  // the lanes' positions hold the stream's progress: hand over by polling
)

// MaxIDs bounds the ids a stream record holds: beyond it (a key that fails
// holds done back while the others flow) only the held keys' retries are
// sent, until done moves on.
const MaxIDs = 20000

// maxTopics bounds the topics a stream record names.
const maxTopics = 256

// StreamLane is a lane's done snapshot and base in a stream record.
type StreamLane struct {
	Done string `json:"done"`
	Base int64  `json:"base"`
}

// StreamRecord is the value of the stream's record.
type StreamRecord struct {
	Table string       `json:"table"`
	Mode  string       `json:"mode"`
	LSN   uint64       `json:"lsn,omitempty"`
	Done  string       `json:"done,omitempty"`
	Base  int64        `json:"base,omitempty"`
	Lanes []StreamLane `json:"lanes,omitempty"`
	IDs   [][2]int64   `json:"ids,omitempty"`
	// Topics are the topics the stream published to (at most maxTopics):
	// a relay that takes the stream over settles what the previous
	// streamer's last transaction may have left there without a marker
	// (kafkaproducer.Txn.SettleTopics).
	Topics []string `json:"topics,omitempty"`
}

// StreamRecord is rec as the record to write to the progress topic.
func (p *Pool) StreamRecord(rec StreamRecord) (kafkaproducer.Record, error) {
	val, err := json.Marshal(rec)
	if err != nil {
		return kafkaproducer.Record{}, err
	}
	return kafkaproducer.Record{Topic: p.cfg.Topic, Key: []byte(StreamKey), Value: val}, nil
}

// StreamInit initialises the stream's transactional id (fencing the
// previous streamer, deciding its open transaction) and reads the stream's
// last committed record (nil when there is none).
func (p *Pool) StreamInit(ctx context.Context) (*kafkaproducer.Txn, *StreamRecord, error) {
	client, err := p.Connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	txn := p.StreamProducer()
	if err := txn.Init(ctx); err != nil {
		return nil, nil, fmt.Errorf("relay: exactly-once stream: initialise %q: %w", txn.ID(), err)
	}
	if err := p.streamSettle(ctx, client, txn); err != nil {
		return nil, nil, err
	}
	bo := backoff.Backoff{Initial: time.Millisecond, Max: 100 * time.Millisecond}
	for deadline := time.Now().Add(p.cfg.Timeout); ; {
		vals, err := kafkaproducer.LastCommitted(ctx, client, p.cfg.Topic, 0, []string{StreamKey})
		if err != nil {
			return nil, nil, fmt.Errorf("relay: exactly-once stream: read the stream's record: %w", err)
		}
		l := vals[StreamKey]
		if len(l.Pending) == 0 {
			if !l.Found {
				return txn, nil, nil
			}
			var r StreamRecord
			if err := json.Unmarshal(l.Value, &r); err != nil || (r.Mode != StreamModeStream && r.Mode != StreamModeTable) {
				return nil, nil, fmt.Errorf("relay: exactly-once stream: the stream's record in %q is not the relay's (%s)", p.cfg.Topic, l.Value)
			}
			return txn, &r, nil
		}
		// The id's last transaction is decided (Init), its marker not
		// written yet.
		if time.Now().After(deadline) {
			return nil, nil, fmt.Errorf("relay: exactly-once stream: the stream's record is still undecided %v after %q was initialised", p.cfg.Timeout, txn.ID())
		}
		if !backoff.Sleep(ctx, bo.Fail(), nil, nil) {
			return nil, nil, ctx.Err()
		}
	}
}

// streamSettle settles what the previous streamer's last transaction may
// have left without a marker (a broker that restarted skipped the markers
// of partitions it found without a leader, and this relay's first commit
// there would decide them): the progress topic and the topics the stream's
// records name, the last committed one's and any still undecided.
func (p *Pool) streamSettle(ctx context.Context, client sarama.Client, txn *kafkaproducer.Txn) error {
	vals, err := kafkaproducer.LastCommitted(ctx, client, p.cfg.Topic, 0, []string{StreamKey})
	if err != nil {
		return fmt.Errorf("relay: exactly-once stream: read the stream's record: %w", err)
	}
	l := vals[StreamKey]
	topics := map[string]bool{p.cfg.Topic: true}
	for _, v := range append(l.Pending, l.Value) {
		var r StreamRecord
		if len(v) > 0 && json.Unmarshal(v, &r) == nil {
			for _, t := range r.Topics {
				topics[t] = true
			}
		}
	}
	if err := txn.SettleTopics(ctx, slices.Sorted(maps.Keys(topics))); err != nil {
		return fmt.Errorf("relay: exactly-once stream: %w", err)
	}
	return nil
}

// Stream is a stream's exactly-once state: what its record says.
type Stream struct {
	Txn   *kafkaproducer.Txn
	LSN   pglogrepl.LSN
	done  snapshot.Snapshot
	dtext string
	base  int64
	// lanes, when not nil: each lane's done snapshot and base (after a
	// handover from polling); inter sees what all of them see.
	lanes  []StreamLane
	snaps  []snapshot.Snapshot
	inter  snapshot.Snapshot
	laneOf map[string]int32
	// IDs: the rows resolved that done does not see, with their txid (0
	// when not known: read from the record at start; a snapshot taken
	// later sees them).
	IDs map[int64]uint64
	// Cand is the next done, taken at CandSeq resolved rows, at CandAt.
	Cand      *snapshot.Candidate
	CandAt    time.Time
	CandSeq   int64
	Committed bool // a stream record was committed by this stream
	// topics: what the stream published to, sorted, for its records'
	// Topics (a new slice when one is added: records share it).
	topics []string
}

// NewStream is a stream that resumes nothing: it keeps only the topics rec
// names (rec may be nil).
func NewStream(txn *kafkaproducer.Txn, rec *StreamRecord) *Stream {
	e := &Stream{Txn: txn, IDs: map[int64]uint64{}}
	if rec != nil {
		for _, t := range rec.Topics {
			e.AddTopic(t)
		}
	}
	return e
}

// ResumeStream is the state rec describes (nil: nothing streamed yet), for
// a relay of lanes lanes.
func ResumeStream(txn *kafkaproducer.Txn, rec *StreamRecord, lanes int) (*Stream, error) {
	e := NewStream(txn, rec)
	if rec == nil {
		return e, nil
	}
	e.LSN = pglogrepl.LSN(rec.LSN)
	for _, rg := range rec.IDs {
		for id := rg[0]; id <= rg[1]; id++ {
			e.IDs[id] = 0
		}
	}
	if len(rec.Lanes) > 0 {
		if len(rec.Lanes) != lanes {
			return nil, fmt.Errorf("relay: exactly-once stream: the stream's record has %d lanes, the relay %d: every relay of a table must use the same Lanes", len(rec.Lanes), lanes)
		}
		return e, e.SetLanes(rec.Lanes)
	}
	s, err := snapshot.Parse(rec.Done)
	e.done, e.dtext, e.base = s, rec.Done, rec.Base
	return e, err
}

// SetDone makes a snapshot taken after the stream's start, whose
// transactions are all resolved, its done: it drops the ids it sees, and
// those read from the record at start (it sees them all).
func (e *Stream) SetDone(text string, base int64) error {
	s, err := snapshot.Parse(text)
	if err != nil {
		return err
	}
	e.done, e.dtext, e.base, e.lanes, e.snaps, e.laneOf = s, text, base, nil, nil, nil
	for id, x := range e.IDs {
		if x == 0 || s.Visible(x) {
			delete(e.IDs, id)
		}
	}
	return nil
}

// SetLanes makes each lane's done snapshot and base (after a handover from
// polling) the stream's done.
func (e *Stream) SetLanes(lanes []StreamLane) error {
	e.lanes, e.snaps, e.laneOf = lanes, make([]snapshot.Snapshot, len(lanes)), map[string]int32{}
	for i, l := range lanes {
		s, err := snapshot.Parse(l.Done)
		if err != nil {
			return err
		}
		e.snaps[i] = s
	}
	e.inter = snapshot.Intersect(e.snaps)
	return nil
}

// ByLanes says the stream's done is its lanes' (SetLanes), not one
// snapshot.
func (e *Stream) ByLanes() bool { return e.lanes != nil }

// Skip returns which rows of a decoded transaction the record holds
// resolved. Rows that only some lanes' done snapshots see have their lane
// read by lanesOf.
func (e *Stream) Skip(ctx context.Context, x pgoutput.Tx, lanesOf func(ctx context.Context, keys []string) (map[string]int32, error)) ([]bool, error) {
	out := make([]bool, len(x.Rows))
	var ask []string
	for i, d := range x.Rows {
		if _, ok := e.IDs[d.ID]; ok {
			e.IDs[d.ID] = d.Txid
			out[i] = true
			continue
		}
		switch {
		case x.End <= e.LSN:
			out[i] = true
		case d.Txid == 0:
		case e.lanes == nil:
			out[i] = e.done.Visible(d.Txid)
		case e.inter.Visible(d.Txid):
			out[i] = true
		default:
			if _, ok := e.laneOf[d.Key]; !ok && slices.ContainsFunc(e.snaps, func(s snapshot.Snapshot) bool { return s.Visible(d.Txid) }) {
				ask = append(ask, d.Key)
			}
		}
	}
	if len(ask) > 0 {
		lanes, err := lanesOf(ctx, ask)
		if err != nil {
			return nil, fmt.Errorf("relay: exactly-once stream: read the lanes of keys: %w", err)
		}
		maps.Copy(e.laneOf, lanes)
	}
	if e.lanes != nil {
		for i, d := range x.Rows {
			if lane, ok := e.laneOf[d.Key]; ok && !out[i] && d.Txid != 0 && int(lane) < len(e.snaps) {
				out[i] = e.snaps[lane].Visible(d.Txid)
			}
		}
	}
	return out, nil
}

// AddTopic adds a topic the stream publishes to, up to maxTopics.
func (e *Stream) AddTopic(t string) {
	i, found := slices.BinarySearch(e.topics, t)
	if !found && len(e.topics) < maxTopics {
		e.topics = slices.Insert(slices.Clone(e.topics), i, t)
	}
}

// Record is the stream's record before a batch, and its ids.
func (e *Stream) Record(table string) (StreamRecord, []int64) {
	r := StreamRecord{Table: table, Mode: StreamModeStream, LSN: uint64(e.LSN), Done: e.dtext, Base: e.base, Lanes: e.lanes,
		Topics: e.topics}
	ids := make([]int64, 0, len(e.IDs))
	for id := range e.IDs {
		ids = append(ids, id)
	}
	return r, ids
}

// IDRanges merges ids into sorted ranges of consecutive ids.
func IDRanges(ids []int64) [][2]int64 {
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
