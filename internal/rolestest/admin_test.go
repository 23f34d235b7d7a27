package rolestest

import (
	"context"
	"testing"

	"github.com/fxoutbox/outbox/admin"
	"github.com/fxoutbox/outbox/internal/sqlname"
)

// The operator's API (and so outboxctl) works as the relay's role, under
// the script's grants and row-level security: status, list, show, requeue,
// delete of parked events and replay. The writer's role may do none of it.
func TestAdminWorksAsTheRelayRole(t *testing.T) {
	t.Parallel()
	r := newRoles(t)
	mig := r.pool(t, r.migrator)
	tbl := r.schema(t, mig)
	if err := r.apply(t, tbl, readScript(t)); err != nil {
		t.Fatalf("%s: %v", scriptFile, err)
	}
	ctx := context.Background()
	// The migrator owns the table (no row security for it): 100 published,
	// 50 waiting, 150 parked.
	if _, err := mig.Exec(ctx, "INSERT INTO "+sqlname.Ident(tbl)+
		" (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, published_at, parked_at, attempts, last_error)"+
		" SELECT gen_random_uuid(), 'a', 'k' || g, 't', '{}', 'x', 'k' || g, CASE WHEN g <= 100 THEN now() END,"+
		" CASE WHEN g > 150 THEN now() END, 5, 'bad' FROM generate_series(1, 300) g"); err != nil {
		t.Fatal(err)
	}
	relayDB := r.pool(t, r.relay)
	st, err := admin.ReadStatus(ctx, relayDB, tbl, nil)
	if err != nil || st.Backlog != 50 || st.Parked != 150 {
		t.Fatalf("status as the relay: %+v, %v", st, err)
	}
	parked, err := admin.ListParked(ctx, relayDB, tbl, admin.Filter{Key: "k200"})
	if err != nil || len(parked) != 1 {
		t.Fatalf("list as the relay: %v, %v", parked, err)
	}
	if _, err := admin.GetParked(ctx, relayDB, tbl, parked[0].EventID); err != nil {
		t.Fatalf("show as the relay: %v", err)
	}
	if n, err := admin.Requeue(ctx, relayDB, tbl, admin.Filter{Key: "k200"}, nil); err != nil || n != 1 {
		t.Fatalf("requeue as the relay: %d, %v", n, err)
	}
	if n, err := admin.Delete(ctx, relayDB, tbl, admin.Filter{All: true}, nil); err != nil || n != 149 {
		t.Fatalf("delete as the relay: %d, %v", n, err)
	}
	if n, err := admin.Replay(ctx, relayDB, tbl, admin.Filter{All: true}, nil); err != nil || n != 100 {
		t.Fatalf("replay as the relay: %d, %v", n, err)
	}

	writer := r.pool(t, r.writer)
	for name, op := range map[string]func() error{
		"status":  func() error { _, err := admin.ReadStatus(ctx, writer, tbl, nil); return err },
		"list":    func() error { _, err := admin.ListParked(ctx, writer, tbl, admin.Filter{}); return err },
		"requeue": func() error { _, err := admin.Requeue(ctx, writer, tbl, admin.Filter{All: true}, nil); return err },
		"delete":  func() error { _, err := admin.Delete(ctx, writer, tbl, admin.Filter{All: true}, nil); return err },
		"replay":  func() error { _, err := admin.Replay(ctx, writer, tbl, admin.Filter{All: true}, nil); return err },
	} {
		if err := op(); pgCode(err) != "42501" {
			t.Errorf("the writer's %s: err = %v, want SQLSTATE 42501", name, err)
		}
	}
}
