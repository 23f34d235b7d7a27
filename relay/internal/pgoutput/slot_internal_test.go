package pgoutput

import "testing"

// The slot's creation asks for a failover slot from PostgreSQL 17 on, in
// the option list that version reads, and in the older form before.
func TestCreateSlotCommand(t *testing.T) {
	for _, c := range []struct {
		version string
		major   int
		want    string
	}{
		{"15.4 (Debian 15.4-1.pgdg120+1)", 15, "CREATE_REPLICATION_SLOT s LOGICAL pgoutput"},
		{"16.2", 16, "CREATE_REPLICATION_SLOT s LOGICAL pgoutput"},
		{"17.0", 17, "CREATE_REPLICATION_SLOT s LOGICAL pgoutput (FAILOVER)"},
		{"17beta1", 17, "CREATE_REPLICATION_SLOT s LOGICAL pgoutput (FAILOVER)"},
		{"18.1 (Ubuntu 18.1-1)", 18, "CREATE_REPLICATION_SLOT s LOGICAL pgoutput (FAILOVER)"},
		{"9.6.24", 9, "CREATE_REPLICATION_SLOT s LOGICAL pgoutput"},
		{"", 0, "CREATE_REPLICATION_SLOT s LOGICAL pgoutput"},
	} {
		major := ServerMajor(c.version)
		if major != c.major {
			t.Errorf("ServerMajor(%q) = %d, want %d", c.version, major, c.major)
		}
		if got := createSlotCommand("s", major >= failoverMajor); got != c.want {
			t.Errorf("server %q: %q, want %q", c.version, got, c.want)
		}
	}
}
