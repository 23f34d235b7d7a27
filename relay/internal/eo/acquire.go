package eo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"

	"github.com/fxoutbox/outbox/internal/backoff"
	"github.com/fxoutbox/outbox/relay/internal/cursor"
	"github.com/fxoutbox/outbox/relay/internal/kafkaproducer"
)

// Apply writes to the table what the last committed records of lanes a
// worker takes over say: their transactions' event ids (marks progress
// marks them published) and, under cursor progress, their positions.
// It commits before Acquire returns, synchronously.
type Apply func(ctx context.Context, ids []uuid.UUID, positions []cursor.Lane) error

// Acquire makes w the owner of the lanes it does not own. The lanes' last
// committed progress records are read back read_committed (one backward
// scan of the progress topic for all of them); every other transactional
// id they name is initialised (concurrently), which fences its producer and
// decides its open transaction, and their records are read again; what
// they say is applied to the table (apply). Then one Kafka transaction
// commits a record naming w the owner of each lane it took, before any
// event of those lanes is published.
func (p *Pool) Acquire(ctx context.Context, client sarama.Client, w *Worker, lanes map[int32]bool, apply Apply) error {
	var take []int32
	for lane := range lanes {
		if !w.Owned[lane] {
			take = append(take, lane)
		}
	}
	if len(take) == 0 {
		return nil
	}
	slices.Sort(take)
	recs, pending, err := p.Last(ctx, client, take)
	if err != nil {
		return err
	}
	if ownPending(pending, take, w.Txn.ID()) {
		if recs, pending, err = p.awaitOwnMarker(ctx, client, w, take); err != nil {
			return err
		}
	}
	// The owners to fence: the one of each lane's last committed record,
	// and those of records still undecided after it (a worker that took
	// the lane and had not finished), other than this worker.
	others := map[string][]int32{}
	for _, lane := range take {
		owners := ownersOf(pending[lane])
		if r, ok := recs[lane]; ok {
			owners = append(owners, r.Owner)
		}
		for _, o := range owners {
			if o != "" && o != w.Txn.ID() && !slices.Contains(others[o], lane) {
				others[o] = append(others[o], lane)
			}
		}
	}
	if len(others) > 0 {
		if err := p.fenceOwners(ctx, client, w, others, recs); err != nil {
			return err
		}
	}
	var ids []uuid.UUID
	var register []int32
	var positions []cursor.Lane
	for _, lane := range take {
		r := recs[lane]
		ids = append(ids, r.EventIDs...)
		if r.Owner != w.Txn.ID() {
			register = append(register, lane)
		}
		if r.Position != nil && r.Position.Lane == lane {
			positions = append(positions, *r.Position)
		}
	}
	if err := apply(ctx, ids, positions); err != nil {
		return err
	}
	if len(register) > 0 {
		if err := p.register(ctx, w, register); err != nil {
			return err
		}
	}
	for _, lane := range take {
		w.Owned[lane] = true
	}
	return nil
}

