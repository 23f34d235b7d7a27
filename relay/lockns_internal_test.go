package relay

import (
	"testing"

	"github.com/fxoutbox/outbox"
)

// The operator's tools (package admin) find the lanes a relay holds by
// outbox.Table.LockNamespace: it must be the namespace the claim locks in.
func TestLockNamespaceIsTheClaimsNamespace(t *testing.T) {
	for _, tbl := range []outbox.Table{{}, {Name: "outbox_event"}, {Schema: "orders"}, {Schema: "s", Name: "events"}} {
		if got, want := tbl.LockNamespace(), newQueries(tbl.WithDefaults()).ns; got != want {
			t.Errorf("%v: LockNamespace() = %d, the claim locks in %d", tbl, got, want)
		}
	}
}
