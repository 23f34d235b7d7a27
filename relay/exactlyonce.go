package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/backoff"
	"github.com/fxoutbox/outbox/internal/dberr"
	"github.com/fxoutbox/outbox/relay/internal/cursor"
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

// defaultTopicName makes a Kafka topic name of prefix and the table's
// name: characters Kafka refuses become '_'.
func defaultTopicName(prefix string, t outbox.Table) string {
	name := prefix + t.String()
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-' {
			return r
		}
		return '_'
	}, name)
}

// exactlyOnce is the relay's Kafka side of ExactlyOnce: the workers'
// transactional producers on one client, and the progress topic.
//
// Each batch runs one Kafka transaction, under the transactional id of the
// worker that runs it ("<TransactionalID>.<relay>.<n>": the relay's random
// id and the worker's number). A lane's records in the progress topic name
// the transactional id that wrote them: its owner. Whoever takes a lane
// whose owner is another id first initialises that id (InitProducerId),
// which fences the owner and aborts (or completes) its open transaction,
// then commits a record that names itself the lane's owner, and only then
// publishes the lane's events.
type exactlyOnce struct {
	addrs   []string
	brokers string // how connection errors name addrs
	conf    *sarama.Config
	topic   string // the progress topic
	prefix  string // of the transactional ids
	relayID string // this relay's part of them
	timeout time.Duration

	mu      sync.Mutex
	client  sarama.Client
	checked bool // the progress topic exists, with one partition
	free    []*eoWorker
	made    int                // workers made: the next one's number
	stream  *kafkaproducer.Txn // Stream mode: the stream's producer (streameo.go)
	closed  bool
}

// eoWorker is a transactional producer and the lanes it owns: the lanes
// whose last committed progress record is its own (it knows their events
// are all marked in the table) and that nobody took since (taking one
// fences the producer: owned is emptied when Init runs again).
type eoWorker struct {
	txn   *kafkaproducer.Txn
	owned map[int32]bool
}

// progress is the value of a lane's record in the progress topic: the
// transactional id that wrote it (the lane's owner) and the event ids
// (x-event-id) its transaction published. Event ids, not row ids: a row id
// can come back (a table recreated, TRUNCATE ... RESTART IDENTITY), an
// event id cannot.
//
// Under ProgressCursor it also holds the lane's position after the
// transaction: whoever takes the lane over writes it to the positions table
// (a relay that died between the Kafka commit and its own write of the
// position leaves it there only).
type progress struct {
	Table    string       `json:"table"`
	Lane     int32        `json:"lane"`
	Owner    string       `json:"owner"`
	EventIDs []uuid.UUID  `json:"event_ids"`
	Position *cursor.Lane `json:"position,omitempty"`
	// Topics are the topics of the events the transaction sent for the
	// lane: where a relay that fences the owner looks for what a broker
	// restart left of the transaction without a marker (see eoAcquire).
	Topics []string `json:"topics,omitempty"`
}

func newExactlyOnce(pub Publisher, cfg Config) (*exactlyOnce, error) {
	src, ok := pub.(kafkaSource)
	if !ok {
		return nil, &outbox.ConfigError{Field: "Delivery", Reason: "is exactly-once, which publishes through the relay's own transactional producer: pass a *relay.SaramaPublisher (or a type embedding it) as the publisher"}
	}
	addrs, conf, brokers := src.kafka()
	c := *conf
	// The lanes of a batch publish concurrently, on shared broker
	// connections: up to 5 requests in flight on each (Kafka's bound for
	// an idempotent producer). Order does not depend on it: the producer
	// keeps one batch in flight per partition and lane. sarama's
	// Idempotent flag (which insists on one request in flight) only
	// configures sarama's own producer, which this client does not run.
	c.Net.MaxOpenRequests = 5
	c.Producer.Idempotent = false
	return &exactlyOnce{addrs: addrs, brokers: brokers, conf: &c, topic: cfg.ProgressTopic, prefix: cfg.TransactionalID, timeout: cfg.TransactionTimeout, relayID: uuid.NewString()[:8]}, nil
}

