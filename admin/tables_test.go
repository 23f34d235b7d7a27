package admin_test

import (
	"context"
	"slices"
	"testing"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/admin"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/tablesql"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/migrations"
)

// FindTables finds outbox tables by their columns, whatever their names
// (and not the inbox's tables, nor a look-alike missing a column);
// FindInboxTables finds inbox tables (not their _parked tables), and
// InboxConsumers lists the consumers of one.
func TestFindTables(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	ctx := context.Background()
	main := testenv.Table(t, pool)
	audit := outbox.Table{Schema: main.Schema, Name: "audit_outbox"}
	if err := migrations.Outbox.Up(ctx, pool, audit); err != nil {
		t.Fatal(err)
	}
	inbox := outbox.Table{Schema: main.Schema, Name: "orders_inbox"}
	if err := migrations.Inbox.Up(ctx, pool, inbox); err != nil {
		t.Fatal(err)
	}
	lookAlike := outbox.Table{Schema: main.Schema, Name: "not_an_outbox"}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+sqlname.Ident(lookAlike)+" (event_id uuid, topic text, partition_key text)"); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "INSERT INTO "+sqlname.Ident(inbox)+` (consumer, event_id, topic, "partition", "offset") VALUES ('billing', 'e-1', 't', 0, 1), ('billing', 'e-2', 't', 0, 2), ('audit', 'e-1', 't', 0, 1)`); err != nil {
		t.Fatal(err)
	}
	mine := func(ts []outbox.Table) (out []string) {
		for _, x := range ts {
			if x.Schema == main.Schema {
				out = append(out, x.Name)
			}
		}
		return out
	}
	tables, err := admin.FindTables(ctx, pool)
	if got := mine(tables); err != nil || !slices.Equal(got, []string{"audit_outbox", main.WithDefaults().Name}) {
		t.Errorf("FindTables = %q, %v; want audit_outbox and %s", got, err, main.WithDefaults().Name)
	}
	inboxes, err := tablesql.FindInboxTables(ctx, pool)
	if got := mine(inboxes); err != nil || !slices.Equal(got, []string{"orders_inbox"}) {
		t.Errorf("FindInboxTables = %q, %v; want orders_inbox", got, err)
	}
	consumers, err := tablesql.InboxConsumers(ctx, pool, inbox)
	if err != nil || !slices.Equal(consumers, []string{"audit", "billing"}) {
		t.Errorf("InboxConsumers = %q, %v; want audit, billing", consumers, err)
	}
}
