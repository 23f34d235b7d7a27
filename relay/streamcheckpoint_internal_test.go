package relay

import "testing"

// The stream's snapshots: what a pg_snapshot sees, and the snapshot that
// sees what all the lanes' snapshots see (the handover's skip rule).
func TestStreamSnapshots(t *testing.T) {
	s, err := parseSnapshot("100:110:104,102")
	if err != nil {
		t.Fatal(err)
	}
	for x, want := range map[uint64]bool{99: true, 100: true, 102: false, 103: true, 104: false, 109: true, 110: false, 200: false} {
		if got := s.visible(x); got != want {
			t.Errorf("100:110:102,104 sees %d: %v, want %v", x, got, want)
		}
	}
	for _, bad := range []string{"", "1:2", "a:2:", "1:b:", "1:2:x"} {
		if _, err := parseSnapshot(bad); err == nil {
			t.Errorf("parseSnapshot(%q): no error", bad)
		}
	}
	a, _ := parseSnapshot("100:110:104")
	b, _ := parseSnapshot("95:108:96,105")
	c, _ := parseSnapshot("120:120:")
	in := intersect([]snapshot{a, b, c})
	for x := uint64(90); x < 125; x++ {
		want := a.visible(x) && b.visible(x) && c.visible(x)
		if got := in.visible(x); got != want {
			t.Errorf("intersection sees %d: %v, want %v", x, got, want)
		}
	}
	var zero snapshot
	if zero.visible(1) {
		t.Error("the zero snapshot sees transaction 1")
	}
}