// connect returns the client, connecting (and checking the progress topic,
// creating it when missing) on first use.
func (e *exactlyOnce) connect(ctx context.Context) (sarama.Client, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, ErrPublisherClosed
	}
	if e.client == nil {
		c, err := sarama.NewClient(e.addrs, e.conf)
		if err != nil {
			return nil, fmt.Errorf("relay: exactly-once: connect to Kafka %s: %w", e.brokers, err)
		}
		e.client = c
	}
	if !e.checked {
		if err := e.ensureTopic(ctx); err != nil {
			return nil, err
		}
		e.checked = true
	}
	return e.client, nil
}

// ensureTopic creates the progress topic when it is missing: compacted,
// one partition, replicated as the cluster allows (up to 3, with
// min.insync.replicas one less), and refuses one with more partitions.
func (e *exactlyOnce) ensureTopic(ctx context.Context) error {
	// Created first: a metadata request for a missing topic would have a
	// broker that auto-creates topics create it with its defaults.
	admin, err := sarama.NewClusterAdmin(e.addrs, e.conf)
	if err != nil {
		return fmt.Errorf("relay: exactly-once: create the progress topic %q: %w", e.topic, err)
	}
	defer admin.Close()
	rf := int16(min(3, len(e.client.Brokers())))
	isr := strconv.Itoa(int(max(1, rf-1)))
	// Compacted, in segments small enough (8 MiB, or 10 minutes) for the
	// cleaner to keep the partition near one record per lane: a relay that
	// takes a lane that has none reads the partition back to its start.
	compact, segBytes, segMs := "compact", "8388608", "600000"
	err = admin.CreateTopic(e.topic, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: rf,
		ConfigEntries: map[string]*string{"cleanup.policy": &compact, "min.insync.replicas": &isr, "segment.bytes": &segBytes, "segment.ms": &segMs}}, false)
	if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
		return fmt.Errorf("relay: exactly-once: create the progress topic %q (or create it yourself: 1 partition, cleanup.policy=compact): %w", e.topic, err)
	}
	var parts []int32
	for i := 0; i < 50 && ctx.Err() == nil; i++ {
		_ = e.client.RefreshMetadata(e.topic)
		if parts, err = e.client.Partitions(e.topic); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("relay: exactly-once: progress topic %q: %w", e.topic, err)
	}
	if len(parts) != 1 {
		return &outbox.ConfigError{Field: "ProgressTopic", Reason: fmt.Sprintf("topic %q has %d partitions: the progress topic must have exactly one (cleanup.policy=compact); name another one, or let the relay create it", e.topic, len(parts))}
	}
	return nil
}

// take returns a free worker, making one when none is.
func (e *exactlyOnce) take(client sarama.Client) *eoWorker {
	e.mu.Lock()
	defer e.mu.Unlock()
	if n := len(e.free); n > 0 {
		w := e.free[n-1]
		e.free = e.free[:n-1]
		return w
	}
	e.made++
	id := fmt.Sprintf("%s.%s.%d", e.prefix, e.relayID, e.made)
	return &eoWorker{txn: kafkaproducer.NewTxn(client, e.conf, id, e.timeout), owned: map[int32]bool{}}
}

// takeIdle takes the free worker whose transactional id is id, if this
// relay has one.
func (e *exactlyOnce) takeIdle(id string) *eoWorker {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, w := range e.free {
		if w.txn.ID() == id {
			e.free = slices.Delete(e.free, i, i+1)
			return w
		}
	}
	return nil
}

func (e *exactlyOnce) release(w *eoWorker) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.free = append(e.free, w)
}

func (e *exactlyOnce) close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	if e.client == nil {
		return nil
	}
	err := e.client.Close()
	e.client = nil
	return err
}

