package feed

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/fxoutbox/outbox/relay/internal/claim"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pacing is a Host whose retries wait fails seconds; the feed's queue logic
// asks nothing else of it.
type pacing struct{ Host }

func (pacing) Backoff(fails int) time.Duration { return time.Duration(fails) * time.Second }

// heldText is a held key as a failure reports it.
func heldText(h *heldKey, now time.Time) string {
	if h == nil {
		return "not held"
	}
	return fmt.Sprintf("rows %s due in %v after %d failures", ids(h.rows), h.at.Sub(now), h.fails)
}

func ids(rows []*feedRow) string {
	out := make([]int64, len(rows))
	for i, x := range rows {
		out[i] = x.ID
	}
	return fmt.Sprint(out)
}

// A key that fails waits with its later rows, in order, for its paced
// retry, while the other keys go on; at the retry its rows go first, and a
// second failure waits longer.
func TestHeldKeyKeepsItsOrder(t *testing.T) {
	now := time.Now()
	f := &feed{cfg: Config{MaxBatchSize: 3}, host: pacing{}, held: map[string]*heldKey{}, lastFails: map[string]int{}}
	tx := &feedTx{}
	for i, k := range []string{"a", "b", "a", "c", "a", "b"} {
		f.queue = append(f.queue, &feedRow{Row: claim.Row{ID: int64(i + 1), Key: k}, tx: tx})
		tx.left++
	}
	batch := f.next(now)
	if got := ids(batch); got != "[1 2 3]" {
		t.Fatalf("first batch %s, want [1 2 3]", got)
	}
	// Key a fails at its first row: row 3 (held behind it) and row 5 (still
	// queued) wait with it; b goes on.
	boom := errors.New("broker said no")
	f.requeue(feedResult{rows: batch, errs: []error{boom, nil, boom}}, map[string]int{"a": 0}, now)
	f.resolve(batch[1])
	if h := f.held["a"]; h == nil || ids(h.rows) != "[1 3 5]" || !h.at.Equal(now.Add(time.Second)) || h.fails != 1 {
		t.Fatalf("held key a: %s, want rows [1 3 5] due in 1s after 1 failures", heldText(h, now))
	}
	if got := ids(f.queue); got != "[4 6]" {
		t.Fatalf("queue %s, want [4 6] (a's rows out of it)", got)
	}
	if got := ids(f.next(now)); got != "[4 6]" {
		t.Fatalf("batch before a's retry %s, want [4 6]", got)
	}
	later := now.Add(time.Second)
	batch = f.next(later)
	if got := ids(batch); got != "[1 3 5]" {
		t.Fatalf("batch at a's retry %s, want [1 3 5]", got)
	}
	if f.held["a"] != nil {
		t.Fatal("key a still held after its rows were taken")
	}
	// It fails again: the retry waits two seconds now.
	f.requeue(feedResult{rows: batch, errs: []error{boom, boom, boom}}, map[string]int{"a": 0}, later)
	if h := f.held["a"]; h == nil || ids(h.rows) != "[1 3 5]" || !h.at.Equal(later.Add(2*time.Second)) || h.fails != 2 {
		t.Fatalf("held key a after a second failure: %s, want rows [1 3 5] due in 2s after 2 failures", heldText(h, later))
	}
	// A row of the key resolved (acknowledged) resets its pacing.
	f.resolve(batch[0])
	if _, ok := f.lastFails["a"]; ok {
		t.Fatal("key a's failures are remembered after one of its rows was resolved")
	}
	if tx.left != 4 || f.resolved != 2 {
		t.Fatalf("transaction left %d rows, %d resolved; want 4, 2", tx.left, f.resolved)
	}
}

// A batch holds at most MaxBatchSize rows, due held keys first; rows of a
// held key past a full batch stay held, due, for the next one.
func TestNextFillsFromDueKeysFirst(t *testing.T) {
	now := time.Now()
	f := &feed{cfg: Config{MaxBatchSize: 2}, host: pacing{}, held: map[string]*heldKey{}, lastFails: map[string]int{}}
	tx := &feedTx{}
	row := func(id int64, k string) *feedRow { return &feedRow{Row: claim.Row{ID: id, Key: k}, tx: tx} }
	f.held["k"] = &heldKey{rows: []*feedRow{row(1, "k"), row(2, "k"), row(3, "k")}, at: now}
	f.queue = []*feedRow{row(4, "q")}
	if got := ids(f.next(now)); got != "[1 2]" {
		t.Fatalf("first batch %s, want [1 2]", got)
	}
	if h := f.held["k"]; h == nil || ids(h.rows) != "[3]" {
		t.Fatalf("held key k: %s, want row 3 left", heldText(h, now))
	}
	if got := ids(f.next(now)); got != "[3 4]" {
		t.Fatalf("second batch %s, want [3 4]", got)
	}
}
