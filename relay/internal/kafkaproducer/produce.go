// Package kafkaproducer is the relay's Kafka producer: an idempotent,
// acks=all producer of its own on sarama's client and broker API, that keeps
// the order of first deliveries per partition through broker faults.
// Producer sends on a connected sarama.Client; Lazy connects on first use,
// returns when a caller's ctx ends and waits for its goroutines at Close
// (relay.SaramaPublisher is Lazy plus the relay's message and error types).
//
// Error texts start with "relay:": they reach the relay's logs and the
// last_error of events as they were before this package was split out.
package kafkaproducer

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/fxoutbox/outbox/relay/internal/failure"
)

// The produce path: an idempotent producer of its own on sarama's client
// and broker API, built around one rule that keeps the
// order of first deliveries through any fault:
//
//	for each partition, at most one record batch is in flight, and the next
//	batch of the partition is sent only after the previous one was
//	acknowledged.
//
// A broker appends or rejects a record batch whole, so a failed batch is
// never followed into Kafka by a later record of its partition. A retry
// resends the very same batch (same producer id, epoch and sequence
// numbers), which the broker appends once. When the outcome of a batch stays
// unknown (retries or ctx ran out), the batch and every later message of its
// partition in the call fail, and the producer identity is replaced before
// it is used again, because the broker's sequence state for it is unknown.

// Sizes sarama's producer uses to bound a record batch without encoding it.
const (
	recordBatchOverhead   = 61
	maximumRecordOverhead = 5*binary.MaxVarintLen32 + binary.MaxVarintLen64 + 1
)

// tp is a topic partition.
type tp struct {
	topic     string
	partition int32
}

func (t tp) String() string { return fmt.Sprintf("topic %q partition %d", t.topic, t.partition) }

// identity is an idempotent producer id and epoch; gen numbers the
// identities of one producer (0: none yet).
type identity struct {
	pid   int64
	epoch int16
	gen   uint64
}

// partState is one partition's sequence state, shared by concurrent calls.
type partState struct {
	// lock (capacity 1) is held by the call whose batch of the partition is
	// unresolved: from before its first send until it was acknowledged or
	// failed. Only the holder reads or writes gen and seq.
	lock chan struct{}
	gen  uint64 // the identity seq counts for
	seq  int32  // the next sequence number under that identity
}

// Producer sends record batches on a sarama client, as an idempotent
// producer. It is safe for concurrent use: concurrent Produce calls share
// partitions, one batch in flight per partition (see Produce).
type Producer struct {
	client  sarama.Client
	conf    *sarama.Config
	version int16 // of ProduceRequest

	idMu sync.Mutex // held while a new identity is fetched

	mu           sync.Mutex
	id           identity
	stale        bool // id must be replaced before a new batch uses it
	parts        map[tp]*partState
	partitioners map[string]sarama.Partitioner

	// txn is set when the producer is a Txn's: batches are transactional,
	// partitions are added to the transaction before they are sent, and
	// an identity is never replaced here (only Txn.Init replaces it).
	txn *Txn
}

// New returns a producer that sends on client with conf, the configuration
// the client was made with (already validated: Producer.Idempotent,
// RequiredAcks = WaitForAll, Retry.Max >= 1). The producer owns client from
// now on: Close closes it. It does no I/O.
func New(client sarama.Client, conf *sarama.Config) *Producer {
	return &Producer{
		client:       client,
		conf:         conf,
		version:      produceVersion(conf.Version),
		parts:        map[tp]*partState{},
		partitioners: map[string]sarama.Partitioner{},
	}
}

// produceVersion is the ProduceRequest version sarama's own producer uses
// with a broker version (at least 3: record batches, idempotence).
func produceVersion(v sarama.KafkaVersion) int16 {
	switch {
	case v.IsAtLeast(sarama.V3_7_0_0):
		return 10
	case v.IsAtLeast(sarama.V2_8_0_0):
		return 9
	case v.IsAtLeast(sarama.V2_4_0_0):
		return 8
	case v.IsAtLeast(sarama.V2_1_0_0):
		return 7
	case v.IsAtLeast(sarama.V2_0_0_0):
		return 6
	case v.IsAtLeast(sarama.V1_0_0_0):
		return 5
	default:
		return 3
	}
}

