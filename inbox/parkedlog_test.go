package inbox_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/inbox"
	"github.com/fxoutbox/outbox/internal/parklog"
	"github.com/fxoutbox/outbox/unitofwork"
)

// logRecorder is a slog.Handler that keeps every record.
type logRecorder struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r.Clone())
	return nil
}
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecorder) WithGroup(string) slog.Handler      { return l }

// 2,000 records the handler refuses for one cause (a Permanent error with
// the same text): each is parked with that text as its last_error, without
// the inbox's wrapping, and the log has a bounded number of lines whose
// counts add up to 2,000: the first records of the cause one by one, then
// summaries, the last one when the consumer stops.
func TestMassParkingBoundedLogs(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4)
	e.batch = 50
	const n = 2000
	e.produce(events(n, 40)...)
	logs := &logRecorder{}
	cfg := e.config(group(), func(context.Context, unitofwork.Tx, *inbox.Message) error {
		return outbox.Permanent(errors.New("the account is closed"))
	})
	cfg.Logger = slog.New(logs)
	c, err := inbox.New(e.pool, e.uow, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	parked := func() (count, reasons int) {
		if err := e.pool.QueryRow(context.Background(), "SELECT count(*), count(DISTINCT last_error) FROM "+e.inbox.Schema+".outbox_inbox_parked").Scan(&count, &reasons); err != nil {
			t.Fatal(err)
		}
		return count, reasons
	}
	eventually(t, 120*time.Second, "every record parked", func() bool { n2, _ := parked(); return n2 == n })
	stop(t, c)
	if _, reasons := parked(); reasons != 1 {
		t.Errorf("%d distinct last_error values, want 1", reasons)
	}
	list, err := c.List(context.Background(), inbox.ListOptions{Limit: 1})
	if err != nil || len(list) != 1 || list[0].LastError != "the account is closed" || list[0].ErrorType != inbox.ErrorTypePermanent {
		t.Errorf("parked record: %+v, %v; want last_error %q", list, err, "the account is closed")
	}

	var one, summaries int
	var summed int64
	logs.mu.Lock()
	recs := append([]slog.Record(nil), logs.recs...)
	logs.mu.Unlock()
	for _, rec := range recs {
		switch {
		case strings.HasPrefix(rec.Message, "outbox inbox: record parked"):
			one++
		case strings.HasPrefix(rec.Message, "outbox inbox: parked "):
			summaries++
			rec.Attrs(func(a slog.Attr) bool {
				if a.Key == "records" {
					summed += a.Value.Int64()
				}
				return true
			})
			if !strings.Contains(rec.Message, " of consumer c from topic "+e.topic+": the account is closed; see outboxctl inbox parked list --consumer c") {
				t.Errorf("summary line %q", rec.Message)
			}
		}
	}
	t.Logf("%d log lines: %d parked records one by one, %d summaries of %d more", len(recs), one, summaries, summed)
	if int64(one)+summed != n {
		t.Errorf("the log accounts for %d parked records (%d one by one, %d in summaries), want %d", int64(one)+summed, one, summed, n)
	}
	// A cause with nothing parked for a whole summary interval is
	// forgotten, and its next records are logged one by one again: on a
	// loaded machine parking can pause that long, so the count one by one
	// is at least First, not exactly First.
	if one < parklog.First || summaries < 1 || len(recs) > 60 {
		t.Errorf("%d lines of parked records, %d summaries, %d lines in all; want at least %d, at least 1, at most 60", one, summaries, len(recs), parklog.First)
		for _, rec := range recs[:min(len(recs), 50)] {
			t.Log(rec.Level, rec.Message)
		}
	}
}