// eoBatch is an ExactlyOnce batch: its worker, its lanes, and what became
// of its Kafka transaction.
type eoBatch struct {
	w         *eoWorker
	keep      *eoKeeper // the worker's kept lanes (nil: none; see eokeep.go)
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
	cur        *cursorBatch
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
	client, err := r.eo.connect(ctx)
	if err != nil {
		return claimed{}, &kafkaStepError{err}
	}
	b.w, b.started = r.eoTake(client, b), time.Now()
	owned := make([]int32, 0, len(b.w.owned))
	for lane := range b.w.owned {
		owned = append(owned, lane)
	}
	laneOf := map[int64]int32{}
	ids, more, err := r.lockLanes(ctx, tx, n, held, 0, laneOf, owned)
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
	c, err := r.readGuarded(ctx, tx, ids, n)
	c.more = c.more || more || len(c.rows) == n
	b.laneOf = make(map[uuid.UUID]int32, len(c.rows))
	for _, x := range c.rows {
		b.laneOf[x.eventID] = laneOf[x.id]
	}
	return c, err
}

// eoTakeOver readies the batch's worker (eoBegin) and makes it the owner
// of lanes (eoAcquire), which its worker keeps from then on when it keeps
// lanes (see eoKeeper.own, in tx). done says the claim ends there, with c and err:
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
		err = b.keep.own(ctx, tx, lanes)
	}
	switch {
	case err == nil:
		return claimed{}, false, nil
	case errors.Is(err, kafkaproducer.ErrFenced) && !b.w.txn.Ready():
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
func (r *Relay) eoBegin(ctx context.Context, w *eoWorker) error {
	if w.txn.Ready() {
		// Before its lanes are read back: a transaction it aborted may
		// have left records without a marker (kafkaproducer.Settle).
		return w.txn.Settle(ctx)
	}
	clear(w.owned)
	return w.txn.Init(ctx)
}

// eoAcquire makes the batch's worker the owner of the batch's lanes it
// does not own. The lanes' last committed progress records are read back
// read_committed (one backward scan of the progress topic for all of them);
// every other transactional id they name is initialised (concurrently),
// which fences its producer and decides its open transaction, and their
// records are read again; the events they list are marked published in one
// transaction of its own, committed synchronously. Then one Kafka
// transaction commits a record naming the worker the owner of each lane it
// took, before any event of those lanes is published.
func (r *Relay) eoAcquire(ctx context.Context, client sarama.Client, b *eoBatch) error {
	w := b.w
	var take []int32
	for lane := range b.lanes {
		if !w.owned[lane] {
			take = append(take, lane)
		}
	}
	if len(take) == 0 {
		return nil
	}
	slices.Sort(take)
	recs, pending, err := r.lastProgress(ctx, client, take)
	if err != nil {
		return err
	}
	if ownPending(pending, take, w.txn.ID()) {
		if recs, pending, err = r.awaitOwnMarker(ctx, client, w, take); err != nil {
			return err
		}
	}
	// The owners to fence: the one of each lane's last committed record,
	// and those of records still undecided after it (a worker that took
	// the lane and had not finished), other than this worker.
	others := map[string][]int32{}
	for _, lane := range take {
		owners := ownersOf(pending[lane])
		if p, ok := recs[lane]; ok {
			owners = append(owners, p.Owner)
		}
		for _, o := range owners {
			if o != "" && o != w.txn.ID() && !slices.Contains(others[o], lane) {
				others[o] = append(others[o], lane)
			}
		}
	}
	if len(others) > 0 {
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			errs []error
			// the fenced owners' producers made here (not this relay's
			// idle workers, which settle their own transactions)
			made = map[string]*kafkaproducer.Txn{}
		)
		for owner, lanes := range others {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Fence the owner: its open transaction is aborted, one it
				// was committing completes. An idle worker of this relay
				// is initialised itself, which also settles what its
				// transactions left without a marker (kafkaproducer.Settle).
				fence := func() error {
					txn := kafkaproducer.NewTxn(client, r.eo.conf, owner, r.eo.timeout)
					mu.Lock()
					made[owner] = txn
					mu.Unlock()
					return txn.Init(ctx)
				}
				if ow := r.eo.takeIdle(owner); ow != nil {
					fence = func() error {
						defer r.eo.release(ow)
						clear(ow.owned)
						return ow.txn.Init(ctx)
					}
				}
				if err := fence(); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("relay: exactly-once: fence %q, the owner of lanes %v: %w", owner, lanes, err))
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if len(errs) > 0 {
			return errors.Join(errs...)
		}
		for owner, lanes := range others {
			r.cfg.Logger.Debug("outbox relay: exactly-once: took lanes over, fencing their owner", "lanes", lanes, "owner", owner, "transactional_id", w.txn.ID())
		}
		var fenced []int32
		defer func() { r.metrics.fenced(ctx, fenceFencing, len(fenced)) }()
		for _, lanes := range others {
			for _, lane := range lanes {
				if !slices.Contains(fenced, lane) {
					fenced = append(fenced, lane)
				}
			}
		}
		again, still, err := r.lastProgress(ctx, client, fenced) // the fenced owners' last word
		if err != nil {
			return err
		}
		if settled, err := r.eoSettleFenced(ctx, made, still); err != nil {
			return err
		} else if settled {
			if again, still, err = r.lastProgress(ctx, client, fenced); err != nil {
				return err
			}
		}
		for _, lane := range fenced {
			if len(still[lane]) > 0 {
				return fmt.Errorf("relay: exactly-once: lane %d has records of transactions still undecided after their owners %v were fenced; the lane is taken again later", lane, ownersOf(still[lane]))
			}
			if p, ok := again[lane]; ok {
				recs[lane] = p
			} else {
				delete(recs, lane)
			}
		}
	}
	var ids []uuid.UUID
	var register []int32
	var positions []cursor.Lane
	for _, lane := range take {
		p := recs[lane]
		ids = append(ids, p.EventIDs...)
		if p.Owner != w.txn.ID() {
			register = append(register, lane)
		}
		if p.Position != nil && p.Position.Lane == lane {
			positions = append(positions, *p.Position)
		}
	}
	if r.cur != nil {
		if err := r.applyPositions(ctx, positions); err != nil {
			return err
		}
	} else if err := r.markCommitted(ctx, ids); err != nil {
		return err
	}
	if len(register) > 0 {
		out := make([]kafkaproducer.Record, len(register))
		for i, lane := range register {
			rec, err := r.progressRecord(lane, w.txn.ID(), nil, nil, nil)
			if err != nil {
				return err
			}
			out[i] = rec
		}
		err := firstResult(w.txn.Produce(ctx, out))
		outcome := txnAborted
		if err == nil {
			if err = w.txn.Commit(ctx); err == nil {
				outcome = txnCommitted
			} else if !errors.Is(err, kafkaproducer.ErrTxnAborted) {
				outcome = txnUnknown
			}
		} else {
			_ = w.txn.Abort(ctx)
		}
		r.metrics.txnEnded(ctx, outcome, time.Time{}, err)
		if err != nil {
			w.txn.Invalidate()
			return fmt.Errorf("relay: exactly-once: take over lanes %v: %w", register, err)
		}
	}
	for _, lane := range take {
		w.owned[lane] = true
	}
	return nil
}