// pbatch is one record batch of a call: messages of one partition, in order.
type pbatch struct {
	idx      []int
	size     int  // estimated encoded size
	assigned bool // id and seq are fixed: the batch is being sent, or was
	id       identity
	seq      int32
	rb       *sarama.RecordBatch // built at the first send, resent as is
}

// plane (a partition lane) is one partition's part of a call.
type plane struct {
	tp      tp
	st      *partState
	batches []*pbatch // not yet resolved; batches[0] is the next to send
	held    bool      // the call holds st.lock
	retries int       // failed attempts of batches[0]
	done    bool
}

func (l *plane) head() *pbatch { return l.batches[0] }

// add appends message i to the lane's last batch, or starts a new batch
// when that one would grow past max bytes (a larger record goes alone).
func (l *plane) add(i, size, max int) {
	if n := len(l.batches); n > 0 {
		if b := l.batches[n-1]; b.size+size <= max {
			b.idx = append(b.idx, i)
			b.size += size
			return
		}
	}
	l.batches = append(l.batches, &pbatch{idx: []int{i}, size: recordBatchOverhead + size})
}

// recordSize bounds a message's encoded size in a record batch, as sarama's
// producer does.
func recordSize(m Record) int {
	n := maximumRecordOverhead + len(m.Key) + len(m.Value)
	for _, h := range m.Headers {
		n += len(h.Key) + len(h.Value) + 2*binary.MaxVarintLen32
	}
	return n
}

// publish sends msgs and returns the error of each message that was not
// acknowledged; it writes where each acknowledged one was stored (when the
// broker said) to stored[i]. It can block in a broker or metadata call (sarama takes no
// context) past the end of ctx, for as long as sarama's timeouts allow
// (Net.ReadTimeout, Metadata.Timeout).
func (pr *Producer) publish(ctx context.Context, msgs []Record, stored []Result) map[int]error {
	failed := map[int]error{}
	lanes := pr.plan(msgs, failed)
	defer func() {
		for _, l := range lanes {
			pr.release(l)
		}
	}()
	if pr.txn != nil {
		if err := pr.txn.add(ctx, lanes); err != nil {
			pr.txn.doom(err)
			for _, l := range lanes {
				pr.failLane(l, err, err, false, failed)
			}
			return failed
		}
	}
	for {
		var active []*plane
		for _, l := range lanes {
			if !l.done {
				active = append(active, l)
			}
		}
		if len(active) == 0 {
			return failed
		}
		if err := ctx.Err(); err != nil {
			for _, l := range active {
				err := fmt.Errorf("relay: publish to %s: %w", l.tp, err)
				pr.failLane(l, err, err, true, failed)
			}
			return failed
		}
		ready := pr.acquire(ctx, active)
		if len(ready) == 0 {
			continue // ctx ended
		}
		retry := pr.wave(ready, msgs, lanes, failed, stored)
		if len(retry) == 0 {
			continue
		}
		topics := map[string]bool{}
		attempts := 0
		for _, l := range retry {
			topics[l.tp.topic] = true
			attempts = max(attempts, l.retries)
		}
		_ = pr.client.RefreshMetadata(sortedKeys(topics)...) // a failure shows in the next attempt
		for topic := range topics {
			// A topic deleted since the batch was planned fails now, not
			// after every retry.
			if _, err := pr.client.Partitions(topic); err != nil && failure.KafkaTopicLevel(err) {
				pr.failTopic(topic, lanes, err, failed)
			}
		}
		sleepCtx(ctx, pr.backoff(attempts))
	}
}

