// Package eo is the relay's exactly-once delivery outside the batch: the
// workers' transactional producers on one client, the progress topic, the
// lanes' records in it, taking a lane over by fencing its owner, the
// stream's record, and the lanes a polling worker keeps locked between its
// batches (Keeper).
//
// Each batch runs one Kafka transaction, under the transactional id of the
// worker that runs it ("<TransactionalID>.<relay>.<n>": the relay's random
// id and the worker's number). A lane's records in the progress topic name
// the transactional id that wrote them: its owner. Whoever takes a lane
// whose owner is another id first initialises that id (InitProducerId),
// which fences the owner and aborts (or completes) its open transaction,
// then commits a record that names itself the lane's owner, and only then
// publishes the lane's events (Pool.Acquire).
//
// The package reads and writes no row of the table: what a lane's records
// say is applied to it by the caller (Acquire's apply); Keeper only holds
// the lanes' session locks (relay/internal/lanelock).
package eo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/relay/internal/cursor"
	"github.com/fxoutbox/outbox/relay/internal/kafkaproducer"
)

// The outcomes of a Kafka transaction and the sides of a fence, as the
// relay's metrics name them.
const (
	TxnCommitted = "committed"
	TxnAborted   = "aborted"
	TxnUnknown   = "unknown"
	FenceFencing = "fencing"
	FenceFenced  = "fenced"
)

// Observer counts what the pool's transactions and fences did.
type Observer interface {
	// TxnEnded counts a Kafka transaction that ended with outcome (err
	// when not committed), and, when started is not zero, its duration.
	TxnEnded(ctx context.Context, outcome string, started time.Time, err error)
	// Fenced counts lanes changing owner: side FenceFencing (n lanes taken
	// over) or FenceFenced (a worker found it was fenced, n = 1).
	Fenced(ctx context.Context, side string, n int)
}

// Config is what a Pool needs. Every field is required.
type Config struct {
	Addrs   []string
	Brokers string         // how connection errors name Addrs
	Sarama  *sarama.Config // copied; the pool sets what its client needs
	Topic   string         // the progress topic
	Prefix  string         // of the transactional ids
	Timeout time.Duration  // of a transaction
	Table   string         // the outbox table, named in each record
	Closed  error          // what Connect returns once the pool is closed
	Observer
	Logger *slog.Logger
}

// Pool is a relay's workers' transactional producers on one client, and
// the progress topic.
type Pool struct {
	cfg     Config
	relayID string // this relay's part of the transactional ids

	mu      sync.Mutex
	client  sarama.Client
	checked bool // the progress topic exists, with one partition
	free    []*Worker
	made    int                // workers made: the next one's number
	stream  *kafkaproducer.Txn // Stream mode: the stream's producer
	closed  bool
}

// Worker is a transactional producer and the lanes it owns: the lanes
// whose last committed progress record is its own (it knows their events
// are all marked in the table) and that nobody took since (taking one
// fences the producer: Owned is emptied when Init runs again).
type Worker struct {
	Txn   *kafkaproducer.Txn
	Owned map[int32]bool
}

// New returns a pool. It does no I/O.
func New(cfg Config) *Pool {
	c := *cfg.Sarama
	// The lanes of a batch publish concurrently, on shared broker
	// connections: up to 5 requests in flight on each (Kafka's bound for
	// an idempotent producer). Order does not depend on it: the producer
	// keeps one batch in flight per partition and lane. sarama's
	// Idempotent flag (which insists on one request in flight) only
	// configures sarama's own producer, which this client does not run.
	c.Net.MaxOpenRequests = 5
	c.Producer.Idempotent = false
	cfg.Sarama = &c
	return &Pool{cfg: cfg, relayID: uuid.NewString()[:8]}
}

// Topic is the progress topic.
func (p *Pool) Topic() string { return p.cfg.Topic }

// Timeout is the transactions' timeout.
func (p *Pool) Timeout() time.Duration { return p.cfg.Timeout }

// TopicName makes a Kafka topic name of prefix and a table's name:
// characters Kafka refuses become '_'.
func TopicName(prefix, table string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-' {
			return r
		}
		return '_'
	}, prefix+table)
}

// Connect returns the client, connecting (and checking the progress topic,
// creating it when missing) on first use.
func (p *Pool) Connect(ctx context.Context) (sarama.Client, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, p.cfg.Closed
	}
	if p.client == nil {
		c, err := sarama.NewClient(p.cfg.Addrs, p.cfg.Sarama)
		if err != nil {
			return nil, fmt.Errorf("relay: exactly-once: connect to Kafka %s: %w", p.cfg.Brokers, err)
		}
		p.client = c
	}
	if !p.checked {
		if err := p.ensureTopic(ctx); err != nil {
			return nil, err
		}
		p.checked = true
	}
	return p.client, nil
}

