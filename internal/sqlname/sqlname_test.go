package sqlname_test

import (
	"testing"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
)

func TestIdentAndDerived(t *testing.T) {
	for _, c := range []struct {
		table          outbox.Table
		ident, derived string
	}{
		{outbox.Table{}, `"outbox_event"`, `"outbox_event_pending"`},
		{outbox.Table{Name: "orders_outbox"}, `"orders_outbox"`, `"orders_outbox_pending"`},
		{outbox.Table{Schema: "app", Name: "Events"}, `"app"."Events"`, `"Events_pending"`},
	} {
		if got := sqlname.Ident(c.table); got != c.ident {
			t.Errorf("Ident(%v) = %s, want %s", c.table, got, c.ident)
		}
		if got := sqlname.Derived(c.table, "pending"); got != c.derived {
			t.Errorf("Derived(%v, pending) = %s, want %s", c.table, got, c.derived)
		}
	}
}