// plan partitions msgs with the configured partitioner and cuts each
// partition's messages into record batches of at most
// Producer.MaxMessageBytes. Every message of a topic that cannot be produced
// to (missing, invalid, unauthorized) fails in failed, permanently; of a
// topic whose metadata cannot be had, transiently.
func (pr *Producer) plan(msgs []Record, failed map[int]error) []*plane {
	byTopic := map[string][]int{}
	var topics []string
	for i, m := range msgs {
		if _, ok := byTopic[m.Topic]; !ok {
			topics = append(topics, m.Topic)
		}
		byTopic[m.Topic] = append(byTopic[m.Topic], i)
	}
	var lanes []*plane
	for _, topic := range topics {
		idx := byTopic[topic]
		parts, err := pr.partition(topic, msgs, idx)
		if err != nil {
			for _, i := range idx {
				failed[i] = err
			}
			continue
		}
		byPart := map[int32]*plane{}
		var order []*plane
		for j, i := range idx {
			l := byPart[parts[j]]
			if l == nil {
				l = &plane{tp: tp{topic, parts[j]}}
				byPart[parts[j]] = l
				order = append(order, l)
			}
			l.add(i, recordSize(msgs[i]), pr.conf.Producer.MaxMessageBytes)
		}
		pr.mu.Lock()
		for _, l := range order {
			if l.st = pr.parts[l.tp]; l.st == nil {
				l.st = &partState{lock: make(chan struct{}, 1)}
				pr.parts[l.tp] = l.st
			}
		}
		pr.mu.Unlock()
		lanes = append(lanes, order...)
	}
	return lanes
}

// partition returns the partition of each message msgs[idx[j]] of topic,
// chosen as sarama's producer does: the configured partitioner (by default
// a hash of the key) over all the topic's partitions, or over the writable
// ones for a partitioner that does not require consistency.
func (pr *Producer) partition(topic string, msgs []Record, idx []int) ([]int32, error) {
	// A topic not in the client's metadata yet is asked for (and created,
	// with Metadata.AllowAutoTopicCreation and a broker that allows it);
	// sarama confirms a missing one Metadata.Retry.Max times, and then it
	// fails at once, permanently.
	all, err := pr.client.Partitions(topic)
	if err != nil {
		return nil, classifyTopic(topic, err)
	}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	p := pr.partitioners[topic]
	if p == nil {
		p = pr.conf.Producer.Partitioner(topic)
		pr.partitioners[topic] = p
	}
	choices := all
	if !p.RequiresConsistency() {
		if w, err := pr.client.WritablePartitions(topic); err == nil && len(w) > 0 {
			choices = w
		}
	}
	out := make([]int32, len(idx))
	for j, i := range idx {
		pm := &sarama.ProducerMessage{Topic: topic, Key: sarama.ByteEncoder(msgs[i].Key)}
		c, err := p.Partition(pm, int32(len(choices)))
		switch {
		case err != nil:
			return nil, fmt.Errorf("relay: choose a partition of topic %q: %w", topic, err)
		case c < 0 || int(c) >= len(choices):
			return nil, fmt.Errorf("relay: choose a partition of topic %q: partitioner returned %d of %d partitions", topic, c, len(choices))
		}
		out[j] = choices[c]
	}
	return out, nil
}

// classifyTopic wraps an error about a topic's metadata: permanent when
// the topic is missing, invalid or not authorized, else transient.
func classifyTopic(topic string, err error) error {
	if failure.KafkaTopicLevel(err) {
		return permanent(fmt.Errorf("relay: topic %q cannot be produced to (create it, fix its name, or grant access): %w", topic, err))
	}
	return fmt.Errorf("relay: metadata of topic %q: %w", topic, err)
}

// acquire takes the partition locks of the active lanes that are free and
// returns the lanes it holds. Holding none, it waits for the first lane's
// lock (never while holding one: calls cannot deadlock). It returns nil
// when ctx ends first.
func (pr *Producer) acquire(ctx context.Context, active []*plane) []*plane {
	var ready []*plane
	for _, l := range active {
		if !l.held {
			select {
			case l.st.lock <- struct{}{}:
				l.held = true
			default:
			}
		}
		if l.held {
			ready = append(ready, l)
		}
	}
	if len(ready) > 0 {
		return ready
	}
	select {
	case active[0].st.lock <- struct{}{}:
		active[0].held = true
	case <-ctx.Done():
		return nil
	}
	ready = append(ready, active[0])
	for _, l := range active[1:] { // likely freed together with the first
		select {
		case l.st.lock <- struct{}{}:
			l.held = true
			ready = append(ready, l)
		default:
		}
	}
	return ready
}

