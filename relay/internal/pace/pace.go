// Package pace is the relay's memory of failures that must not hold the
// whole relay back: the events that failed, and their keys, held out of
// the claims until their retry is due (Pacer), and the topics the broker
// said do not exist, whose next events are parked without being sent
// (MissingTopics). Both live in one relay's memory.
package pace

import (
	"errors"
	"iter"
	"sync"
	"time"

	"github.com/IBM/sarama"

	"github.com/fxoutbox/outbox/relay/internal/failure"
)

// Pacer spaces the retries of events that failed while the relay as a whole
// works (a permanent failure charged to the event, or a transient one of a
// single event in a batch that otherwise went through). A failed event, and
// with it its key, is held out of the claims until its retry is due:
// PollInterval after its first failure, doubling with each further one up to
// MaxBackoff, with jitter. The other keys flow meanwhile, and the relay never
// backs off for one event. The pacing lives in the memory of each relay: a
// restarted relay, or another replica, tries such an event once at once.
type Pacer struct {
	mu   sync.Mutex
	rows map[int64]*pace // by row id
}

type pace struct {
	key   string
	fails int
	due   time.Time
}

// maxPaced bounds the pacer's memory. Past it, expired entries are dropped
// first, then the entry due soonest.
const maxPaced = 10000

// Held returns the keys whose failed event is not due yet, and forgets
// entries long past due (their event was published or parked by another
// relay, or requeued).
func (p *Pacer) Held(now time.Time, forgetAfter time.Duration) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.rows) == 0 {
		return nil
	}
	seen := map[string]bool{}
	var keys []string
	for id, e := range p.rows {
		switch {
		case now.Before(e.due):
			if !seen[e.key] {
				seen[e.key] = true
				keys = append(keys, e.key)
			}
		case now.Sub(e.due) > forgetAfter:
			delete(p.rows, id)
		}
	}
	return keys
}

// Failed records a failure of row id (of key) and returns how many times in
// a row it failed; delay gives the wait after that many failures.
func (p *Pacer) Failed(id int64, key string, now time.Time, delay func(fails int) time.Duration) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.rows == nil {
		p.rows = map[int64]*pace{}
	}
	e := p.rows[id]
	if e == nil {
		if len(p.rows) >= maxPaced {
			p.evict(now)
		}
		e = &pace{key: key}
		p.rows[id] = e
	}
	e.fails++
	e.due = now.Add(delay(e.fails))
	return e.fails
}

func (p *Pacer) evict(now time.Time) {
	var soonest int64
	var first *pace
	for id, e := range p.rows {
		if !now.Before(e.due) {
			delete(p.rows, id)
			continue
		}
		if first == nil || e.due.Before(first.due) {
			soonest, first = id, e
		}
	}
	if len(p.rows) >= maxPaced && first != nil {
		delete(p.rows, soonest)
	}
}

// Done forgets rows that were published or parked.
func (p *Pacer) Done(ids ...int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, id := range ids {
		delete(p.rows, id)
	}
}

// MissingTopics remembers for a few seconds the topics the broker said do
// not exist, so that their next events are parked without being sent: the
// producer waits for a missing topic's metadata (Metadata.Retry.Max times)
// on every send, and that wait holds up the whole batch. A requeued event
// is sent whatever is remembered (see publish), and an event of the topic
// published makes the relay forget it: a topic created and its events
// requeued are sent at once.
type MissingTopics struct {
	mu     sync.Mutex
	topics map[string]missingTopic
}

type missingTopic struct {
	at  time.Time
	err error
}

// missingFor is how long a topic reported missing is not asked for again.
const missingFor = 5 * time.Second

// Set remembers err, the broker's report that topic is missing. A refusal
// of the memory itself (failure.NotSent) is not a report: the memory is
// neither renewed nor nested by it.
func (m *MissingTopics) Set(topic string, err error, now time.Time) {
	if errors.As(err, new(*failure.NotSent)) {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.topics == nil {
		m.topics = map[string]missingTopic{}
	}
	m.topics[topic] = missingTopic{at: now, err: err}
}

// Get returns the refusal (a failure.NotSent) of an event of a topic reported
// missing less than missingFor ago, or nil.
func (m *MissingTopics) Get(topic string, now time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.topics[topic]
	if !ok {
		return nil
	}
	if now.Sub(t.at) >= missingFor {
		delete(m.topics, topic)
		return nil
	}
	return &failure.NotSent{Ago: now.Sub(t.at), Err: t.err}
}

// Report remembers err, a send's outcome for an event of topic, when it
// says the topic does not exist (sarama.ErrUnknownTopicOrPartition) and the
// topic is not remembered already: the memory runs from the first report.
func (m *MissingTopics) Report(topic string, err error, now time.Time) {
	if err != nil && errors.Is(err, sarama.ErrUnknownTopicOrPartition) && m.Get(topic, now) == nil {
		m.Set(topic, err, now)
	}
}

// Forget drops topics: events of them were published, they exist now. It
// ranges over topics only when some topic is remembered.
func (m *MissingTopics) Forget(topics iter.Seq[string]) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.topics) == 0 {
		return
	}
	for t := range topics {
		delete(m.topics, t)
	}
}