// ensureTopic creates the progress topic when it is missing: compacted,
// one partition, replicated as the cluster allows (up to 3, with
// min.insync.replicas one less), and refuses one with more partitions.
func (p *Pool) ensureTopic(ctx context.Context) error {
	topic := p.cfg.Topic
	// Created first: a metadata request for a missing topic would have a
	// broker that auto-creates topics create it with its defaults.
	admin, err := sarama.NewClusterAdmin(p.cfg.Addrs, p.cfg.Sarama)
	if err != nil {
		return fmt.Errorf("relay: exactly-once: create the progress topic %q: %w", topic, err)
	}
	defer admin.Close()
	rf := int16(min(3, len(p.client.Brokers())))
	isr := strconv.Itoa(int(max(1, rf-1)))
	// Compacted, in segments small enough (8 MiB, or 10 minutes) for the
	// cleaner to keep the partition near one record per lane: a relay that
	// takes a lane that has none reads the partition back to its start.
	compact, segBytes, segMs := "compact", "8388608", "600000"
	err = admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: rf,
		ConfigEntries: map[string]*string{"cleanup.policy": &compact, "min.insync.replicas": &isr, "segment.bytes": &segBytes, "segment.ms": &segMs}}, false)
	if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
		return fmt.Errorf("relay: exactly-once: create the progress topic %q (or create it yourself: 1 partition, cleanup.policy=compact): %w", topic, err)
	}
	var parts []int32
	for i := 0; i < 50 && ctx.Err() == nil; i++ {
		_ = p.client.RefreshMetadata(topic)
		if parts, err = p.client.Partitions(topic); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("relay: exactly-once: progress topic %q: %w", topic, err)
	}
	if len(parts) != 1 {
		return &outbox.ConfigError{Field: "ProgressTopic", Reason: fmt.Sprintf("topic %q has %d partitions: the progress topic must have exactly one (cleanup.policy=compact); name another one, or let the relay create it", topic, len(parts))}
	}
	return nil
}

// Take returns a free worker, making one when none is.
func (p *Pool) Take(client sarama.Client) *Worker {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := len(p.free); n > 0 {
		w := p.free[n-1]
		p.free = p.free[:n-1]
		return w
	}
	p.made++
	id := fmt.Sprintf("%s.%s.%d", p.cfg.Prefix, p.relayID, p.made)
	return &Worker{Txn: kafkaproducer.NewTxn(client, p.cfg.Sarama, id, p.cfg.Timeout), Owned: map[int32]bool{}}
}

// takeIdle takes the free worker whose transactional id is id, if this
// pool has one.
func (p *Pool) takeIdle(id string) *Worker {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, w := range p.free {
		if w.Txn.ID() == id {
			p.free = slices.Delete(p.free, i, i+1)
			return w
		}
	}
	return nil
}

// Release frees w for the next batch.
func (p *Pool) Release(w *Worker) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.free = append(p.free, w)
}

// Close closes the client: Connect fails from then on.
func (p *Pool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	if p.client == nil {
		return nil
	}
	err := p.client.Close()
	p.client = nil
	return err
}

// StreamProducer returns the stream's transactional producer (its id is
// fixed per table: "<prefix>.stream"), made on first use, after Connect.
func (p *Pool) StreamProducer() *kafkaproducer.Txn {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stream == nil {
		p.stream = kafkaproducer.NewTxn(p.client, p.cfg.Sarama, p.cfg.Prefix+".stream", p.cfg.Timeout)
	}
	return p.stream
}

// Disown makes every free worker read its lanes back before it publishes
// them again.
func (p *Pool) Disown() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, w := range p.free {
		clear(w.Owned)
	}
}

// Progress is the value of a lane's record in the progress topic: the
// transactional id that wrote it (the lane's owner) and the event ids
// (x-event-id) its transaction published. Event ids, not row ids: a row id
// can come back (a table recreated, TRUNCATE ... RESTART IDENTITY), an
// event id cannot.
//
// Under cursor progress it also holds the lane's position after the
// transaction: whoever takes the lane over writes it to the positions table
// (a relay that died between the Kafka commit and its own write of the
// position leaves it there only).
type Progress struct {
	Table    string       `json:"table"`
	Lane     int32        `json:"lane"`
	Owner    string       `json:"owner"`
	EventIDs []uuid.UUID  `json:"event_ids"`
	Position *cursor.Lane `json:"position,omitempty"`
	// Topics are the topics of the events the transaction sent for the
	// lane: where a relay that fences the owner looks for what a broker
	// restart left of the transaction without a marker (see Acquire).
	Topics []string `json:"topics,omitempty"`
}

// LaneKey is a lane's records' key.
func LaneKey(lane int32) []byte { return []byte("lane-" + strconv.Itoa(int(lane))) }

// Record is lane's progress record: owner, the events ids and, under
// cursor progress, the lane's position after the transaction.
func (p *Pool) Record(lane int32, owner string, ids []uuid.UUID, pos *cursor.Lane, topics []string) (kafkaproducer.Record, error) {
	if ids == nil {
		ids = []uuid.UUID{}
	}
	val, err := json.Marshal(Progress{Table: p.cfg.Table, Lane: lane, Owner: owner, EventIDs: ids, Position: pos, Topics: topics})
	if err != nil {
		return kafkaproducer.Record{}, err
	}
	return kafkaproducer.Record{Topic: p.cfg.Topic, Key: LaneKey(lane), Value: val}, nil
}

// PositionKey is how a record's position compares: "" for none.
func PositionKey(l *cursor.Lane) string {
	if l == nil {
		return ""
	}
	b, _ := json.Marshal(l)
	return string(b)
}

// FirstResult returns the first failure of a Produce call, if any.
func FirstResult(res []kafkaproducer.Result) error {
	for _, r := range res {
		if r.Err != nil {
			return r.Err
		}
	}
	return nil
}
