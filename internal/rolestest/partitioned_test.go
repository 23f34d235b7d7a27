package rolestest

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"path"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/migrations"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// A partitioned table with the three roles scripts applied
// (migrations/roles.example.sql, cursor/ and partitioned/): the relay role,
// NOINHERIT and a member of the table's owning role, runs the partitions'
// upkeep (makes the partitions ahead, detaches and drops a delivered one),
// and the partitions it makes belong to the owner; outside the upkeep its
// sessions have no owner's privilege (it cannot drop a partition, nor
// delete a waiting row). The writer role cannot run the upkeep at all.
func TestPartitionedRolesScript(t *testing.T) {
	t.Parallel()
	r := newRoles(t)
	ctx := context.Background()
	owner := testenv.Name("outbox_owner_")
	for _, q := range []string{
		"CREATE ROLE " + ident(owner) + " NOLOGIN",
		"GRANT " + ident(owner) + " TO " + ident(r.migrator),
		"GRANT " + ident(owner) + " TO " + ident(r.relay),
		"ALTER ROLE " + ident(r.relay) + " NOINHERIT",
	} {
		if _, err := r.admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		ctx := context.Background()
		if _, err := r.admin.Exec(ctx, "DROP OWNED BY "+ident(owner)); err != nil {
			t.Errorf("drop owned: %v", err)
		}
		if _, err := r.admin.Exec(ctx, "DROP ROLE "+ident(owner)); err != nil {
			t.Errorf("drop role: %v", err)
		}
	})
	mig := r.pool(t, r.migrator)
	tbl := outbox.Table{Schema: testenv.Name("roles_")}
	if _, err := r.admin.Exec(ctx, "CREATE SCHEMA "+ident(tbl.Schema)+" AUTHORIZATION "+ident(r.migrator)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = r.admin.Exec(context.Background(), "DROP SCHEMA "+ident(tbl.Schema)+" CASCADE") })
	if err := migrations.Partitioned.Up(ctx, mig, tbl); err != nil {
		t.Fatalf("Partitioned.Up as the migration role: %v", err)
	}
	parent := sqlname.Ident(tbl)
	base := tbl.WithDefaults().Name
	day := func(d int) time.Time { return time.Now().UTC().Truncate(24*time.Hour).AddDate(0, 0, d) }
	partName := func(d int) string { return base + "_p" + day(d).Format("20060102") + "_0000" }
	// As if no relay had run for a week: the partitions made ahead are
	// gone but tomorrow's, and the tail starts the day after: the upkeep has
	// partitions to make.
	var lo string
	if err := mig.QueryRow(ctx, `SELECT (regexp_match(pg_get_expr(relpartbound, oid), 'FROM \(''([^'']+)''\)'))[1]
		FROM pg_class WHERE oid = to_regclass($1)`, ident(tbl.Schema)+"."+ident(partName(2))).Scan(&lo); err != nil {
		t.Fatalf("the bound of %s: %v", partName(2), err)
	}
	drops := []string{"ALTER TABLE " + parent + " DETACH PARTITION " + ident(tbl.Schema) + "." + ident(base+"_tail"), "DROP TABLE " + ident(tbl.Schema) + "." + ident(base+"_tail")}
	for d := 2; d <= 7; d++ {
		drops = append(drops, "DROP TABLE "+ident(tbl.Schema)+"."+ident(partName(d)))
	}
	drops = append(drops, "CREATE TABLE "+ident(tbl.Schema)+"."+ident(base+"_tail")+" PARTITION OF "+parent+" FOR VALUES FROM ("+literal(lo)+") TO (MAXVALUE)")
	for _, q := range drops {
		if _, err := mig.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for _, s := range []struct{ name, script string }{
		{"roles.example.sql", readScript(t)}, {"cursor/roles.example.sql", ""}, {"partitioned/roles.example.sql", ""},
	} {
		script := s.script
		if script == "" {
			set := migrations.Cursor
			if strings.HasPrefix(s.name, "partitioned/") {
				set = migrations.Partitioned
			}
			b, err := fs.ReadFile(set.FS(), path.Base(s.name))
			if err != nil {
				t.Fatal(err)
			}
			script = string(b)
		}
		if err := r.applyVars(t, tbl, script, map[string]string{"owner": owner}); err != nil {
			t.Fatalf("%s as the migration role: %v", s.name, err)
		}
	}
	partitions := func() map[string]string { // name: owner
		t.Helper()
		rows, err := r.admin.Query(ctx, "SELECT c.relname::text, c.relowner::regrole::text FROM pg_partition_tree($1::regclass) p JOIN pg_class c ON c.oid = p.relid WHERE p.isleaf", parent)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		got := map[string]string{}
		for rows.Next() {
			var n, o string
			if err := rows.Scan(&n, &o); err != nil {
				t.Fatal(err)
			}
			got[n] = o
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return got
	}
	before := partitions()
	if _, ok := before[partName(-1)]; !ok || len(before) != 5 {
		t.Fatalf("partitions before the upkeep: %v; want head, yesterday, today, tomorrow and the tail", before)
	}

	writer, relayDB := r.pool(t, r.writer), r.pool(t, r.relay)
	uow, err := unitofwork.New(writer, &unitofwork.Config{Service: "svc", Table: tbl})
	if err != nil {
		t.Fatal(err)
	}
	brokers := testenv.Brokers(t)
	topic := testenv.Topic(t, brokers, 2)
	write := func(id uuid.UUID) {
		t.Helper()
		err := uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
			return tx.Add(ctx, outbox.Event{ID: id, AggregateType: "order", AggregateID: "o-1", Type: "order.placed.v1", Topic: topic})
		})
		if err != nil {
			t.Fatalf("writer: %v", err)
		}
	}
	yesterday := v7At(t, day(-1).Add(time.Hour))
	write(yesterday)
	write(uuid.Must(uuid.NewV7()))
	pub, err := relay.NewSaramaPublisher(brokers, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	cfg := relay.Config{Table: tbl, Progress: relay.ProgressCursor, Retention: time.Millisecond, Logger: slog.New(slog.DiscardHandler)}

	// The writer cannot change the partitions, and is told what it takes.
	wcfg := cfg
	wr, err := relay.New(writer, pub, &wcfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep, err := wr.MaintainPartitions(ctx); err == nil || !strings.Contains(err.Error(), "owner") {
		t.Errorf("the upkeep as the writer role: %+v, %v; want a refusal that names the owner", rep, err)
	}
	if got := partitions(); len(got) != len(before) {
		t.Errorf("the writer role changed the partitions: %v, were %v", got, before)
	}

	rl, err := relay.New(relayDB, pub, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Before delivery: partitions made ahead, none dropped.
	rep, err := rl.MaintainPartitions(ctx)
	if err != nil {
		t.Fatalf("the upkeep as the relay role: %v", err)
	}
	if len(rep.Made) == 0 || len(rep.Dropped) != 0 {
		t.Fatalf("the upkeep as the relay role: made %v, dropped %v; want partitions made ahead and none dropped (nothing delivered)", rep.Made, rep.Dropped)
	}
	for n, o := range partitions() {
		if o != owner {
			t.Errorf("partition %s belongs to %s, want the owning role %s", n, o, owner)
		}
	}
	// Delivered (as the relay role), then dropped: detached and dropped
	// by the relay role, its range taken by the head.
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		n, err := rl.RunOnce(ctx)
		return err == nil && n == 0, fmt.Sprintf("RunOnce as the relay role: %d, %v", n, err)
	})
	if _, err := rl.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		rep, err = rl.MaintainPartitions(ctx)
		_, left := partitions()[partName(-1)]
		return err == nil && !left, fmt.Sprintf("the upkeep as the relay role: %+v, %v; yesterday's partition still there: %v", rep, err, left)
	})
	var n int
	if err := r.admin.QueryRow(ctx, "SELECT count(*) FROM "+parent).Scan(&n); err != nil || n != 1 {
		t.Errorf("%d rows left (%v), want today's", n, err)
	}
	// Outside the upkeep the relay's session holds no owner's privilege.
	if _, err := relayDB.Exec(ctx, "DROP TABLE "+ident(tbl.Schema)+"."+ident(partName(0))); err == nil {
		t.Errorf("the relay role dropped a partition outside the upkeep")
	}
	waiting := uuid.Must(uuid.NewV7())
	write(waiting)
	tag, err := relayDB.Exec(ctx, "DELETE FROM "+parent+" WHERE event_id = $1", waiting)
	if err != nil || tag.RowsAffected() != 0 {
		t.Errorf("the relay role deleted a waiting row: %v rows, %v", tag.RowsAffected(), err)
	}
}

// v7At is a UUIDv7 whose time is at.
func v7At(t testing.TB, at time.Time) uuid.UUID {
	id, err := uuid.NewV7()
	if err != nil {
		t.Fatal(err)
	}
	ms := uint64(at.UnixMilli())
	for i := range 6 {
		id[i] = byte(ms >> (40 - 8*i))
	}
	return id
}