func (pr *Producer) release(l *plane) {
	if l.held {
		l.held = false
		<-l.st.lock
	}
}

// sent is the outcome of one ProduceRequest.
type sent struct {
	broker *sarama.Broker
	lanes  []*plane
	resp   *sarama.ProduceResponse
	err    error
}

// wave sends the head batch of every ready lane, one ProduceRequest per
// leader broker, the brokers in parallel, and resolves the outcomes. It
// returns the lanes to retry (they keep their lock).
func (pr *Producer) wave(ready []*plane, msgs []Record, lanes []*plane, failed map[int]error, stored []Result) (retry []*plane) {
	again := func(l *plane, err error) {
		l.retries++
		if l.retries > pr.conf.Producer.Retry.Max {
			err = fmt.Errorf("relay: produce to %s failed %d times: %w", l.tp, l.retries, err)
			pr.failLane(l, err, err, true, failed)
			return
		}
		retry = append(retry, l)
	}
	ready = pr.assign(ready, again)
	for _, s := range pr.send(ready, msgs, again) {
		pr.resolve(s, lanes, failed, stored, again)
	}
	return retry
}

// assign fixes the identity and sequence of the ready lanes' head batches
// sent for the first time, and returns the lanes that can be sent. When no
// identity can be had, the fresh batches go to again and are not sent.
func (pr *Producer) assign(ready []*plane, again func(*plane, error)) []*plane {
	var fresh []*plane
	for _, l := range ready {
		if !l.head().assigned {
			fresh = append(fresh, l)
		}
	}
	if len(fresh) == 0 {
		return ready
	}
	id, err := pr.identity()
	if err != nil {
		for _, l := range fresh {
			again(l, err)
		}
		// A lane whose retries ran out was failed (done, no batches).
		ready = slices.DeleteFunc(ready, func(l *plane) bool { return l.done || !l.head().assigned })
	}
	for _, l := range ready {
		b := l.head()
		if b.assigned {
			continue
		}
		if l.st.gen != id.gen {
			l.st.gen, l.st.seq = id.gen, 0
		}
		b.assigned, b.id, b.seq, b.rb = true, id, l.st.seq, nil
	}
	return ready
}

// send sends the head batches of the ready lanes, one request per leader
// broker, the brokers in parallel, and returns the requests with their
// outcomes. A lane whose leader is unknown goes to again.
func (pr *Producer) send(ready []*plane, msgs []Record, again func(*plane, error)) []*sent {
	byBroker := map[*sarama.Broker]*sent{}
	var reqs []*sent
	for _, l := range ready {
		broker, err := pr.client.Leader(l.tp.topic, l.tp.partition)
		if err != nil {
			again(l, fmt.Errorf("relay: leader of %s: %w", l.tp, err))
			continue
		}
		s := byBroker[broker]
		if s == nil {
			s = &sent{broker: broker}
			byBroker[broker] = s
			reqs = append(reqs, s)
		}
		s.lanes = append(s.lanes, l)
	}
	var wg sync.WaitGroup
	for _, s := range reqs {
		req := &sarama.ProduceRequest{
			Version:      pr.version,
			RequiredAcks: pr.conf.Producer.RequiredAcks,
			Timeout:      int32(pr.conf.Producer.Timeout / time.Millisecond),
		}
		if pr.txn != nil {
			req.TransactionalID = &pr.txn.id
		}
		for _, l := range s.lanes {
			req.AddBatch(l.tp.topic, l.tp.partition, pr.recordBatch(l.head(), msgs))
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.resp, s.err = s.broker.Produce(req)
		}()
	}
	wg.Wait()
	return reqs
}

