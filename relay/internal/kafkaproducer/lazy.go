package kafkaproducer

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/IBM/sarama"
)

// ErrClosed is returned by Lazy's methods after Close.
var ErrClosed = errors.New("relay: publisher closed")

// Lazy is a Producer that connects on first use, so an application starts
// while the broker is down: Produce and Ping return the connection error and
// the caller retries. Unlike Producer.Produce, its calls return as soon as
// their ctx ends; Close stops the calls still running and waits for every
// goroutine.
type Lazy struct {
	addrs []string
	cfg   *sarama.Config

	mu         sync.Mutex
	brokers    string // how connection errors name addrs (SetBrokers)
	prod       *Producer
	connecting chan struct{} // closed when the connect in flight ends
	connErr    error         // the last connect's error
	closed     bool
	closing    context.Context // ended by Close: abandoned calls stop early
	stop       context.CancelFunc
	wg         sync.WaitGroup
}

// NewLazy returns a producer for the brokers at addrs with cfg, which the
// caller validated and does not change any more. It does no I/O.
func NewLazy(addrs []string, cfg *sarama.Config) *Lazy {
	closing, stop := context.WithCancel(context.Background())
	return &Lazy{addrs: addrs, brokers: fmt.Sprint(addrs), cfg: cfg, closing: closing, stop: stop}
}

// SetBrokers sets how connection errors name the brokers, e.g.
// "at KAFKA_BROKERS=host:9092" (default: the list of addresses).
func (l *Lazy) SetBrokers(text string) {
	l.mu.Lock()
	l.brokers = text
	l.mu.Unlock()
}

// Produce connects if needed, sends recs (see Producer.Produce) and returns
// their results. It returns an error instead when it cannot connect, after
// Close (ErrClosed), or when ctx ends first: the call is then abandoned,
// goes on reading recs until its broker call in flight ends (within
// sarama's timeouts), and until then later calls wait for its partitions.
// recs must therefore not be changed after an error.
func (l *Lazy) Produce(ctx context.Context, recs []Record) ([]Result, error) {
	prod, err := l.connect(ctx)
	if err != nil {
		return nil, err
	}
	done := make(chan []Result, 1)
	if !l.goTracked(func() {
		pctx, cancel := context.WithCancel(ctx)
		defer cancel()
		defer context.AfterFunc(l.closing, cancel)()
		done <- prod.Produce(pctx, recs)
	}) {
		return nil, ErrClosed
	}
	select {
	case res := <-done:
		return res, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("relay: publish: %w", ctx.Err())
	}
}

// goTracked runs f in a goroutine that Close waits for, unless l is closed.
func (l *Lazy) goTracked(f func()) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		f()
	}()
	return true
}

// connect returns the producer, creating its client on first use. Creating
// it talks to the brokers without a context, so it runs in its own
// goroutine and a caller whose ctx ends stops waiting (the attempt goes on,
// bounded by Metadata.Timeout, and its client serves the next call).
func (l *Lazy) connect(ctx context.Context) (*Producer, error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, ErrClosed
	}
	if l.prod != nil {
		defer l.mu.Unlock()
		return l.prod, nil
	}
	if l.connecting == nil {
		done := make(chan struct{})
		l.connecting = done
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			client, err := sarama.NewClient(l.addrs, l.cfg)
			l.mu.Lock()
			defer l.mu.Unlock()
			switch {
			case err != nil:
				l.connErr = fmt.Errorf("relay: connect to Kafka %s: %w", l.brokers, err)
			case l.closed:
				_ = client.Close()
			default:
				l.prod, l.connErr = New(client, l.cfg), nil
			}
			l.connecting = nil
			close(done)
		}()
	}
	done, brokers := l.connecting, l.brokers
	l.mu.Unlock()
	select {
	case <-done:
	case <-ctx.Done():
		return nil, fmt.Errorf("relay: connect to Kafka %s: %w", brokers, ctx.Err())
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.prod == nil {
		if l.closed {
			return nil, ErrClosed
		}
		return nil, l.connErr
	}
	return l.prod, nil
}

// Ping checks that a broker answers: it connects if needed and asks the
// cluster for its metadata.
func (l *Lazy) Ping(ctx context.Context) error {
	prod, err := l.connect(ctx)
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	if !l.goTracked(func() { done <- prod.client.RefreshMetadata() }) { // sarama takes no context
		return ErrClosed
	}
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("relay: kafka metadata from %v: %w", l.addrs, err)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("relay: kafka metadata from %v: %w", l.addrs, ctx.Err())
	}
}

// Close stops the calls still running (calls abandoned when their ctx
// ended), waits for every goroutine, including a connect in flight (bounded
// by Metadata.Timeout) and broker calls (bounded by Net.ReadTimeout), and
// closes the client. Later calls fail with ErrClosed.
func (l *Lazy) Close() error {
	l.mu.Lock()
	prod := l.prod
	l.closed, l.prod = true, nil
	l.mu.Unlock()
	l.stop()
	l.wg.Wait()
	if prod != nil {
		_ = prod.Close()
	}
	return nil
}
