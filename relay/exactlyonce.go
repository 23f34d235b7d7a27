package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

// exactlyOnce is the relay's Kafka side of ExactlyOnce: one transactional
// producer per lane (transactional id <TransactionalID>.lane-<n>) on one
// client, and the progress topic.
type exactlyOnce struct {
	addrs   []string
	conf    *sarama.Config
	topic   string // the progress topic
	prefix  string // of the transactional ids
	timeout time.Duration

	mu      sync.Mutex
	client  sarama.Client
	checked bool // the progress topic exists, with one partition
	lanes   map[int32]*laneTxn
	closed  bool
}

// laneTxn is a lane's transactional producer; busy while a batch holds it
// (one at a time: the lane's advisory lock is per transaction, and a
// relay's workers use separate transactions).
type laneTxn struct {
	txn *kafkaproducer.Txn
}

// progress is the value of a lane's record in the progress topic: the
// event ids (x-event-id) its transaction published. Event ids, not row ids:
// a row id can come back (a table recreated, TRUNCATE ... RESTART
// IDENTITY), an event id cannot.
type progress struct {
	Table    string      `json:"table"`
	Lane     int32       `json:"lane"`
	EventIDs []uuid.UUID `json:"event_ids"`
}

func newExactlyOnce(pub Publisher, cfg Config) (*exactlyOnce, error) {
	src, ok := pub.(kafkaSource)
	if !ok {
		return nil, &outbox.ConfigError{Field: "Delivery", Reason: "is exactly-once, which publishes through the relay's own transactional producer: pass a *relay.SaramaPublisher (or a type embedding it) as the publisher"}
	}
	addrs, conf := src.kafka()
	c := *conf
	return &exactlyOnce{addrs: addrs, conf: &c, topic: cfg.ProgressTopic, prefix: cfg.TransactionalID, timeout: cfg.TransactionTimeout, lanes: map[int32]*laneTxn{}}, nil
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
	compact := "compact"
	err = admin.CreateTopic(e.topic, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: rf,
		ConfigEntries: map[string]*string{"cleanup.policy": &compact, "min.insync.replicas": &isr}}, false)
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