// resolve settles each lane of one request by its broker's answer:
// acknowledged, sent again (again), sent again under a new identity,
// split, or failed.
func (pr *Producer) resolve(s *sent, lanes []*plane, failed map[int]error, stored []Result, again func(*plane, error)) {
	if s.err != nil {
		_ = s.broker.Close() // reopened by the next Leader call
		for _, l := range s.lanes {
			again(l, fmt.Errorf("relay: produce to %s via broker %s: %w", l.tp, s.broker.Addr(), s.err))
		}
		return
	}
	for _, l := range s.lanes {
		if l.done { // failed with its topic in this loop
			continue
		}
		blk := s.resp.GetBlock(l.tp.topic, l.tp.partition)
		if blk == nil {
			again(l, fmt.Errorf("relay: produce to %s via broker %s: %w", l.tp, s.broker.Addr(), sarama.ErrIncompleteResponse))
			continue
		}
		kerr := blk.Err
		err := fmt.Errorf("relay: broker %s rejected the record batch for %s: %w", s.broker.Addr(), l.tp, kerr)
		switch {
		case kerr == sarama.ErrNoError || kerr == sarama.ErrDuplicateSequenceNumber:
			pr.acked(l, blk.Offset, s.broker.Addr(), stored)
		case retriableKError(kerr):
			again(l, err)
		case (identityKError(kerr) || kerr == sarama.ErrInvalidTxnState) && pr.txn != nil:
			// Fenced, or the broker forgot the producer: a transactional
			// producer gets no new identity here (that would fence the
			// id's new owner); the transaction is doomed and the
			// producer needs Txn.Init.
			if kerr == sarama.ErrProducerFenced || kerr == sarama.ErrInvalidProducerEpoch || kerr == sarama.ErrInvalidProducerIDMapping ||
				kerr == sarama.ErrInvalidTxnState { // the transaction was aborted under it: fenced
				err = fmt.Errorf("%w: %w", ErrFenced, err)
			}
			pr.txn.doom(err)
			pr.failLane(l, err, err, true, failed)
		case identityKError(kerr):
			// The broker refused the batch (appended none of it) for
			// its producer id or sequence: it lost or expired the
			// producer's state. Every earlier batch of the partition
			// was acknowledged, so the batch is sent again under a new
			// identity.
			pr.markStale(l.head().id)
			b := l.head()
			b.assigned, b.rb = false, nil
			again(l, err)
		case failure.KafkaTopicLevel(kerr):
			pr.failTopic(l.tp.topic, lanes, err, failed)
		case recordLevelKError(kerr):
			pr.rejected(l, permanent(err), failed)
		default:
			pr.failLane(l, err, err, true, failed)
		}
	}
}

// retriableKError reports a partition error after which the same batch is
// sent again (after a metadata refresh): the broker may append it later,
// or did append it and answers the resend as a duplicate.
func retriableKError(kerr sarama.KError) bool {
	switch kerr {
	case sarama.ErrNotLeaderForPartition, sarama.ErrLeaderNotAvailable, sarama.ErrRequestTimedOut,
		sarama.ErrNotEnoughReplicas, sarama.ErrNotEnoughReplicasAfterAppend, sarama.ErrNetworkException,
		sarama.ErrUnknownTopicOrPartition, sarama.ErrKafkaStorageError, sarama.ErrFencedLeaderEpoch,
		sarama.ErrUnknownLeaderEpoch, sarama.ErrOffsetNotAvailable, sarama.ErrNotController,
		sarama.ErrThrottlingQuotaExceeded, sarama.ErrBrokerNotAvailable, sarama.ErrReplicaNotAvailable:
		return true
	}
	return false
}

// identityKError reports a partition error about the producer's id, epoch
// or sequence numbers.
func identityKError(kerr sarama.KError) bool {
	switch kerr {
	case sarama.ErrOutOfOrderSequenceNumber, sarama.ErrUnknownProducerID, sarama.ErrInvalidProducerEpoch,
		sarama.ErrProducerFenced, sarama.ErrInvalidProducerIDMapping:
		return true
	}
	return false
}

