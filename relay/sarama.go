package relay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"

	"github.com/fxoutbox/outbox"
)

// DefaultSaramaConfig returns a producer configuration that keeps the
// outbox's guarantees: an idempotent producer (no duplicates from its own
// retries, order kept per partition) that waits for all in-sync replicas:
//
//	Producer.Idempotent      = true
//	Producer.RequiredAcks    = sarama.WaitForAll
//	Net.MaxOpenRequests      = 1
//	Producer.Retry.Max       = 10, Producer.Retry.Backoff = 100ms
//	Producer.Timeout         = 10s (the broker's wait for replicas)
//	Net.{Dial,Read,Write}Timeout = 10s
//	Metadata.Retry.Max       = 3, Metadata.Timeout = 15s (bounds connecting)
//	Version                  = sarama.V2_8_0_0 (any broker 2.8 or newer, Kafka 4.x included)
//	ClientID                 = "fxoutbox"
//
// Change what you need (TLS, SASL, Version, compression) and pass it to
// NewSaramaPublisher, which rejects changes that break the guarantees.
func DefaultSaramaConfig() *sarama.Config {
	c := sarama.NewConfig()
	c.ClientID = "fxoutbox"
	c.Version = sarama.V2_8_0_0
	c.Producer.Idempotent = true
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Net.MaxOpenRequests = 1
	c.Producer.Retry.Max = 10
	c.Producer.Retry.Backoff = 100 * time.Millisecond
	c.Producer.Timeout = 10 * time.Second
	c.Net.DialTimeout = 10 * time.Second
	c.Net.ReadTimeout = 10 * time.Second
	c.Net.WriteTimeout = 10 * time.Second
	c.Metadata.Retry.Max = 3
	c.Metadata.Timeout = 15 * time.Second
	c.Producer.Return.Successes = true
	c.Producer.Return.Errors = true
	return c
}

// ValidateSaramaConfig reports a producer setting that would break the
// outbox's guarantees, or that sarama itself rejects.
func ValidateSaramaConfig(c *sarama.Config) error {
	bad := func(field, reason string) error {
		return &outbox.ConfigError{Field: "sarama." + field, Reason: reason}
	}
	switch {
	case c == nil:
		return bad("Config", "is nil: start from relay.DefaultSaramaConfig()")
	case !c.Producer.Idempotent:
		return bad("Producer.Idempotent", "is false: the relay needs an idempotent producer so its retries neither duplicate nor reorder events")
	case c.Producer.RequiredAcks != sarama.WaitForAll:
		return bad("Producer.RequiredAcks", fmt.Sprintf("is %d: must be sarama.WaitForAll (acks=all), or an acknowledged event can still be lost", c.Producer.RequiredAcks))
	case c.Net.MaxOpenRequests != 1:
		return bad("Net.MaxOpenRequests", fmt.Sprintf("is %d: must be 1 for sarama's idempotent producer", c.Net.MaxOpenRequests))
	case c.Producer.Retry.Max < 1:
		return bad("Producer.Retry.Max", "must be at least 1 for the idempotent producer")
	case !c.Version.IsAtLeast(sarama.V0_11_0_0):
		return bad("Version", fmt.Sprintf("is %s: the idempotent producer needs Kafka 0.11 or newer", c.Version))
	case c.Producer.Timeout <= 0 || c.Net.ReadTimeout <= 0 || c.Net.WriteTimeout <= 0 || c.Net.DialTimeout <= 0:
		return bad("timeouts", "Producer.Timeout and Net.{Dial,Read,Write}Timeout must be positive: sarama takes no context, they bound a hung broker")
	}
	if err := c.Validate(); err != nil {
		return &outbox.ConfigError{Field: "sarama.Config", Reason: err.Error(), Err: err}
	}
	return nil
}

// SaramaPublisher publishes through a sarama AsyncProducer. It connects
// lazily, on the first Publish, so an application starts while the broker is
// down (writers do not need Kafka); Publish returns the connection error and
// the relay retries with backoff. Close it after the relay has stopped.
type SaramaPublisher struct {
	addrs []string
	cfg   *sarama.Config

	mu         sync.Mutex
	producer   sarama.AsyncProducer
	client     sarama.Client   // the producer's; closed after it
	drained    <-chan struct{} // closed when the producer's results are all resolved
	connecting chan struct{}   // closed when the connect in flight ends
	connErr    error           // the last connect's error
	stale      bool            // producer had a transient failure: replace it
	careful    atomic.Bool     // a recent batch failed: one message per key in flight
	closed     bool
	wg         sync.WaitGroup
}

var _ Publisher = (*SaramaPublisher)(nil)

// ErrPublisherClosed is returned by Publish after Close.
var ErrPublisherClosed = errors.New("relay: publisher closed")