// eoSettleFenced settles what the transactions of owners fenced here left
// without a marker, when their progress records are still undecided after
// the fence: a broker that restarted skipped the markers of partitions it
// found without a leader (kafkaproducer.Settle), and an owner of another
// relay (or of this relay before a restart) cannot settle them itself. The
// progress topic and the topics the undecided records name are settled
// (their records of the owner's producer aborted). It reports whether it
// settled any.
func (r *Relay) eoSettleFenced(ctx context.Context, made map[string]*kafkaproducer.Txn, still map[int32][]progress) (bool, error) {
	topics := map[string]map[string]bool{} // owner -> topics
	for _, ps := range still {
		for _, p := range ps {
			if made[p.Owner] == nil {
				continue
			}
			if topics[p.Owner] == nil {
				topics[p.Owner] = map[string]bool{r.eo.topic: true}
			}
			for _, t := range p.Topics {
				topics[p.Owner][t] = true
			}
		}
	}
	for owner, ts := range topics {
		if err := made[owner].SettleTopics(ctx, slices.Sorted(maps.Keys(ts))); err != nil {
			return false, fmt.Errorf("relay: exactly-once: settle the transactions of %q: %w", owner, err)
		}
	}
	return len(topics) > 0, nil
}

// ownersOf returns the owners of records.
func ownersOf(records []progress) []string {
	out := make([]string, len(records))
	for i, p := range records {
		out[i] = p.Owner
	}
	return out
}

