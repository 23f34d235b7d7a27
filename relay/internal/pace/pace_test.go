package pace

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/fxoutbox/outbox/relay/internal/failure"
)

// A failed event holds its key out until its retry is due, each further
// failure waits longer, and an event published (Done) or long past due is
// forgotten.
func TestPacerHoldsAKeyUntilItsRetry(t *testing.T) {
	var p Pacer
	now := time.Unix(1000, 0)
	delay := func(fails int) time.Duration { return time.Duration(fails) * time.Second }
	if n := p.Failed(1, "k", now, delay); n != 1 {
		t.Fatalf("first failure counted %d", n)
	}
	if got := p.Held(now.Add(500*time.Millisecond), time.Minute); !slices.Equal(got, []string{"k"}) {
		t.Fatalf("held before the retry: %v, want [k]", got)
	}
	if got := p.Held(now.Add(time.Second), time.Minute); len(got) != 0 {
		t.Fatalf("held once the retry is due: %v", got)
	}
	if n := p.Failed(1, "k", now.Add(time.Second), delay); n != 2 {
		t.Fatalf("second failure counted %d", n)
	}
	if got := p.Held(now.Add(2500*time.Millisecond), time.Minute); !slices.Equal(got, []string{"k"}) {
		t.Fatalf("held after the second failure (2 s): %v, want [k]", got)
	}
	p.Failed(2, "other", now, delay)
	p.Done(1)
	if got := p.Held(now.Add(500*time.Millisecond), time.Minute); !slices.Equal(got, []string{"other"}) {
		t.Fatalf("held after the first was published: %v, want [other]", got)
	}
	p.Held(now.Add(time.Hour), time.Minute) // long past due: forgotten
	if n := p.Failed(2, "other", now.Add(time.Hour), delay); n != 1 {
		t.Fatalf("a failure after the entry was forgotten counted %d, want 1", n)
	}
}

// Past maxPaced entries the pacer drops the one due soonest, so its memory
// stays bounded.
func TestPacerIsBounded(t *testing.T) {
	var p Pacer
	now := time.Unix(1000, 0)
	for id := range int64(maxPaced + 10) {
		p.Failed(id, "k", now, func(int) time.Duration { return time.Duration(id+1) * time.Millisecond })
	}
	if len(p.rows) != maxPaced {
		t.Fatalf("%d entries, want %d", len(p.rows), maxPaced)
	}
	if _, ok := p.rows[0]; ok {
		t.Fatal("the entry due soonest was kept")
	}
}

// A topic reported missing refuses its events for missingFor, without
// nesting its own refusals, and is forgotten once an event of it went out.
func TestMissingTopics(t *testing.T) {
	var m MissingTopics
	now := time.Unix(1000, 0)
	missing := errors.New("unknown topic")
	m.Set("a", missing, now)
	refused := m.Get("a", now.Add(time.Second))
	var ns *failure.NotSent
	if !errors.As(refused, &ns) || !errors.Is(refused, missing) {
		t.Fatalf("refusal %v: want a failure.NotSent wrapping the report", refused)
	}
	m.Set("a", refused, now.Add(4*time.Second)) // a refusal is not a report
	if m.Get("a", now.Add(missingFor)) != nil {
		t.Fatalf("still refused %v after the report", missingFor)
	}
	// Report remembers only a missing topic, from its first report.
	m.Report("c", errors.New("broker down"), now)
	if m.Get("c", now) != nil {
		t.Fatal("an error that does not say the topic is missing was remembered")
	}
	unknown := fmt.Errorf("send: %w", sarama.ErrUnknownTopicOrPartition)
	m.Report("c", unknown, now)
	m.Report("c", unknown, now.Add(4*time.Second)) // not renewed
	if m.Get("c", now.Add(missingFor)) != nil {
		t.Fatal("a second report renewed the memory")
	}
	m.Set("b", missing, now)
	m.Forget(slices.Values([]string{"b"}))
	if err := m.Get("b", now); err != nil {
		t.Fatalf("a topic published to is still refused: %v", err)
	}
}