// NewSaramaPublisher validates cfg (nil means DefaultSaramaConfig()) and
// returns a publisher for the brokers at addrs. It works on a copy of cfg;
// Producer.Return.Successes and Producer.Return.Errors are turned on. It does
// no I/O.
func NewSaramaPublisher(addrs []string, cfg *sarama.Config) (*SaramaPublisher, error) {
	if len(addrs) == 0 {
		return nil, &outbox.ConfigError{Field: "Kafka brokers", Reason: "none given: set at least one host:port (e.g. KAFKA_BROKERS=localhost:9092)"}
	}
	if cfg == nil {
		cfg = DefaultSaramaConfig()
	}
	c := *cfg
	c.Producer.Return.Successes = true
	c.Producer.Return.Errors = true
	if err := ValidateSaramaConfig(&c); err != nil {
		return nil, err
	}
	return &SaramaPublisher{addrs: addrs, cfg: &c}, nil
}

// batch collects the results of one Publish call. Every message handed to
// the producer resolves exactly once (Return.Successes and Return.Errors
// are on), and results has room for all of them, so resolving never blocks,
// even for a batch whose Publish already returned.
type batch struct {
	results chan result
}

type result struct {
	idx int
	err error
}

type ticket struct {
	b   *batch
	idx int
}

func (t ticket) resolve(err error) { t.b.results <- result{t.idx, err} }

// pkey identifies the messages whose order Publish keeps.
type pkey struct{ topic, key string }

// Publish sends msgs and waits for every acknowledgement or ctx.
//
// Normally every message goes to the producer at once, which batches them
// per partition; the idempotent producer keeps each partition's order
// through its own retries. But sarama can fail one message and deliver the
// next of the same partition: it fails each message that finds no leader,
// e.g. while its circuit breaker is open after a broker crash, and goes on
// with the next once the broker is back. A later event of a key would then
// be in Kafka before the failed one, which the relay sends again after it.
// So after a failed batch, until a batch succeeds whole, Publish is careful:
// it hands the producer one message per key at a time, the next when the
// previous one was acknowledged, and after a failure the rest of that key's
// messages are not sent and fail with ErrHeld. Messages of different keys
// are still in flight together.
//
// After a transient failure, or when ctx ends, the producer is replaced
// before the next batch: a new one starts without open circuit breakers and
// with a new idempotent producer id, instead of recovering partition by
// partition.
func (p *SaramaPublisher) Publish(ctx context.Context, msgs []Message) error {
	if len(msgs) == 0 {
		return nil
	}
	prod, err := p.connect(ctx)
	if err != nil {
		return err
	}
	b := &batch{results: make(chan result, len(msgs))}
	// Careful (after a failure, until a batch succeeds whole): one message
	// per key in flight, so a failure cannot be followed by a later message
	// of its key getting through. Otherwise everything goes at once.
	careful := p.careful.Load()
	var (
		keys   []pkey         // careful: each message's key
		queued map[pkey][]int // careful: each key's messages not sent yet, in order
		firsts = make([]int, 0, len(msgs))
	)
	if careful {
		keys, queued = make([]pkey, len(msgs)), map[pkey][]int{}
		for i, m := range msgs {
			k := pkey{m.Topic, string(m.Key)}
			keys[i] = k
			if rest, ok := queued[k]; ok {
				queued[k] = append(rest, i)
			} else {
				queued[k] = nil
				firsts = append(firsts, i)
			}
		}
	} else {
		for i := range msgs {
			firsts = append(firsts, i)
		}
	}
	send := func(i int) error {
		m := msgs[i]
		pm := &sarama.ProducerMessage{
			Topic:    m.Topic,
			Key:      sarama.ByteEncoder(m.Key),
			Value:    sarama.ByteEncoder(m.Value),
			Headers:  make([]sarama.RecordHeader, len(m.Headers)),
			Metadata: ticket{b, i},
		}
		for j, h := range m.Headers {
			pm.Headers[j] = sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value}
		}
		select {
		case prod.Input() <- pm:
			return nil
		case <-ctx.Done():
			// Messages already queued resolve into this abandoned batch.
			p.replace(prod)
			return fmt.Errorf("relay: publish: %w", ctx.Err())
		}
	}
	for _, i := range firsts {
		if err := send(i); err != nil {
			return err
		}
	}
	failed := map[int]error{}
	for open := len(msgs); open > 0; {
		select {
		case r := <-b.results:
			open--
			if r.err != nil {
				failed[r.idx] = r.err
				if !IsPermanent(r.err) {
					p.replace(prod)
				}
			}
			if !careful {
				continue
			}
			k := keys[r.idx]
			if r.err != nil {
				for _, j := range queued[k] {
					failed[j] = ErrHeld
					open--
				}
				queued[k] = nil
				continue
			}
			if rest := queued[k]; len(rest) > 0 {
				queued[k] = rest[1:]
				if err := send(rest[0]); err != nil {
					return err
				}
			}
		case <-ctx.Done():
			p.replace(prod)
			return fmt.Errorf("relay: publish: waiting for acknowledgements: %w", ctx.Err())
		}
	}
	p.careful.Store(len(failed) > 0)
	if len(failed) > 0 {
		return &BatchError{Failed: failed}
	}
	return nil
}

