package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/relay/internal/kafkaproducer"
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
//	Producer.Partitioner     = sarama.NewMurmur2Partitioner (Murmur2: a key goes to the
//	                           partition Apache Kafka's Java client and kafkajs choose)
//
// Change what you need (TLS, SASL, Version, Producer.Compression,
// Producer.MaxMessageBytes, Producer.Partitioner, e.g. sarama.NewHashPartitioner (FNV1a) to
// keep the placement of fxoutbox before Murmur2 became its default) and
// pass it to NewSaramaPublisher, which rejects changes that break the
// guarantees. (sarama.NewConfig's own partitioner is FNV1a's.)
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
	c.Producer.Partitioner = sarama.NewMurmur2Partitioner
	return c
}

// validateSaramaConfig reports a producer setting that would break the
// outbox's guarantees, or that sarama itself rejects (NewSaramaPublisher's
// check).
func validateSaramaConfig(c *sarama.Config) error {
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

// SaramaPublisher publishes through sarama's client, as an idempotent
// producer of its own that keeps the order of first deliveries per
// partition through broker faults (see Publish). It connects lazily, on the
// first Publish, so an application starts while the broker is down (writers
// do not need Kafka); Publish returns the connection error and the relay
// retries with backoff. Close it after the relay has stopped.
type SaramaPublisher struct {
	addrs []string
	cfg   *sarama.Config
	prod  *kafkaproducer.Lazy

	mu      sync.Mutex
	setting string // where addrs come from (NameBrokers), for connection errors
}

var (
	_ Publisher        = (*SaramaPublisher)(nil)
	_ clientIdentifier = (*SaramaPublisher)(nil)
)

// ErrPublisherClosed is returned by Publish after Close.
var ErrPublisherClosed = errors.New("relay: publisher closed")

// closed returns ErrPublisherClosed for the producer's ErrClosed, err
// otherwise.
func closed(err error) error {
	if err == kafkaproducer.ErrClosed {
		return ErrPublisherClosed
	}
	return err
}

// NewSaramaPublisher validates cfg (nil means DefaultSaramaConfig()) and
// returns a publisher for the brokers at addrs. It works on a copy of cfg.
// It does no I/O.
func NewSaramaPublisher(addrs []string, cfg *sarama.Config) (*SaramaPublisher, error) {
	if len(addrs) == 0 {
		return nil, &outbox.ConfigError{Field: "Kafka brokers", Reason: "none given: set at least one host:port (e.g. KAFKA_BROKERS=localhost:9092)"}
	}
	if cfg == nil {
		cfg = DefaultSaramaConfig()
	}
	c := *cfg
	if err := validateSaramaConfig(&c); err != nil {
		return nil, err
	}
	return &SaramaPublisher{addrs: slices.Clone(addrs), cfg: &c, prod: kafkaproducer.NewLazy(addrs, &c)}, nil
}

// NameBrokers names the setting the publisher's broker addresses come
// from, e.g. "KAFKA_BROKERS" or "AUDIT_KAFKA_BROKERS": the errors of a
// failed connection (logged by the relay, returned by Health) then read
// "connect to Kafka at KAFKA_BROKERS=host:9092,...: ...", saying what to
// check. Call it before the relay starts; fxoutbox does.
func (p *SaramaPublisher) NameBrokers(setting string) {
	p.mu.Lock()
	p.setting = setting
	p.mu.Unlock()
	p.prod.SetBrokers(brokersText(setting, p.addrs))
}

// brokersText is how connection errors name the brokers: as a setting and
// its value when the setting is known, else as the list.
func brokersText(setting string, addrs []string) string {
	if setting == "" {
		return fmt.Sprint(addrs)
	}
	return "at " + setting + "=" + strings.Join(addrs, ",")
}

// Publish sends msgs and waits for every acknowledgement or ctx.
//
// Each message goes to the partition the configuration's
// Producer.Partitioner chooses, as with sarama's own producer: with
// DefaultSaramaConfig the murmur2 hash of the key, as Apache Kafka's Java
// client does (see Partitioner). Each
// partition's messages are cut, in order, into record batches of at most
// Producer.MaxMessageBytes, and sent as an idempotent producer: one
// ProduceRequest per leader broker carries the next batch of every
// partition it leads. For each partition at most one batch is in flight,
// also across concurrent calls, and the next is sent only after the
// previous one was acknowledged. A broker appends or rejects a batch
// whole, so a later message of a partition never reaches Kafka ahead of an
// earlier one that failed: per-key order of first deliveries holds through
// broker crashes, leader changes and rejected records.
//
// Failures, per partition (other partitions go on):
//   - Retriable broker errors (no leader, leader moved, timeout, not enough
//     replicas, connection lost): the same batch is sent again with the
//     same sequence numbers, after a metadata refresh and
//     Producer.Retry.Backoff, up to Producer.Retry.Max times within ctx. If
//     it still fails, it and every later message of the partition fail with
//     that (transient) error, and a new producer id is fetched before the
//     next batch, because whether the broker appended it is unknown.
//   - A record batch rejected for its content (too large, invalid record,
//     policy): it is split and the halves sent in turn, so the records
//     before the bad one are delivered and only the bad one fails, with an
//     outbox.PermanentError; the later messages of its partition are not sent and
//     fail with ErrHeld.
//   - A topic that is missing (with Metadata.AllowAutoTopicCreation off, or
//     not created), invalid or not authorized: every message of the topic
//     fails with an outbox.PermanentError at once, without retries.
//   - Connection, TLS and authentication errors are transient.
//
// Each acknowledged message gets Stored, Partition, Offset and Broker.
//
// Errors wrap their cause (sarama.KError, *net.OpError, TLS and SASL
// errors) for errors.Is and errors.As. A call abandoned when ctx ends
// returns at once; its broker call in flight ends within sarama's timeouts
// (Net.ReadTimeout, Metadata.Timeout), and until then later calls wait for
// its partitions.
func (p *SaramaPublisher) Publish(ctx context.Context, msgs []Message) error {
	if len(msgs) == 0 {
		return nil
	}
	// A call abandoned when ctx ends goes on reading its records after
	// Publish returned, when msgs is the caller's again: the records are a
	// copy (sharing keys, values and header values, which the relay never
	// changes).
	res, err := p.prod.Produce(ctx, records(msgs))
	if err != nil {
		return closed(err)
	}
	return results(msgs, res)
}

// results turns the producer's results of msgs into Publish's: Stored
// and where in msgs, and a *BatchError of the failures.
func results(msgs []Message, res []kafkaproducer.Result) error {
	var failed map[int]error
	for i, r := range res {
		switch {
		case r.Err == nil:
			if r.Stored {
				msgs[i].Stored, msgs[i].Partition, msgs[i].Offset, msgs[i].Broker = true, r.Partition, r.Offset, r.Broker
			}
			continue
		case failed == nil:
			failed = map[int]error{}
		}
		switch {
		case r.Held:
			failed[i] = fmt.Errorf("%w: %w", r.Err, ErrHeld)
		case r.Permanent:
			failed[i] = outbox.Permanent(r.Err)
		default:
			failed[i] = r.Err
		}
	}
	if len(failed) > 0 {
		return &BatchError{Failed: failed}
	}
	return nil
}

// records gives the producer msgs' records. Their headers are copied into
// one slice for the whole call (names and values are shared, not copied).
func records(msgs []Message) []kafkaproducer.Record {
	n := 0
	for _, m := range msgs {
		n += len(m.Headers)
	}
	hs := make([]kafkaproducer.Header, n)
	recs := make([]kafkaproducer.Record, len(msgs))
	for i, m := range msgs {
		h := hs[:len(m.Headers):len(m.Headers)]
		hs = hs[len(m.Headers):]
		for j, x := range m.Headers {
			h[j] = kafkaproducer.Header{Key: x.Key, Value: x.Value}
		}
		recs[i] = kafkaproducer.Record{Topic: m.Topic, Key: m.Key, Value: m.Value, Headers: h}
	}
	return recs
}

// clientID returns the sarama configuration's ClientID (Kafka client.id)
// for the relay's publish spans.
func (p *SaramaPublisher) clientID() string { return p.cfg.ClientID }

// Ping checks that a broker answers: it connects if needed and asks the
// cluster for its metadata. It implements Pinger for Relay.Health.
func (p *SaramaPublisher) Ping(ctx context.Context) error { return closed(p.prod.Ping(ctx)) }

// Close stops the publishes still running (calls abandoned when their ctx
// ended), waits for every goroutine, including a connect in flight (bounded
// by Metadata.Timeout) and broker calls (bounded by Net.ReadTimeout), and
// closes the client. Call it after the relay has stopped; Publish fails
// with ErrPublisherClosed after.
func (p *SaramaPublisher) Close() error { return p.prod.Close() }