// recordLevelKError reports a partition error that rejects the record batch
// for what it holds: sending it again cannot help.
func recordLevelKError(kerr sarama.KError) bool {
	switch kerr {
	case sarama.ErrMessageSizeTooLarge, sarama.ErrMessageSetSizeTooLarge, sarama.ErrInvalidRecord,
		sarama.ErrInvalidMessage, sarama.ErrPolicyViolation, sarama.ErrInvalidRequiredAcks,
		sarama.ErrInvalidTimestamp, sarama.ErrUnsupportedForMessageFormat:
		return true
	}
	return false
}

// acked resolves a lane's head batch as appended at base offset (-1:
// unknown) by broker: the partition's sequence advances and the lock is
// released for other calls.
func (pr *Producer) acked(l *plane, base int64, broker string, stored []Result) {
	b := l.head()
	if pr.txn != nil {
		pr.txn.noteAcked(l.tp, base)
	}
	if base >= 0 {
		for j, i := range b.idx {
			stored[i] = Result{Stored: true, Partition: l.tp.partition, Offset: base + int64(j), Broker: broker}
		}
	}
	l.st.seq = nextSeq(b.seq, len(b.idx))
	l.batches, l.retries = l.batches[1:], 0
	pr.release(l)
	l.done = len(l.batches) == 0
}

// rejected resolves a lane's head batch that the broker refused for its
// content: it appended none of it, so no sequence number was used. A batch
// of several records is split in two and the halves are sent in turn, down
// to the one record the broker refuses, so the records before it are
// delivered and the error names that record alone. A single record fails
// with err; the later messages of the partition are not sent (Held),
// so none of them overtakes it.
func (pr *Producer) rejected(l *plane, err error, failed map[int]error) {
	b := l.head()
	if n := len(b.idx); n > 1 {
		first := &pbatch{idx: b.idx[: n/2 : n/2]}
		second := &pbatch{idx: b.idx[n/2:]}
		l.batches = append([]*pbatch{first, second}, l.batches[1:]...)
		l.retries = 0
		pr.release(l)
		return
	}
	pr.failLane(l, err, held(fmt.Errorf("relay: not sent after an earlier record of %s was rejected", l.tp)), false, failed)
}

// failLane fails the lane's messages: its head batch with headErr, the
// later ones with restErr. unknown says the head batch may have been
// appended: its identity is then replaced before the next batch.
func (pr *Producer) failLane(l *plane, headErr, restErr error, unknown bool, failed map[int]error) {
	if l.done {
		return
	}
	for j, b := range l.batches {
		err := restErr
		if j == 0 {
			err = headErr
		}
		for _, i := range b.idx {
			failed[i] = err
		}
	}
	if unknown && len(l.batches) > 0 && l.head().assigned {
		pr.markStale(l.head().id)
	}
	l.batches, l.done = nil, true
	pr.release(l)
}

// failTopic fails every message of topic in the call, permanently.
func (pr *Producer) failTopic(topic string, lanes []*plane, err error, failed map[int]error) {
	err = classifyTopic(topic, err)
	for _, l := range lanes {
		if l.tp.topic == topic {
			pr.failLane(l, err, err, false, failed)
		}
	}
}

func (pr *Producer) markStale(id identity) {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.id.gen == id.gen {
		pr.stale = true
		if pr.txn != nil {
			// A batch's outcome is unknown: the transaction cannot commit,
			// and the partition's sequence is unknown until Txn.Init.
			pr.txn.doom(fmt.Errorf("relay: a record batch's outcome is unknown"))
			pr.txn.inited = false
		}
	}
}

