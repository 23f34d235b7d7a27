package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
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
	// writes the lane's progress to the table's progress topic, and marks
	// the rows after the commit: every event reaches each read_committed
	// consumer once, in per-key order, across relay, broker and database
	// crashes (see the README, "Exactly once"). It needs Mode Poll,
	// Ordering PerKey and a SaramaPublisher; a batch is one lane's events.
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

// ParseDelivery parses "at-least-once" or "exactly-once".
func ParseDelivery(s string) (Delivery, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "at-least-once", "":
		return AtLeastOnce, nil
	case "exactly-once":
		return ExactlyOnce, nil
	}
	return 0, &outbox.ConfigError{Field: "Delivery", Reason: fmt.Sprintf("is %q: use at-least-once or exactly-once", s)}
}

// kafkaSource is a publisher that can give the relay its brokers and
// sarama configuration, for the transactional producers of ExactlyOnce.
// SaramaPublisher (and a type embedding it) is one.
type kafkaSource interface {
	kafka() ([]string, *sarama.Config)
}

func (p *SaramaPublisher) kafka() ([]string, *sarama.Config) { return p.addrs, p.cfg }

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
	conf    *sarama.Config
	topic   string // the progress topic
	prefix  string // of the transactional ids
	relayID string // this relay's part of them
	timeout time.Duration

	mu      sync.Mutex
	client  sarama.Client
	checked bool // the progress topic exists, with one partition
	free    []*eoWorker
	made    int // workers made: the next one's number
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
type progress struct {
	Table    string      `json:"table"`
	Lane     int32       `json:"lane"`
	Owner    string      `json:"owner"`
	EventIDs []uuid.UUID `json:"event_ids"`
}

func newExactlyOnce(pub Publisher, cfg Config) (*exactlyOnce, error) {
	src, ok := pub.(kafkaSource)
	if !ok {
		return nil, &outbox.ConfigError{Field: "Delivery", Reason: "is exactly-once, which publishes through the relay's own transactional producer: pass a *relay.SaramaPublisher (or a type embedding it) as the publisher"}
	}
	addrs, conf := src.kafka()
	c := *conf
	// The lanes of a batch publish concurrently, on shared broker
	// connections: up to 5 requests in flight on each (Kafka's bound for
	// an idempotent producer). Order does not depend on it: the producer
	// keeps one batch in flight per partition and lane. sarama's
	// Idempotent flag (which insists on one request in flight) only
	// configures sarama's own producer, which this client does not run.
	c.Net.MaxOpenRequests = 5
	c.Producer.Idempotent = false
	return &exactlyOnce{addrs: addrs, conf: &c, topic: cfg.ProgressTopic, prefix: cfg.TransactionalID, timeout: cfg.TransactionTimeout, relayID: uuid.NewString()[:8]}, nil
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
			return nil, fmt.Errorf("relay: exactly-once: connect to Kafka %v: %w", e.addrs, err)
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
	lanes     map[int32]bool
	laneOf    map[uuid.UUID]int32 // event id -> lane
	committed bool                // the batch's Kafka transaction committed (or may have)
}

