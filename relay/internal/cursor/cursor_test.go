package cursor

import (
	"slices"
	"testing"
)

func open(base, top int64) Lane {
	return Lane{Lane: 3, Done: "100:100:", Upto: "120:120:", Base: base, Floor: base + 1, Top: top}
}

func TestAdvanceClosesAQuietLaneAtTop(t *testing.T) {
	// A lane with no row in its window: the window is delivered up to Top,
	// so the next read starts there, not at the lane's last row.
	got := Advance(open(40, 900), nil, false, 0)
	if got.Open() || got.Done != "120:120:" || got.Base != 900 || got.Start() != 900 {
		t.Fatalf("quiet lane after its window: %+v (start %d), want closed at 120:120: with base 900", got, got.Start())
	}
}

func TestAdvanceClosesAtTopOrPastIt(t *testing.T) {
	got := Advance(open(40, 900), []Outcome{{ID: 850, Resolved: true}, {ID: 880, Resolved: true}}, false, 880)
	if got.Open() || got.Base != 900 {
		t.Fatalf("after rows below Top: %+v, want closed with base 900", got)
	}
	// The base never moves back: one past Top stays.
	got = Advance(open(950, 900), []Outcome{{ID: 860, Resolved: true}}, false, 860)
	if got.Base != 950 {
		t.Fatalf("base past Top: %+v, want base 950 kept", got)
	}
}

func TestAdvanceKeepsTheWindowOpen(t *testing.T) {
	// Read to its limit below Top: the window stays open at the last id
	// read, and the base does not move to Top.
	got := Advance(open(40, 900), []Outcome{{ID: 500, Resolved: true}}, true, 600)
	if !got.Open() || got.Pos != 600 || got.Base != 600 {
		t.Fatalf("full read below Top: %+v, want open at pos 600 with base 600", got)
	}
	// A row that waits stops the lane before it; what was resolved past
	// it is skipped, and the base does not move to Top.
	got = Advance(open(40, 900), []Outcome{{ID: 500, Resolved: true}, {ID: 510}, {ID: 520, Resolved: true}}, false, 520)
	if !got.Open() || got.Pos != 509 || !slices.Equal(got.Skip, []int64{520}) || got.Base != 520 {
		t.Fatalf("a waiting row: %+v, want open at pos 509, skip [520], base 520", got)
	}
}