// replace marks prod to be closed and replaced by a new producer at the
// next connect, unless it was already.
func (p *SaramaPublisher) replace(prod sarama.AsyncProducer) {
	p.careful.Store(true)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.producer == prod {
		p.stale = true
	}
}

// connect returns the producer, creating it on first use. Creating it talks
// to the brokers without a context, so it runs in its own goroutine and a
// caller whose ctx ends stops waiting (the attempt goes on, bounded by
// Metadata.Timeout, and its producer serves the next call).
func (p *SaramaPublisher) connect(ctx context.Context) (sarama.AsyncProducer, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, ErrPublisherClosed
	}
	if p.producer != nil && p.stale {
		// AsyncClose delivers or fails what the old producer still holds
		// (messages of abandoned batches), then ends its two goroutines;
		// its client is closed after them.
		prod, client, drained := p.producer, p.client, p.drained
		p.producer, p.client, p.drained, p.stale = nil, nil, nil, false
		prod.AsyncClose()
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			<-drained
			_ = client.Close()
		}()
	}
	if p.producer != nil {
		defer p.mu.Unlock()
		return p.producer, nil
	}
	if p.connecting == nil {
		done := make(chan struct{})
		p.connecting = done
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			client, err := sarama.NewClient(p.addrs, p.cfg)
			var prod sarama.AsyncProducer
			if err == nil {
				if prod, err = sarama.NewAsyncProducerFromClient(client); err != nil {
					_ = client.Close()
				}
			}
			p.mu.Lock()
			defer p.mu.Unlock()
			switch {
			case err != nil:
				p.connErr = fmt.Errorf("relay: connect to Kafka %v: %w", p.addrs, err)
			case p.closed:
				_ = prod.Close()
				_ = client.Close()
			default:
				p.producer, p.client, p.connErr = prod, client, nil
				p.drained = p.dispatch(prod)
			}
			p.connecting = nil
			close(done)
		}()
	}
	done := p.connecting
	p.mu.Unlock()
	select {
	case <-done:
	case <-ctx.Done():
		return nil, fmt.Errorf("relay: connect to Kafka %v: %w", p.addrs, ctx.Err())
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.producer == nil {
		if p.closed {
			return nil, ErrPublisherClosed
		}
		return nil, p.connErr
	}
	return p.producer, nil
}

// Ping checks that a broker answers: it connects if needed and asks the
// cluster for its metadata. It implements Pinger for Relay.Health.
func (p *SaramaPublisher) Ping(ctx context.Context) error {
	if _, err := p.connect(ctx); err != nil {
		return err
	}
	p.mu.Lock()
	client := p.client
	p.mu.Unlock()
	if client == nil {
		return ErrPublisherClosed
	}
	done := make(chan error, 1)
	p.wg.Add(1)
	go func() { // sarama takes no context
		defer p.wg.Done()
		done <- client.RefreshMetadata()
	}()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("relay: kafka metadata from %v: %w", p.addrs, err)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("relay: kafka metadata from %v: %w", p.addrs, ctx.Err())
	}
}

// dispatch starts the two goroutines that resolve acknowledgements. The
// returned channel is closed when both have ended (the producer is closed).
func (p *SaramaPublisher) dispatch(prod sarama.AsyncProducer) <-chan struct{} {
	var both sync.WaitGroup
	both.Add(2)
	p.wg.Add(3)
	go func() {
		defer p.wg.Done()
		defer both.Done()
		for m := range prod.Successes() {
			m.Metadata.(ticket).resolve(nil)
		}
	}()
	go func() {
		defer p.wg.Done()
		defer both.Done()
		for e := range prod.Errors() {
			e.Msg.Metadata.(ticket).resolve(classifySarama(e.Err))
		}
	}()
	drained := make(chan struct{})
	go func() {
		defer p.wg.Done()
		both.Wait()
		close(drained)
	}()
	return drained
}

// Close flushes and closes the producer and waits for its goroutines,
// including a connect in flight (bounded by Metadata.Timeout). Call it after
// the relay has stopped; Publish fails with ErrPublisherClosed after.
func (p *SaramaPublisher) Close() error {
	p.mu.Lock()
	prod, client := p.producer, p.client
	p.closed, p.producer, p.client = true, nil, nil
	p.mu.Unlock()
	if prod != nil {
		// AsyncClose flushes, then closes Successes and Errors, which ends
		// the two goroutines that resolve acknowledgements.
		prod.AsyncClose()
	}
	p.wg.Wait()
	if client != nil {
		_ = client.Close()
	}
	return nil
}
