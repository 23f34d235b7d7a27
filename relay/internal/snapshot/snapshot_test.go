package snapshot

import "testing"

// What a pg_snapshot sees, and the snapshot that sees what all the lanes'
// snapshots see (the stream handover's skip rule).
func TestSnapshots(t *testing.T) {
	s, err := Parse("100:110:104,102")
	if err != nil {
		t.Fatal(err)
	}
	for x, want := range map[uint64]bool{99: true, 100: true, 102: false, 103: true, 104: false, 109: true, 110: false, 200: false} {
		if got := s.Visible(x); got != want {
			t.Errorf("100:110:102,104 sees %d: %v, want %v", x, got, want)
		}
	}
	for _, bad := range []string{"", "1:2", "a:2:", "1:b:", "1:2:x"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q): no error", bad)
		}
	}
	a, _ := Parse("100:110:104")
	b, _ := Parse("95:108:96,105")
	c, _ := Parse("120:120:")
	in := Intersect([]Snapshot{a, b, c})
	for x := uint64(90); x < 125; x++ {
		want := a.Visible(x) && b.Visible(x) && c.Visible(x)
		if got := in.Visible(x); got != want {
			t.Errorf("intersection sees %d: %v, want %v", x, got, want)
		}
	}
	var zero Snapshot
	if zero.Visible(1) {
		t.Error("the zero snapshot sees transaction 1")
	}
}