// awaitOwnMarker reads lanes back again until none holds a record of w's
// own last transaction still undecided, at most the transaction timeout.
// Such a record is decided (w's transaction ended, and one whose outcome
// was unknown was settled by Init), but EndTxn returns once the
// coordinator decided and the marker reaches the partition after that.
// Read back in that moment, the lane's last committed record would be the
// one before, and the events of w's commit would be sent twice.
func (r *Relay) awaitOwnMarker(ctx context.Context, client sarama.Client, w *eoWorker, lanes []int32) (map[int32]progress, map[int32][]progress, error) {
	r.cfg.Logger.Debug("outbox relay: exactly-once: waiting for this worker's last transaction's marker before reading its lanes back",
		"lanes", lanes, "transactional_id", w.txn.ID())
	bo := backoff.Backoff{Initial: time.Millisecond, Max: 100 * time.Millisecond}
	for deadline := time.Now().Add(r.eo.timeout); ; {
		if !backoff.Sleep(ctx, bo.Fail(), nil, nil) {
			return nil, nil, ctx.Err()
		}
		recs, pending, err := r.lastProgress(ctx, client, lanes)
		if err != nil || !ownPending(pending, lanes, w.txn.ID()) {
			return recs, pending, err
		}
		if time.Now().After(deadline) {
			return nil, nil, fmt.Errorf("relay: exactly-once: lanes %v hold a record of this worker's last transaction (%s) still undecided %v after it ended; the lanes are taken again later",
				lanes, w.txn.ID(), r.eo.timeout)
		}
	}
}

// ownPending says whether one of lanes has a record of id still undecided.
func ownPending(pending map[int32][]progress, lanes []int32, id string) bool {
	for _, lane := range lanes {
		if slices.Contains(ownersOf(pending[lane]), id) {
			return true
		}
	}
	return false
}

