package migrations_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/migrations"
)

// idAt is a UUIDv7 whose time is at.
func idAt(t *testing.T, at time.Time) uuid.UUID {
	t.Helper()
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

// Partitioned.Up creates the table partitioned by event_id (head, the
// previous and current interval, 7 ahead, tail), with the outbox's and the
// cursor's columns; a second run changes nothing, Outbox.Up then finds
// nothing to do, and rows of any v7 time land in a partition while a v4 id
// is refused. Partitioned.Down drops it all and forgets the versions.
func TestUpPartitioned(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	ctx := context.Background()
	tbl := outbox.Table{Schema: testenv.Name("t_"), Name: "PaymentOutbox"}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA "+tbl.Schema+" CASCADE") })
	for range 2 {
		if err := migrations.Partitioned.WithInterval(time.Hour).Up(ctx, pool, tbl); err != nil {
			t.Fatal(err)
		}
	}
	if err := migrations.Outbox.Up(ctx, pool, tbl); err != nil {
		t.Fatal(err)
	}
	if v, err := applied(t, pool, tbl); err != nil || !slices.Equal(v, []int{1, 2, 3}) {
		t.Fatalf("applied %v, %v", v, err)
	}
	if err := migrations.Outbox.Check(ctx, pool, tbl); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Cursor.Check(ctx, pool, tbl); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = to_regclass($1) ORDER BY 1`, sqlname.Ident(tbl))
	if err != nil {
		t.Fatal(err)
	}
	var names, bounds []string
	for rows.Next() {
		var n, b string
		if err := rows.Scan(&n, &b); err != nil {
			t.Fatal(err)
		}
		names, bounds = append(names, n), append(bounds, b)
	}
	if rows.Err() != nil || len(names) != 11 {
		t.Fatalf("partitions %v (%v)", names, rows.Err())
	}
	now := time.Now().UTC()
	cur := "PaymentOutbox_p" + now.Truncate(time.Hour).Format("20060102_1504")
	if !slices.Contains(names, cur) || !slices.Contains(names, "PaymentOutbox_head") || !slices.Contains(names, "PaymentOutbox_tail") {
		t.Fatalf("partitions %v: want %s, head and tail", names, cur)
	}
	if !strings.Contains(strings.Join(bounds, " "), "MINVALUE") || !strings.Contains(strings.Join(bounds, " "), "MAXVALUE") {
		t.Fatalf("bounds %v", bounds)
	}
	insert := func(id uuid.UUID) (string, error) {
		var part string
		err := pool.QueryRow(ctx, "INSERT INTO "+sqlname.Ident(tbl)+" (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key)"+
			" VALUES ($1, 'a', '1', 'e', '{}', 'a', '1') RETURNING tableoid::regclass::text", id).Scan(&part)
		return part, err
	}
	for _, tc := range []struct {
		at   time.Time
		want string
	}{
		{now, cur}, {now.AddDate(-5, 0, 0), "PaymentOutbox_head"}, {now.AddDate(5, 0, 0), "PaymentOutbox_tail"},
	} {
		part, err := insert(idAt(t, tc.at))
		if err != nil || !strings.Contains(part, tc.want) {
			t.Errorf("v7 id of %s went to %s (%v), want %s", tc.at, part, err, tc.want)
		}
	}
	var pgErr *pgconn.PgError
	if _, err := insert(uuid.New()); !errors.As(err, &pgErr) || pgErr.Code != "23514" || pgErr.ConstraintName != "PaymentOutbox_event_id_v7" {
		t.Errorf("v4 id: err = %v, want a check violation of PaymentOutbox_event_id_v7", err)
	}
	var txid bool
	if err := pool.QueryRow(ctx, "SELECT bool_and(txid IS NOT NULL) FROM "+sqlname.Ident(tbl)).Scan(&txid); err != nil || !txid {
		t.Errorf("txid set by default: %v, %v", txid, err)
	}
	if err := migrations.Partitioned.WithInterval(90*time.Second).Up(ctx, pool, tbl); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Errorf("interval 90s: err = %v, want ErrInvalidConfig", err)
	}
	if err := migrations.Partitioned.Check(ctx, pool, tbl); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Partitioned.Down(ctx, pool, tbl, 1); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Errorf("Down to version 1: err = %v, want ErrInvalidConfig", err)
	}
	if err := migrations.Partitioned.Down(ctx, pool, tbl, 0); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Partitioned.Check(ctx, pool, tbl); !errors.Is(err, migrations.ErrNoTable) {
		t.Errorf("Check after Down = %v, want ErrNoTable", err)
	}
	var leftover bool
	if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL OR to_regclass($2) IS NOT NULL", sqlname.Ident(sqlname.Cursor(tbl)), sqlname.Ident(sqlname.Parked(tbl))).Scan(&leftover); err != nil || leftover {
		t.Errorf("cursor tables left after Down: %v, %v", leftover, err)
	}
	if v, err := applied(t, pool, tbl); err != nil || len(v) != 0 {
		t.Errorf("versions left after Down: %v, %v", v, err)
	}
	// Up again, with the default interval: the table is back.
	if err := migrations.Partitioned.Up(ctx, pool, tbl); err != nil {
		t.Fatal(err)
	}
	if v, err := applied(t, pool, tbl); err != nil || !slices.Equal(v, []int{1, 2, 3}) {
		t.Fatalf("applied after Up again %v, %v", v, err)
	}
}

// A table created by the partitioned migration's SQL (as golang-migrate
// runs it) is taken by Up without running the outbox migrations, and the
// cursor migration runs on top of it; an unpartitioned table of the same
// name stops the partitioned migration with what to do.
func TestPartitionedSQLThenUp(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	ctx := context.Background()
	tbl := outbox.Table{Schema: testenv.Name("t_")}
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+tbl.Schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA "+tbl.Schema+" CASCADE") })
	all, err := migrations.Partitioned.All(tbl)
	if err != nil || len(all) != 1 {
		t.Fatal(all, err)
	}
	if _, err := pool.Exec(ctx, all[0].Up); err != nil {
		t.Fatal(err)
	}
	cursor, err := migrations.Cursor.All(tbl)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range cursor {
		if _, err := pool.Exec(ctx, m.Up); err != nil {
			t.Fatalf("cursor migration %s on the partitioned table: %v", m.Name, err)
		}
	}
	if err := migrations.Outbox.Up(ctx, pool, tbl); err != nil {
		t.Fatal(err)
	}
	if v, err := applied(t, pool, tbl); err != nil || !slices.Equal(v, []int{1, 2, 3}) {
		t.Fatalf("applied %v, %v", v, err)
	}
	if _, err := pool.Exec(ctx, all[0].Down); err != nil {
		t.Fatal(err)
	}

	plain := testenv.Table(t, pool)
	if err := migrations.Partitioned.Up(ctx, pool, plain); err == nil || !strings.Contains(err.Error(), "is not partitioned") {
		t.Fatalf("on an unpartitioned table: err = %v", err)
	}
}
