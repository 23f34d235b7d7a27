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
//	Metadata.Retry.Max       = 3
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

	mu       sync.Mutex
	producer sarama.AsyncProducer
	closed   bool
	wg       sync.WaitGroup
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

// batch collects the results of one Publish call.
type batch struct {
	failed  map[int]error
	mu      sync.Mutex
	pending atomic.Int64
	done    chan struct{}
}

type ticket struct {
	b   *batch
	idx int
}

func (t ticket) resolve(err error) {
	if err != nil {
		t.b.mu.Lock()
		t.b.failed[t.idx] = err
		t.b.mu.Unlock()
	}
	if t.b.pending.Add(-1) == 0 {
		close(t.b.done)
	}
}

// Publish sends msgs and waits for every acknowledgement or ctx. Messages
// with the same topic and key keep their order (same partition, idempotent
// producer with one request in flight).
func (p *SaramaPublisher) Publish(ctx context.Context, msgs []Message) error {
	if len(msgs) == 0 {
		return nil
	}
	prod, err := p.connect()
	if err != nil {
		return err
	}
	b := &batch{failed: map[int]error{}, done: make(chan struct{})}
	b.pending.Store(int64(len(msgs)))
	for i, m := range msgs {
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
		case <-ctx.Done():
			// Messages already queued resolve into this abandoned batch.
			return fmt.Errorf("relay: publish: %w", ctx.Err())
		}
	}
	select {
	case <-b.done:
	case <-ctx.Done():
		return fmt.Errorf("relay: publish: waiting for acknowledgements: %w", ctx.Err())
	}
	if len(b.failed) > 0 {
		return &BatchError{Failed: b.failed}
	}
	return nil
}

func (p *SaramaPublisher) connect() (sarama.AsyncProducer, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ErrPublisherClosed
	}
	if p.producer != nil {
		return p.producer, nil
	}
	prod, err := sarama.NewAsyncProducer(p.addrs, p.cfg)
	if err != nil {
		return nil, fmt.Errorf("relay: connect to Kafka %v: %w", p.addrs, err)
	}
	p.producer = prod
	p.wg.Add(2)
	go func() {
		defer p.wg.Done()
		for m := range prod.Successes() {
			m.Metadata.(ticket).resolve(nil)
		}
	}()
	go func() {
		defer p.wg.Done()
		for e := range prod.Errors() {
			e.Msg.Metadata.(ticket).resolve(classifySarama(e.Err))
		}
	}()
	return prod, nil
}

// Close flushes and closes the producer and waits for its goroutines. Call
// it after the relay has stopped; Publish fails with ErrPublisherClosed after.
func (p *SaramaPublisher) Close() error {
	p.mu.Lock()
	prod := p.producer
	p.closed, p.producer = true, nil
	p.mu.Unlock()
	if prod == nil {
		return nil
	}
	// AsyncClose flushes, then closes Successes and Errors, which ends the
	// two goroutines that resolve acknowledgements.
	prod.AsyncClose()
	p.wg.Wait()
	return nil
}