// lastProgress reads the last committed progress record of each lane
// (lanes without one are not in recs) and its records still undecided
// after it.
func (r *Relay) lastProgress(ctx context.Context, client sarama.Client, lanes []int32) (recs map[int32]progress, pending map[int32][]progress, err error) {
	keys := make([]string, len(lanes))
	for i, lane := range lanes {
		keys[i] = string(laneKey(lane))
	}
	vals, err := kafkaproducer.LastCommitted(ctx, client, r.eo.topic, 0, keys)
	if err != nil {
		return nil, nil, err
	}
	decode := func(lane int32, val []byte) (progress, error) {
		var p progress
		if err := json.Unmarshal(val, &p); err != nil {
			return p, fmt.Errorf("relay: exactly-once: lane %d's progress record in %q is not the relay's: %w", lane, r.eo.topic, err)
		}
		return p, nil
	}
	recs, pending = map[int32]progress{}, map[int32][]progress{}
	for i, lane := range lanes {
		l := vals[keys[i]]
		if l.Found {
			p, err := decode(lane, l.Value)
			if err != nil {
				return nil, nil, err
			}
			recs[lane] = p
		}
		for _, v := range l.Pending {
			p, err := decode(lane, v)
			if err != nil {
				return nil, nil, err
			}
			pending[lane] = append(pending[lane], p)
		}
	}
	return recs, pending, nil
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

func laneKey(lane int32) []byte { return []byte("lane-" + strconv.Itoa(int(lane))) }

// firstResult returns the first failure of a Produce call, if any.
func firstResult(res []kafkaproducer.Result) error {
	for _, r := range res {
		if r.Err != nil {
			return r.Err
		}
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
	b, txn := p.b, p.b.w.txn
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
		rec, err := p.r.progressRecord(lane, txn.ID(), byLane[lane], pos, b.topics[lane])
		if err != nil {
			return err
		}
		recs = append(recs, rec)
		positions[j] = positionKey(pos)
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

// progressRecord is lane's progress record: owner, the events ids and,
// under ProgressCursor, the lane's position after the transaction.
func (r *Relay) progressRecord(lane int32, owner string, ids []uuid.UUID, pos *cursor.Lane, topics []string) (kafkaproducer.Record, error) {
	if ids == nil {
		ids = []uuid.UUID{}
	}
	val, err := json.Marshal(progress{Table: r.cfg.Table.String(), Lane: lane, Owner: owner, EventIDs: ids, Position: pos, Topics: topics})
	if err != nil {
		return kafkaproducer.Record{}, err
	}
	return kafkaproducer.Record{Topic: r.eo.topic, Key: laneKey(lane), Value: val}, nil
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
func (r *Relay) eoSettle(ctx context.Context, b *eoBatch, rows []row, errs []error) {
	txn := b.w.txn
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
			lane := b.laneOf[rows[i].eventID]
			acked[lane] = append(acked[lane], rows[i].eventID)
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
		r.metrics.txnEnded(ctx, txnAborted, b.started, first)
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
				ok[rows[i].id] = true
			}
		}
		for _, l := range b.cur.advance(func(id int64) bool { return ok[id] }) {
			actual[l.Lane] = &l
		}
	}
	for _, lane := range lanes {
		if w := b.written[lane]; w != nil && slices.Equal(w, acked[lane]) && (b.cur == nil || b.writtenPos[lane] == positionKey(actual[lane])) {
			continue
		}
		rec, err := r.progressRecord(lane, txn.ID(), acked[lane], actual[lane], b.topics[lane])
		if err != nil {
			_ = txn.Abort(ctx)
			fail(err)
			return
		}
		fix = append(fix, rec)
	}
	if len(fix) > 0 {
		if err := firstResult(txn.Produce(ctx, fix)); err != nil {
			if aerr := txn.Abort(ctx); aerr != nil {
				txn.Invalidate()
			}
			r.metrics.txnEnded(ctx, txnAborted, b.started, err)
			fail(fmt.Errorf("write the lanes' progress records: %w", err))
			return
		}
	}
	if err := txn.Commit(ctx); err != nil {
		// Not committed, or not known: Init decides it, before the
		// worker's next transaction, and its lanes are read back.
		b.committed = !errors.Is(err, kafkaproducer.ErrTxnAborted)
		txn.Invalidate()
		outcome := txnAborted
		if b.committed {
			outcome = txnUnknown
		}
		r.metrics.txnEnded(ctx, outcome, b.started, err)
		fail(err)
		return
	}
	b.committed = true
	r.metrics.txnEnded(ctx, txnCommitted, b.started, nil)
}

// eoFenced logs, at Debug, that w's producer lost its transactional id:
// a worker of this or another relay took one of w's lanes over (w was
// slower than its lease, or frozen past it), so w's open transaction is
// aborted and its batch's events are held and sent again at once, once w
// took its lanes again. Lanes move between live relays in normal running,
// so this is never above Debug; the worker that took them logs it too.
func (r *Relay) eoFenced(w *eoWorker, err error) {
	r.metrics.fenced(context.Background(), fenceFenced, 1)
	r.cfg.Logger.Debug("outbox relay: exactly-once: this worker was fenced; its transaction is aborted and its batch's events are sent again at once",
		"transactional_id", w.txn.ID(), "error", err)
}

// eoFinish ends an ExactlyOnce batch that returned err: a transaction it
// left open is aborted; lanes whose Kafka commit the database marks did
// not follow are read back before the worker publishes them again; and the
// worker is free for the next batch.
func (r *Relay) eoFinish(ctx context.Context, b *eoBatch, err error) {
	if b.w == nil {
		if b.keep != nil {
			b.keep.finished(ctx, b, err)
		}
		return
	}
	txn := b.w.txn
	if txn.Open() {
		if aerr := txn.Abort(ctx); aerr != nil {
			txn.Invalidate()
		}
		r.metrics.txnEnded(ctx, txnAborted, b.started, err)
	}
	if b.committed && err != nil {
		for lane := range b.lanes {
			delete(b.w.owned, lane)
		}
	}
	if b.keep != nil && b.keep.w == b.w {
		b.keep.finished(ctx, b, err)
		return
	}
	r.eo.release(b.w)
}

// eoTake returns the producer of batch b: its worker's, when the worker
// keeps lanes, or a free one.
func (r *Relay) eoTake(client sarama.Client, b *eoBatch) *eoWorker {
	if b.keep.usable() {
		return b.keep.worker(client)
	}
	return r.eo.take(client)
}