// fenceOwners fences the owners of the lanes others lists (concurrently),
// reads the fenced lanes back, and replaces recs' records of them with
// what the fenced owners committed last.
func (p *Pool) fenceOwners(ctx context.Context, client sarama.Client, w *Worker, others map[string][]int32, recs map[int32]Progress) error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		// the fenced owners' producers made here (not this relay's idle
		// workers, which settle their own transactions)
		made = map[string]*kafkaproducer.Txn{}
	)
	for owner, lanes := range others {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Fence the owner: its open transaction is aborted, one it was
			// committing completes. An idle worker of this relay is
			// initialised itself, which also settles what its transactions
			// left without a marker (kafkaproducer.Settle).
			fence := func() error {
				txn := kafkaproducer.NewTxn(client, p.cfg.Sarama, owner, p.cfg.Timeout)
				mu.Lock()
				made[owner] = txn
				mu.Unlock()
				return txn.Init(ctx)
			}
			if ow := p.takeIdle(owner); ow != nil {
				fence = func() error {
					defer p.Release(ow)
					clear(ow.Owned)
					return ow.Txn.Init(ctx)
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
		p.cfg.Logger.Debug("outbox relay: exactly-once: took lanes over, fencing their owner", "lanes", lanes, "owner", owner, "transactional_id", w.Txn.ID())
	}
	var fenced []int32
	defer func() { p.cfg.Fenced(ctx, FenceFencing, len(fenced)) }()
	for _, lanes := range others {
		for _, lane := range lanes {
			if !slices.Contains(fenced, lane) {
				fenced = append(fenced, lane)
			}
		}
	}
	again, still, err := p.Last(ctx, client, fenced) // the fenced owners' last word
	if err != nil {
		return err
	}
	if settled, err := p.settleFenced(ctx, made, still); err != nil {
		return err
	} else if settled {
		if again, still, err = p.Last(ctx, client, fenced); err != nil {
			return err
		}
	}
	for _, lane := range fenced {
		if len(still[lane]) > 0 {
			return fmt.Errorf("relay: exactly-once: lane %d has records of transactions still undecided after their owners %v were fenced; the lane is taken again later", lane, ownersOf(still[lane]))
		}
		if r, ok := again[lane]; ok {
			recs[lane] = r
		} else {
			delete(recs, lane)
		}
	}
	return nil
}

// register commits, in one Kafka transaction of w, a record naming w the
// owner of each of lanes.
func (p *Pool) register(ctx context.Context, w *Worker, lanes []int32) error {
	out := make([]kafkaproducer.Record, len(lanes))
	for i, lane := range lanes {
		rec, err := p.Record(lane, w.Txn.ID(), nil, nil, nil)
		if err != nil {
			return err
		}
		out[i] = rec
	}
	err := FirstResult(w.Txn.Produce(ctx, out))
	outcome := TxnAborted
	if err == nil {
		if err = w.Txn.Commit(ctx); err == nil {
			outcome = TxnCommitted
		} else if !errors.Is(err, kafkaproducer.ErrTxnAborted) {
			outcome = TxnUnknown
		}
	} else {
		_ = w.Txn.Abort(ctx)
	}
	p.cfg.TxnEnded(ctx, outcome, time.Time{}, err)
	if err != nil {
		w.Txn.Invalidate()
		return fmt.Errorf("relay: exactly-once: take over lanes %v: %w", lanes, err)
	}
	return nil
}

// settleFenced settles what the transactions of owners fenced here left
// without a marker, when their progress records are still undecided after
// the fence: a broker that restarted skipped the markers of partitions it
// found without a leader (kafkaproducer.Settle), and an owner of another
// relay (or of this relay before a restart) cannot settle them itself. The
// progress topic and the topics the undecided records name are settled
// (their records of the owner's producer aborted). It reports whether it
// settled any.
func (p *Pool) settleFenced(ctx context.Context, made map[string]*kafkaproducer.Txn, still map[int32][]Progress) (bool, error) {
	topics := map[string]map[string]bool{} // owner -> topics
	for _, rs := range still {
		for _, r := range rs {
			if made[r.Owner] == nil {
				continue
			}
			if topics[r.Owner] == nil {
				topics[r.Owner] = map[string]bool{p.cfg.Topic: true}
			}
			for _, t := range r.Topics {
				topics[r.Owner][t] = true
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
func ownersOf(records []Progress) []string {
	out := make([]string, len(records))
	for i, r := range records {
		out[i] = r.Owner
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
func (p *Pool) awaitOwnMarker(ctx context.Context, client sarama.Client, w *Worker, lanes []int32) (map[int32]Progress, map[int32][]Progress, error) {
	p.cfg.Logger.Debug("outbox relay: exactly-once: waiting for this worker's last transaction's marker before reading its lanes back",
		"lanes", lanes, "transactional_id", w.Txn.ID())
	bo := backoff.Backoff{Initial: time.Millisecond, Max: 100 * time.Millisecond}
	for deadline := time.Now().Add(p.cfg.Timeout); ; {
		if !backoff.Sleep(ctx, bo.Fail(), nil, nil) {
			return nil, nil, ctx.Err()
		}
		recs, pending, err := p.Last(ctx, client, lanes)
		if err != nil || !ownPending(pending, lanes, w.Txn.ID()) {
			return recs, pending, err
		}
		if time.Now().After(deadline) {
			return nil, nil, fmt.Errorf("relay: exactly-once: lanes %v hold a record of this worker's last transaction (%s) still undecided %v after it ended; the lanes are taken again later",
				lanes, w.Txn.ID(), p.cfg.Timeout)
		}
	}
}

// ownPending says whether one of lanes has a record of id still undecided.
func ownPending(pending map[int32][]Progress, lanes []int32, id string) bool {
	for _, lane := range lanes {
		if slices.Contains(ownersOf(pending[lane]), id) {
			return true
		}
	}
	return false
}

// Last reads the last committed progress record of each lane (lanes
// without one are not in recs) and its records still undecided after it.
func (p *Pool) Last(ctx context.Context, client sarama.Client, lanes []int32) (recs map[int32]Progress, pending map[int32][]Progress, err error) {
	keys := make([]string, len(lanes))
	for i, lane := range lanes {
		keys[i] = string(LaneKey(lane))
	}
	vals, err := kafkaproducer.LastCommitted(ctx, client, p.cfg.Topic, 0, keys)
	if err != nil {
		return nil, nil, err
	}
	decode := func(lane int32, val []byte) (Progress, error) {
		var r Progress
		if err := json.Unmarshal(val, &r); err != nil {
			return r, fmt.Errorf("relay: exactly-once: lane %d's progress record in %q is not the relay's: %w", lane, p.cfg.Topic, err)
		}
		return r, nil
	}
	recs, pending = map[int32]Progress{}, map[int32][]Progress{}
	for i, lane := range lanes {
		l := vals[keys[i]]
		if l.Found {
			r, err := decode(lane, l.Value)
			if err != nil {
				return nil, nil, err
			}
			recs[lane] = r
		}
		for _, v := range l.Pending {
			r, err := decode(lane, v)
			if err != nil {
				return nil, nil, err
			}
			pending[lane] = append(pending[lane], r)
		}
	}
	return recs, pending, nil
}
