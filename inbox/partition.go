package inbox

import (
	"context"
	"hash/fnv"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
)

// partition processes one claimed partition: records go to Concurrency
// workers by key hash (so one key's records are applied in offset order,
// one at a time), and the offset is marked up to the lowest record that is
// not yet done (applied, skipped as a duplicate, ignored or parked).
type partition struct {
	c     *Consumer
	s     sarama.ConsumerGroupSession
	claim sarama.ConsumerGroupClaim
	lag   *atomic.Int64

	stop     chan struct{} // closed when the claim ends: start nothing new
	stopOnce sync.Once
	workers  []chan *item
	wg       sync.WaitGroup

	mu     sync.Mutex
	window []*item // dispatched, in offset order, not yet marked
}

type item struct {
	msg  *sarama.ConsumerMessage
	done bool
}

func newPartition(c *Consumer, s sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) *partition {
	key := claim.Topic() + "/" + strconv.Itoa(int(claim.Partition()))
	lag, _ := c.lag.LoadOrStore(key, new(atomic.Int64))
	return &partition{c: c, s: s, claim: claim, lag: lag.(*atomic.Int64), stop: make(chan struct{})}
}

// run is ConsumeClaim: it returns once the claim ends (session over, the
// partition revoked or the consumer stopping) and every worker returned.
func (p *partition) run() error {
	// Work is cancelled (its transaction rolled back) DrainTimeout after the
	// claim ends, or at once when Stop runs out of time.
	work, cancel := context.WithCancel(p.c.hard)
	defer cancel()
	defer p.c.lag.CompareAndDelete(p.claim.Topic()+"/"+strconv.Itoa(int(p.claim.Partition())), p.lag)
	p.workers = make([]chan *item, p.c.cfg.Concurrency)
	for i := range p.workers {
		ch := make(chan *item, 64)
		p.workers[i] = ch
		p.wg.Go(func() { p.work(work, ch) })
	}
	defer func() {
		p.stopOnce.Do(func() { close(p.stop) })
		for _, ch := range p.workers {
			close(ch)
		}
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
			it := &item{msg: msg}
			p.mu.Lock()
			p.window = append(p.window, it)
			p.lag.Store(max(0, p.claim.HighWaterMarkOffset()-p.window[0].msg.Offset))
			p.mu.Unlock()
			select {
			case p.workers[p.worker(msg)] <- it:
			case <-ctx.Done():
				return nil
			}
		case <-ctx.Done():
			return nil
		}
	}
}

// worker picks the worker of a record's key; records without a key have no
// order to keep and spread by offset.
func (p *partition) worker(m *sarama.ConsumerMessage) int {
	n := uint32(len(p.workers))
	if m.Key == nil {
		return int(uint32(m.Offset) % n)
	}
	h := fnv.New32a()
	h.Write(m.Key)
	return int(h.Sum32() % n)
}

func (p *partition) work(ctx context.Context, ch <-chan *item) {
	for it := range ch {
		select {
		case <-p.stop:
			continue // left to the next owner
		default:
		}
		if p.c.process(ctx, it.msg, p.stop) {
			p.complete(it)
		}
	}
}

// complete marks it done and the offset up to the lowest record not done.
func (p *partition) complete(it *item) {
	p.mu.Lock()
	defer p.mu.Unlock()
	it.done = true
	var last *item
	for len(p.window) > 0 && p.window[0].done {
		last = p.window[0]
		p.window[0] = nil
		p.window = p.window[1:]
	}
	if last == nil {
		return
	}
	p.s.MarkMessage(last.msg, "")
	p.lag.Store(max(0, p.claim.HighWaterMarkOffset()-last.msg.Offset-1))
}