// eoClaim is the ExactlyOnce finder: the PerKey claim's lanes (locked as
// always, the worker's own lanes first), taken over by the batch's worker
// (see eoAcquire) before their rows are read, in a new statement after the
// locks and the acquisitions.
func (r *Relay) eoClaim(ctx context.Context, tx pgx.Tx, n int, held []string, b *eoBatch) (claimed, error) {
	client, err := r.eo.connect(ctx)
	if err != nil {
		return claimed{}, err
	}
	b.w = r.eo.take(client)
	owned := make([]int32, 0, len(b.w.owned))
	for lane := range b.w.owned {
		owned = append(owned, lane)
	}
	laneOf := map[int64]int32{}
	ids, more, err := r.lockLanes(ctx, tx, n, held, 0, laneOf, owned)
	if err != nil || len(ids) == 0 {
		return claimed{heldElsewhere: err == nil && more}, err
	}
	if err := r.eoBegin(ctx, b.w); err != nil {
		return claimed{}, err
	}
	b.lanes = map[int32]bool{}
	for _, lane := range laneOf {
		b.lanes[lane] = true
	}
	if err := r.eoAcquire(ctx, client, b); err != nil {
		return claimed{}, err
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

// eoBegin opens the worker's transaction. Its first request also proves the
// producer was not fenced since its last transaction; if it was (a lane it
// owned was taken), or it needs Init anyway, Init runs and the worker owns
// no lane any more.
func (r *Relay) eoBegin(ctx context.Context, w *eoWorker) error {
	if w.txn.Ready() {
		err := w.txn.Begin(ctx, r.eo.topic, 0)
		if err == nil || !errors.Is(err, kafkaproducer.ErrFenced) {
			return err
		}
	}
	clear(w.owned)
	if err := w.txn.Init(ctx); err != nil {
		return err
	}
	return w.txn.Begin(ctx, r.eo.topic, 0)
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
	recs, err := r.lastProgress(ctx, client, take)
	if err != nil {
		return err
	}
	others := map[string][]int32{} // owner -> its lanes
	for _, lane := range take {
		if p, ok := recs[lane]; ok && p.Owner != "" && p.Owner != w.txn.ID() {
			others[p.Owner] = append(others[p.Owner], lane)
		}
	}
	if len(others) > 0 {
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			errs []error
		)
		for owner, lanes := range others {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Fence the owner: its open transaction is aborted, one it
				// was committing completes.
				if err := kafkaproducer.NewTxn(client, r.eo.conf, owner, r.eo.timeout).Init(ctx); err != nil {
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
		var fenced []int32
		for _, lanes := range others {
			fenced = append(fenced, lanes...)
		}
		again, err := r.lastProgress(ctx, client, fenced) // the fenced owners' last word
		if err != nil {
			return err
		}
		for lane, p := range again {
			recs[lane] = p
		}
	}
	var ids []uuid.UUID
	var register []int32
	for _, lane := range take {
		p := recs[lane]
		ids = append(ids, p.EventIDs...)
		if p.Owner != w.txn.ID() {
			register = append(register, lane)
		}
	}
	if err := r.markCommitted(ctx, ids); err != nil {
		return err
	}
	if len(register) > 0 {
		out := make([]kafkaproducer.Record, len(register))
		for i, lane := range register {
			val, err := json.Marshal(progress{Table: r.cfg.Table.String(), Lane: lane, Owner: w.txn.ID(), EventIDs: []uuid.UUID{}})
			if err != nil {
				return err
			}
			out[i] = kafkaproducer.Record{Topic: r.eo.topic, Key: laneKey(lane), Value: val}
		}
		err := firstResult(w.txn.Produce(ctx, out))
		if err == nil {
			err = w.txn.Commit(ctx)
		} else {
			_ = w.txn.Abort(ctx)
		}
		if err == nil {
			err = w.txn.Begin(ctx, r.eo.topic, 0)
		}
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

// lastProgress reads the last committed progress record of each lane
// (lanes without one are not in the map).
func (r *Relay) lastProgress(ctx context.Context, client sarama.Client, lanes []int32) (map[int32]progress, error) {
	keys := make([]string, len(lanes))
	for i, lane := range lanes {
		keys[i] = string(laneKey(lane))
	}
	vals, err := kafkaproducer.LastCommitted(ctx, client, r.eo.topic, 0, keys)
	if err != nil {
		return nil, err
	}
	out := make(map[int32]progress, len(vals))
	for i, lane := range lanes {
		val, ok := vals[keys[i]]
		if !ok {
			continue
		}
		var p progress
		if err := json.Unmarshal(val, &p); err != nil {
			return nil, fmt.Errorf("relay: exactly-once: lane %d's progress record in %q is not the relay's: %w", lane, r.eo.topic, err)
		}
		out[lane] = p
	}
	return out, nil
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
	b.Queue("SELECT set_config('synchronous_commit', 'on', true)")
	b.Queue(r.q.markCommitted, ids)
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

// txnPublisher publishes in a worker's open transaction.
type txnPublisher struct{ txn *kafkaproducer.Txn }

func (p txnPublisher) Publish(ctx context.Context, msgs []Message) error {
	return results(msgs, p.txn.Produce(ctx, records(msgs)))
}

// eoSettle ends the batch's Kafka transaction after its publish: when some
// events were acknowledged it writes a progress record for each lane that
// has some (its owner and their event ids) and commits; otherwise it
// aborts. If the transaction does not commit, the acknowledged events fail
// transiently (errs is updated): none of them is visible to read_committed
// consumers, and they are sent again.
func (r *Relay) eoSettle(ctx context.Context, b *eoBatch, rows []row, errs []error) {
	txn := b.w.txn
	byLane := map[int32][]uuid.UUID{}
	var lanes []int32
	for i, err := range errs {
		if err == nil {
			lane := b.laneOf[rows[i].eventID]
			if byLane[lane] == nil {
				lanes = append(lanes, lane)
			}
			byLane[lane] = append(byLane[lane], rows[i].eventID)
		}
	}
	if len(lanes) == 0 {
		if err := txn.Abort(ctx); err != nil {
			txn.Invalidate()
		}
		return
	}
	fail := func(err error) {
		err = fmt.Errorf("relay: exactly-once: the batch's Kafka transaction did not commit, its events are sent again: %w", err)
		for i := range errs {
			if errs[i] == nil {
				errs[i] = err
			}
		}
	}
	slices.Sort(lanes)
	recs := make([]kafkaproducer.Record, len(lanes))
	for i, lane := range lanes {
		val, err := json.Marshal(progress{Table: r.cfg.Table.String(), Lane: lane, Owner: txn.ID(), EventIDs: byLane[lane]})
		if err != nil {
			_ = txn.Abort(ctx)
			fail(err)
			return
		}
		recs[i] = kafkaproducer.Record{Topic: r.eo.topic, Key: laneKey(lane), Value: val}
	}
	if err := firstResult(txn.Produce(ctx, recs)); err != nil {
		if aerr := txn.Abort(ctx); aerr != nil {
			txn.Invalidate()
		}
		fail(fmt.Errorf("write the lanes' progress records: %w", err))
		return
	}
	if err := txn.Commit(ctx); err != nil {
		// Not committed, or not known: Init decides it, before the
		// worker's next transaction, and its lanes are read back.
		b.committed = !errors.Is(err, kafkaproducer.ErrTxnAborted)
		txn.Invalidate()
		fail(err)
		return
	}
	b.committed = true
}

// eoFinish ends an ExactlyOnce batch that returned err: a transaction it
// left open is aborted; lanes whose Kafka commit the database marks did
// not follow are read back before the worker publishes them again; and the
// worker is free for the next batch.
func (r *Relay) eoFinish(ctx context.Context, b *eoBatch, err error) {
	if b.w == nil {
		return
	}
	txn := b.w.txn
	if txn.Open() {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if aerr := txn.Abort(actx); aerr != nil {
			txn.Invalidate()
		}
	}
	if b.committed && err != nil {
		for lane := range b.lanes {
			delete(b.w.owned, lane)
		}
	}
	r.eo.release(b.w)
}
