package relay

import (
	"testing"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/locks"
)

// The operator's tools (package admin) find the lanes a relay holds by
// locks.Namespace of the table's name: it must be the namespace the claim
// locks in.
func TestLockNamespaceIsTheClaimsNamespace(t *testing.T) {
	for _, tbl := range []outbox.Table{{}, {Name: "outbox_event"}, {Schema: "orders"}, {Schema: "s", Name: "events"}} {
		if got, want := locks.Namespace(tbl.WithDefaults().String()), newQueries(tbl.WithDefaults()).ns; got != want {
			t.Errorf("%v: locks.Namespace = %d, the claim locks in %d", tbl, got, want)
		}
	}
}
