// Package parklog keeps the logs of parked events readable when many events
// fail at once: the first events parked for a cause are logged one by one,
// the rest are counted and logged as one summary line per cause at an
// interval, and a last summary is written when the owner stops. No parked
// event goes unmentioned: the counts of the summaries are exact. The relay
// and the inbox share it.
package parklog

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"time"
)

// Cause groups parked events: the topic and the stable reason stored with
// them.
type Cause struct {
	Topic  string
	Reason string
}

// Summary writes the summary line of n more events parked for c (c is the
// zero Cause for the events of causes past the tracking limit).
type Summary func(log *slog.Logger, c Cause, n int64)

// Log counts parked events per cause. The zero Log is not usable: use New.
type Log struct {
	logger   *slog.Logger
	first    int
	interval time.Duration
	summary  Summary

	mu     sync.Mutex
	causes map[Cause]*count
	other  int64 // events of causes past maxCauses, not logged yet
	last   time.Time
}

type count struct {
	logged  int   // logged one by one since the cause was first seen
	pending int64 // counted since the last summary
	seen    bool  // an event was parked since the last summary
}

// First is how many events (relay) or records (inbox) parked for one cause
// are logged one by one; the further ones of the cause are counted and
// logged as one summary line per cause every Interval, and once more when
// the relay or consumer stops. The relay and every inbox use these two.
const (
	First    = 10
	Interval = 10 * time.Second
)

// maxCauses bounds the causes tracked at a time; the events of further
// causes are counted together and summarized as "other causes".
const maxCauses = 100

// New returns a Log that lets the first events of each cause be logged one
// by one and summarizes the rest every interval with summary.
func New(logger *slog.Logger, first int, interval time.Duration, summary Summary) *Log {
	return &Log{logger: logger, first: first, interval: interval, summary: summary, causes: map[Cause]*count{}, last: time.Now()}
}

// Parked counts one event parked for c and reports whether the caller
// should log it on its own line; when it returns false the event is
// counted in the cause's next summary. A summary that is due (Run not
// running, as with a relay driven by RunOnce) is written here.
func (l *Log) Parked(c Cause) bool {
	l.mu.Lock()
	e := l.causes[c]
	if e == nil && len(l.causes) >= maxCauses {
		l.other++
	} else {
		if e == nil {
			e = &count{}
			l.causes[c] = e
		}
		e.seen = true
		if e.logged < l.first {
			e.logged++
			l.mu.Unlock()
			return true
		}
		e.pending++
	}
	due := time.Since(l.last) >= l.interval
	l.mu.Unlock()
	if due {
		l.Flush()
	}
	return false
}

// Flush writes a summary line for each cause with events counted since its
// last summary, and forgets the causes that had no event parked since the
// last Flush: their next events are logged one by one again.
func (l *Log) Flush() {
	type line struct {
		c Cause
		n int64
	}
	l.mu.Lock()
	var lines []line
	for c, e := range l.causes {
		if !e.seen {
			delete(l.causes, c)
			continue
		}
		e.seen = false
		if e.pending > 0 {
			lines = append(lines, line{c, e.pending})
			e.pending = 0
		}
	}
	if l.other > 0 {
		lines = append(lines, line{Cause{}, l.other})
		l.other = 0
	}
	l.last = time.Now()
	l.mu.Unlock()
	for _, x := range lines {
		l.summary(l.logger, x.c, x.n)
	}
}

// Run writes the due summaries every interval until ctx ends. The owner
// runs it in a goroutine it waits for, and calls Flush once more after its
// last event was parked.
func (l *Log) Run(ctx context.Context) {
	t := time.NewTicker(l.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			l.Flush()
		}
	}
}

// Thousands writes n with commas: 1,998.
func Thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := n < 0
	if neg {
		s = s[1:]
	}
	var b []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			b = append(b, ',')
		}
		b = append(b, s[i])
	}
	if neg {
		return "-" + string(b)
	}
	return string(b)
}

// More writes "1 more event" or "1,998 more events" for noun "event".
func More(n int64, noun string) string {
	if n == 1 {
		return "1 more " + noun
	}
	return Thousands(n) + " more " + noun + "s"
}
