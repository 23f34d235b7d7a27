package main

import (
	"fmt"
	"io"
	"time"
)

// progress draws one line on a terminal: verb, done/total, percent, rate
// and ETA, redrawn at most every 200ms and finished with a newline.
type progress struct {
	w        io.Writer
	verb     string
	total    int
	start    time.Time
	last     time.Time
	drawn    bool
	now      func() time.Time
	interval time.Duration
	// tty redraws one line in place; otherwise each update is a line of
	// its own, at most every second (for logs).
	tty bool
}

func newProgress(w io.Writer, verb string, total int, tty bool) *progress {
	p := &progress{w: w, verb: verb, total: total, now: time.Now, interval: 200 * time.Millisecond, tty: tty}
	if !tty {
		p.interval = time.Second
	}
	p.start = p.now()
	return p
}

// update is the admin.BulkOptions.Progress callback.
func (p *progress) update(done int) {
	now := p.now()
	if p.drawn && now.Sub(p.last) < p.interval && done < p.total {
		return
	}
	p.last, p.drawn = now, true
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[K%s", p.line(done, now))
	} else {
		fmt.Fprintln(p.w, p.line(done, now))
	}
}

func (p *progress) line(done int, now time.Time) string {
	el := now.Sub(p.start)
	total := max(p.total, done)
	s := fmt.Sprintf("%s %s/%s", p.verb, thousands(done), thousands(total))
	if total > 0 {
		s += fmt.Sprintf(" %3d%%", done*100/total)
	}
	if el > 0 && done > 0 {
		rate := float64(done) / el.Seconds()
		s += fmt.Sprintf("  %s/s", thousands(int(rate)))
		if done < total {
			s += "  ETA " + age(time.Duration(float64(total-done)/rate*float64(time.Second)))
		} else {
			s += "  in " + age(el)
		}
	}
	return s
}

// finish ends the line, if one was drawn.
func (p *progress) finish() {
	if p.drawn && p.tty {
		fmt.Fprintln(p.w)
	}
}
