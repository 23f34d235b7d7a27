package inbox

import (
	"cmp"
	"context"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
)

// partition processes one claimed partition with Concurrency workers. A
// record is ready when no earlier record of its key is in progress or
// waiting; any idle worker takes the next ready record, so the partition
// has up to Concurrency records of distinct keys in progress whatever
// their keys hash to, and one key's records are applied one at a time in
// offset order. At most window records (Concurrency x 64) are read ahead
// of the lowest record not yet done. The offset is marked up to the lowest
// record that is not yet done (applied, skipped as a duplicate, ignored or
// parked).
type partition struct {
	c     *Consumer
	s     sarama.ConsumerGroupSession
	claim sarama.ConsumerGroupClaim
	lag   *atomic.Int64

	stop     chan struct{} // closed when the claim ends: start nothing new
	stopOnce sync.Once
	ready    chan *item    // records workers may start; never more than limit
	space    chan struct{} // a record left the window
	limit    int
	wg       sync.WaitGroup
	// batchCap bounds the next batch (BatchSize at most): halved after a
	// batch failed, doubled after one that committed, so that batches too
	// large to finish within TryTimeout shrink instead of failing again.
	batchCap atomic.Int64

	mu     sync.Mutex
	window []*item            // read, in offset order, not yet marked
	keys   map[string][]*item // keys with a record in progress or ready: their records waiting behind it
}

type item struct {
	msg  *sarama.ConsumerMessage
	done bool
}

func newPartition(c *Consumer, s sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) *partition {
	key := claim.Topic() + "/" + strconv.Itoa(int(claim.Partition()))
	lag, _ := c.lag.LoadOrStore(key, new(atomic.Int64))
	limit := c.cfg.Concurrency * 64
	p := &partition{c: c, s: s, claim: claim, lag: lag.(*atomic.Int64), stop: make(chan struct{}),
		ready: make(chan *item, limit), space: make(chan struct{}, 1), limit: limit, keys: map[string][]*item{}}
	p.batchCap.Store(int64(c.cfg.BatchSize))
	return p
}

// run is ConsumeClaim: it returns once the claim ends (session over, the
// partition revoked or the consumer stopping) and every worker returned.
func (p *partition) run() error {
	// Work is cancelled (its transaction rolled back) DrainTimeout after the
	// claim ends, or at once when Stop runs out of time.
	work, cancel := context.WithCancel(p.c.hard)
	defer cancel()
	defer p.c.lag.CompareAndDelete(p.claim.Topic()+"/"+strconv.Itoa(int(p.claim.Partition())), p.lag)
	for range p.c.cfg.Concurrency {
		p.wg.Go(func() { p.work(work) })
	}
	defer func() {
		p.stopOnce.Do(func() { close(p.stop) })
		done := make(chan struct{})
		go func() { p.wg.Wait(); close(done) }()
		t := time.NewTimer(p.c.cfg.DrainTimeout)
		defer t.Stop()
		select {
		case <-done:
		case <-t.C:
			p.c.cfg.Logger.Warn("outbox inbox: records still in progress after DrainTimeout; rolling them back for the partition's next owner",
				"consumer", p.c.cfg.Name, "topic", p.claim.Topic(), "partition", p.claim.Partition())
			cancel()
			<-done
		case <-p.c.hard.Done():
			<-done
		}
	}()
	ctx := p.s.Context()
	for {
		select {
		case msg, ok := <-p.claim.Messages():
			if !ok {
				return nil
			}
			if !p.dispatch(ctx, &item{msg: msg}) {
				return nil
			}
		case <-ctx.Done():
			return nil
		}
	}
}

// dispatch adds it to the window once there is room, and makes it ready
// unless a record of its key is in progress or waiting; false if ctx ended
// first. Records without a key have no order to keep: always ready.
func (p *partition) dispatch(ctx context.Context, it *item) bool {
	for {
		p.mu.Lock()
		if len(p.window) < p.limit {
			break
		}
		p.mu.Unlock()
		select {
		case <-p.space:
		case <-ctx.Done():
			return false
		}
	}
	p.window = append(p.window, it)
	p.lag.Store(max(0, p.claim.HighWaterMarkOffset()-p.window[0].msg.Offset))
	ready := true
	if it.msg.Key != nil {
		k := string(it.msg.Key)
		if waiting, busy := p.keys[k]; busy {
			p.keys[k] = append(waiting, it)
			ready = false
		} else {
			p.keys[k] = nil
		}
	}
	p.mu.Unlock()
	if ready {
		p.ready <- it // never blocks: ready holds records of the window only
	}
	return true
}

func (p *partition) work(ctx context.Context) {
	for {
		select {
		case <-p.stop:
			return // what is left goes to the next owner
		case it := <-p.ready:
			select {
			case <-p.stop:
				return
			default:
			}
			if p.c.cfg.BatchSize > 1 {
				p.batch(ctx, it)
				continue
			}
			if !p.c.process(ctx, it.msg, p.stop) {
				// Abandoned: its key's later records must not pass it.
				continue
			}
			p.complete(it)
		}
	}
}

// batch takes, beside it, the records ready now (up to BatchSize in all:
// one per key, since a key's next record is ready only once the one before
// it is done) and applies them in one transaction. Nothing waits for a
// batch to fill: under light load batches are of one record, and latency
// is that of a transaction per record.
func (p *partition) batch(ctx context.Context, it *item) {
	items := []*item{it}
	limit := max(1, int(p.batchCap.Load()))
more:
	for len(items) < limit {
		select {
		case next := <-p.ready:
			items = append(items, next)
		default:
			break more
		}
	}
	slices.SortFunc(items, func(a, b *item) int { return cmp.Compare(a.msg.Offset, b.msg.Offset) })
	msgs := make([]*sarama.ConsumerMessage, len(items))
	for i, x := range items {
		msgs[i] = x.msg
	}
	failed := p.c.processBatch(ctx, msgs, p.stop, func(i int) { p.complete(items[i]) })
	switch {
	case failed:
		p.batchCap.Store(int64(max(1, len(items)/2)))
	case len(items) > 1 || limit < p.c.cfg.BatchSize:
		p.batchCap.Store(int64(min(p.c.cfg.BatchSize, 2*limit)))
	}
}

// complete marks it done, the offset up to the lowest record not done, and
// makes the next record of its key ready.
func (p *partition) complete(it *item) {
	p.mu.Lock()
	it.done = true
	var last *item
	for len(p.window) > 0 && p.window[0].done {
		last = p.window[0]
		p.window[0] = nil
		p.window = p.window[1:]
	}
	if last != nil {
		p.s.MarkMessage(last.msg, "")
		p.lag.Store(max(0, p.claim.HighWaterMarkOffset()-last.msg.Offset-1))
	}
	var next *item
	if it.msg.Key != nil {
		k := string(it.msg.Key)
		if waiting := p.keys[k]; len(waiting) > 0 {
			next = waiting[0]
			waiting[0] = nil
			p.keys[k] = waiting[1:]
		} else {
			delete(p.keys, k)
		}
	}
	p.mu.Unlock()
	if last != nil {
		select {
		case p.space <- struct{}{}:
		default:
		}
	}
	if next != nil {
		p.ready <- next // never blocks, as in dispatch
	}
}