// identity returns the producer identity for new batches, fetching a new
// one first if there is none or the current one is stale.
func (pr *Producer) identity() (identity, error) {
	current := func() (identity, bool) {
		pr.mu.Lock()
		defer pr.mu.Unlock()
		return pr.id, pr.id.gen != 0 && !pr.stale
	}
	if id, ok := current(); ok {
		return id, nil
	}
	if pr.txn != nil {
		return identity{}, fmt.Errorf("relay: transactional id %q: %w", pr.txn.id, ErrFenced)
	}
	pr.idMu.Lock()
	defer pr.idMu.Unlock()
	id, ok := current()
	if ok {
		return id, nil
	}
	pid, epoch, err := pr.initProducerID()
	if err != nil {
		return identity{}, err
	}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	pr.id, pr.stale = identity{pid: pid, epoch: epoch, gen: id.gen + 1}, false
	return pr.id, nil
}

// initProducerID asks a broker for a new idempotent producer id. Unlike
// sarama's Client.InitProducerID it does not drop the broker from the
// client's list when it is down: the caller retries.
func (pr *Producer) initProducerID() (int64, int16, error) {
	broker := pr.client.LeastLoadedBroker()
	if broker == nil {
		return 0, 0, fmt.Errorf("relay: get a producer id: %w", sarama.ErrOutOfBrokers)
	}
	req := &sarama.InitProducerIDRequest{Version: initProducerIDVersion(pr.conf.Version), ProducerID: -1, ProducerEpoch: -1}
	resp, err := broker.InitProducerID(req)
	if err != nil {
		_ = broker.Close()
		return 0, 0, fmt.Errorf("relay: get a producer id from broker %s: %w", broker.Addr(), err)
	}
	if resp.Err != sarama.ErrNoError {
		return 0, 0, fmt.Errorf("relay: get a producer id from broker %s: %w", broker.Addr(), resp.Err)
	}
	return resp.ProducerID, resp.ProducerEpoch, nil
}

// initProducerIDVersion is the InitProducerIdRequest version sarama's own
// producer uses with a broker version.
func initProducerIDVersion(v sarama.KafkaVersion) int16 {
	switch {
	case v.IsAtLeast(sarama.V2_7_0_0):
		return 4
	case v.IsAtLeast(sarama.V2_5_0_0):
		return 3
	case v.IsAtLeast(sarama.V2_4_0_0):
		return 2
	case v.IsAtLeast(sarama.V2_0_0_0):
		return 1
	}
	return 0
}

// recordBatch returns b's record batch, building it at its first send.
func (pr *Producer) recordBatch(b *pbatch, msgs []Record) *sarama.RecordBatch {
	if b.rb != nil {
		return b.rb
	}
	now := time.Now().Truncate(time.Millisecond)
	rb := &sarama.RecordBatch{
		Version:          2,
		Codec:            pr.conf.Producer.Compression,
		CompressionLevel: pr.conf.Producer.CompressionLevel,
		FirstTimestamp:   now,
		MaxTimestamp:     now,
		ProducerID:       b.id.pid,
		ProducerEpoch:    b.id.epoch,
		FirstSequence:    b.seq,
		IsTransactional:  pr.txn != nil,
		LastOffsetDelta:  int32(len(b.idx) - 1),
		Records:          make([]*sarama.Record, len(b.idx)),
	}
	for j, i := range b.idx {
		m := msgs[i]
		r := &sarama.Record{Key: m.Key, Value: m.Value, OffsetDelta: int64(j)}
		if len(m.Headers) > 0 {
			r.Headers = make([]*sarama.RecordHeader, len(m.Headers))
			for k, h := range m.Headers {
				r.Headers[k] = &sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value}
			}
		}
		rb.Records[j] = r
	}
	b.rb = rb
	return rb
}

// nextSeq is the sequence number after n records from seq; Kafka's wrap
// around after MaxInt32.
func nextSeq(seq int32, n int) int32 {
	return int32((int64(seq) + int64(n)) % (math.MaxInt32 + 1))
}

// backoff is the wait before the next attempt, after attempts failures.
func (pr *Producer) backoff(attempts int) time.Duration {
	r := pr.conf.Producer.Retry
	if r.BackoffFunc != nil {
		return r.BackoffFunc(attempts, r.Max)
	}
	return r.Backoff
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