// lane returns lane's transactional producer.
func (e *exactlyOnce) lane(client sarama.Client, lane int32) *laneTxn {
	e.mu.Lock()
	defer e.mu.Unlock()
	l := e.lanes[lane]
	if l == nil {
		l = &laneTxn{txn: kafkaproducer.NewTxn(client, e.conf, e.prefix+".lane-"+strconv.Itoa(int(lane)), e.timeout)}
		e.lanes[lane] = l
	}
	return l
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

// eoBatch is an ExactlyOnce batch's lane and what became of its Kafka
// transaction.
type eoBatch struct {
	lane      int32
	lt        *laneTxn
	committed bool // the Kafka transaction committed (or may have)
}

// eoClaim is the ExactlyOnce finder: it locks one lane (the first free one
// in order of its oldest unpublished event), takes the lane (see
// eoAcquire), and reads up to n of its oldest events, in a new statement
// after the lock and the acquisition.
func (r *Relay) eoClaim(ctx context.Context, tx pgx.Tx, n int, held []string, b *eoBatch) (claimed, error) {
	var cands []int32
	seen := 0
	args := pgx.NamedArgs{"window": 2 * n, "lanes": r.cfg.Lanes, "n": 0, "ns": r.q.ns}
	sql := r.q.window
	if len(held) > 0 {
		sql, args["held"] = r.q.windowHeld, held
	}
	err := r.query(ctx, tx, r.txSettings, []any{r.idleMillis}, sql, args, func(rows pgx.Rows) error {
		var (
			lane int32
			cnt  int
			ids  []int64
			got  *bool
		)
		_, err := pgx.ForEachRow(rows, []any{&lane, &cnt, &ids, &got}, func() error {
			cands = append(cands, lane)
			seen += cnt
			return nil
		})
		return err
	})
	if err != nil {
		return claimed{}, fmt.Errorf("relay: find lanes in %s: %w", r.cfg.Table, err)
	}
	if len(cands) == 0 {
		return claimed{}, nil
	}
	var lane int32
	err = tx.QueryRow(ctx, r.q.lockFirst, pgx.NamedArgs{"candidates": cands, "ns": r.q.ns}).Scan(&lane)
	if errors.Is(err, pgx.ErrNoRows) {
		return claimed{heldElsewhere: true}, nil
	}
	if err != nil {
		return claimed{}, fmt.Errorf("relay: lock a lane: %w", err)
	}
	if err := r.eoAcquire(ctx, lane, b); err != nil {
		return claimed{}, err
	}
	largs := pgx.NamedArgs{"lane": lane, "lanes": r.cfg.Lanes, "n": n}
	lsql := r.q.laneIDs
	if len(held) > 0 {
		lsql, largs["held"] = r.q.laneIDsHeld, held
	}
	rows, err := tx.Query(ctx, lsql, largs)
	if err != nil {
		return claimed{}, fmt.Errorf("relay: claim lane %d of %s: %w", lane, r.cfg.Table, err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return claimed{}, fmt.Errorf("relay: claim lane %d of %s: %w", lane, r.cfg.Table, err)
	}
	if len(ids) == 0 {
		return claimed{more: len(cands) > 1 || seen >= 2*n}, nil
	}
	c, err := r.readGuarded(ctx, tx, ids, n)
	c.more = c.more || len(cands) > 1 || len(ids) == n
	return c, err
}

// eoAcquire makes this relay the Kafka owner of a lane whose advisory lock
// its batch holds. When the relay owned it last and nothing fenced its
// producer since (Begin proves that with the transaction's first request),
// what it knows is current. Otherwise Init fences the lane's previous owner
// (aborting its open transaction, completing one it was committing), the
// lane's last committed progress record is read back read_committed, and
// its rows are marked published in a transaction of their own, committed
// synchronously before any row of the lane is read: the database marks are
// a cache of what Kafka committed.
func (r *Relay) eoAcquire(ctx context.Context, lane int32, b *eoBatch) error {
	client, err := r.eo.connect(ctx)
	if err != nil {
		return err
	}
	b.lane, b.lt = lane, r.eo.lane(client, lane)
	txn := b.lt.txn
	if txn.Ready() {
		err := txn.Begin(ctx, r.eo.topic, 0)
		if err == nil {
			return nil
		}
		if !errors.Is(err, kafkaproducer.ErrFenced) {
			return err
		}
	}
	if err := txn.Init(ctx); err != nil {
		return err
	}
	val, found, err := kafkaproducer.LastCommitted(ctx, client, r.eo.topic, 0, laneKey(lane))
	if err != nil {
		txn.Invalidate()
		return err
	}
	if found {
		var p progress
		if err := json.Unmarshal(val, &p); err != nil {
			txn.Invalidate()
			return fmt.Errorf("relay: exactly-once: lane %d's progress record in %q is not ours: %w", lane, r.eo.topic, err)
		}
		if err := r.markCommitted(ctx, p.EventIDs); err != nil {
			txn.Invalidate()
			return err
		}
	}
	return txn.Begin(ctx, r.eo.topic, 0)
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

// txnPublisher publishes in a lane's open transaction.
type txnPublisher struct{ txn *kafkaproducer.Txn }

func (p txnPublisher) Publish(ctx context.Context, msgs []Message) error {
	return results(msgs, p.txn.Produce(ctx, records(msgs)))
}

// eoSettle ends a batch's Kafka transaction after its publish: when some
// events were acknowledged it writes the lane's progress record (their
// ids) and commits; otherwise it aborts. If the transaction does not
// commit, the acknowledged events fail transiently (errs is updated): none
// of them is visible to read_committed consumers, and they are sent again.
func (r *Relay) eoSettle(ctx context.Context, b *eoBatch, rows []row, errs []error) {
	txn := b.lt.txn
	var ids []uuid.UUID
	for i, err := range errs {
		if err == nil {
			ids = append(ids, rows[i].eventID)
		}
	}
	if len(ids) == 0 {
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
	val, err := json.Marshal(progress{Table: r.cfg.Table.String(), Lane: b.lane, EventIDs: ids})
	if err != nil {
		_ = txn.Abort(ctx)
		fail(err)
		return
	}
	res := txn.Produce(ctx, []kafkaproducer.Record{{Topic: r.eo.topic, Key: laneKey(b.lane), Value: val}})
	if res[0].Err != nil {
		if err := txn.Abort(ctx); err != nil {
			txn.Invalidate()
		}
		fail(fmt.Errorf("write the lane's progress record: %w", res[0].Err))
		return
	}
	if err := txn.Commit(ctx); err != nil {
		// Not committed, or not known: the next owner of the lane (this
		// relay included) initialises its producer, which decides it,
		// and reads the lane's progress back.
		b.committed = !errors.Is(err, kafkaproducer.ErrTxnAborted)
		txn.Invalidate()
		fail(err)
		return
	}
	b.committed = true
}

// eoFinish ends an ExactlyOnce batch that returned err: a transaction it
// left open is aborted, and a lane whose Kafka commit the database marks
// did not follow is read back before its next transaction.
func (r *Relay) eoFinish(ctx context.Context, b *eoBatch, err error) {
	if b.lt == nil {
		return
	}
	txn := b.lt.txn
	if txn.Open() {
		// The batch ended before its publish settled the transaction.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if aerr := txn.Abort(actx); aerr != nil {
			txn.Invalidate()
		}
	}
	if b.committed && err != nil {
		// Committed to Kafka, but the database marks did not commit: read
		// the lane back before its next transaction.
		txn.Invalidate()
	}
}
