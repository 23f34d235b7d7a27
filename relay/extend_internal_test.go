package relay

import (
	"context"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/tablesql"
)

// An exactly-once claim whose free lanes hold less than its batch in the
// window (three quarters of the lanes are another relay's) reads on past the
// window in the lanes it locked: it fills its batch, reads at most 4n rows
// more than one window (and the held key's rows), takes no row of a held
// lane or of a held key, and every lane's rows are a prefix of that lane's
// waiting rows (no row of a locked lane skipped below one taken). A row
// that commits after the window with an id inside it (a key's earlier event
// whose transaction ended late) is read too, before the rows after it.
func TestExactlyOnceClaimReadsOnInItsLanes(t *testing.T) {
	t.Parallel()
	pool, tbl, r := growSetup(t, 0, 8000, 640)
	const n = 500
	holdLanes(t, pool, r, laneRange(0, 48))
	ctx := context.Background()
	// Every row's lane, as the relay computes it.
	laneOfRow := map[int64]int32{}
	keyOf := map[int64]string{}
	rows, err := pool.Query(ctx, "SELECT id, partition_key, "+tablesql.Lane("partition_key", "$1")+" FROM "+sqlname.Ident(tbl)+" ORDER BY id", r.cfg.Lanes)
	if err != nil {
		t.Fatal(err)
	}
	var id int64
	var key string
	var lane int32
	var order []int64
	if _, err := pgx.ForEachRow(rows, []any{&id, &key, &lane}, func() error {
		laneOfRow[id], keyOf[id] = lane, key
		order = append(order, id)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var free []int64 // rows of free lanes, in order
	for _, id := range order {
		if laneOfRow[id] >= 48 {
			free = append(free, id)
		}
	}
	// check fails unless ids are n rows of free lanes, not of the held
	// keys, each lane's a prefix of its waiting rows (waiting: all rows
	// but gone), some past the first window.
	check := func(t *testing.T, ids []int64, laneOf map[int64]int32, held []string, gone map[int64]bool) {
		t.Helper()
		if len(ids) != n {
			t.Fatalf("locked %d rows; want a full batch of %d", len(ids), n)
		}
		if !slices.IsSorted(ids) {
			t.Fatal("ids not in order")
		}
		taken := map[int64]bool{}
		lanes := map[int32]int64{} // locked lane -> its last id taken
		for _, id := range ids {
			l := laneOfRow[id]
			if l < 48 {
				t.Fatalf("row %d of held lane %d taken", id, l)
			}
			if slices.Contains(held, keyOf[id]) {
				t.Fatalf("row %d of held key %s taken", id, keyOf[id])
			}
			if laneOf[id] != l {
				t.Fatalf("row %d: lane recorded %d, is %d", id, laneOf[id], l)
			}
			taken[id] = true
			lanes[l] = max(lanes[l], id)
		}
		past := false
		for _, id := range order {
			last, locked := lanes[laneOfRow[id]]
			if !locked || id > last || gone[id] || slices.Contains(held, keyOf[id]) {
				continue
			}
			if !taken[id] {
				t.Fatalf("lane %d: row %d skipped below row %d taken", laneOfRow[id], id, last)
			}
			past = past || id > order[2*n-1]
		}
		if !past {
			t.Fatal("no row past the first window taken: the claim did not read on")
		}
	}
	for _, tc := range []struct {
		name string
		held []string
	}{{"no key held", nil}, {"a key held", []string{keyOf[free[0]]}}} {
		t.Run(tc.name, func(t *testing.T) {
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(ctx) }()
			before := rowsRead(t, tx, tbl)
			laneOf := map[int64]int32{}
			ids, more, err := r.marks.LockLanes(ctx, tx, n, tc.held, 0, laneOf, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !more {
				t.Error("more is false with a backlog left")
			}
			// One window (2n), the read on (4n), and the held key's rows
			// the scans pass over (the key has one row in 640).
			if got, most := rowsRead(t, tx, tbl)-before, int64(6*n+6*n/640+2); got > most {
				t.Errorf("the claim read %d rows; one window and the read on are %d", got, most)
			}
			check(t, ids, laneOf, tc.held, nil)
		})
	}
	t.Run("a row committed late", func(t *testing.T) {
		// The third row of the free lanes leaves and comes back with its id
		// (as a transaction that commits after the window would), between
		// the claim and its read on.
		late := free[2]
		ident := sqlname.Ident(tbl)
		conn, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Release()
		var back string
		if err := conn.QueryRow(ctx, "WITH d AS (DELETE FROM "+ident+" WHERE id = $1 RETURNING *) SELECT row_to_json(d)::text FROM d", late).Scan(&back); err != nil {
			t.Fatal(err)
		}
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		laneOf := map[int64]int32{}
		ids, _, err := r.marks.LockLanes(ctx, tx, n, nil, 0, laneOf, nil)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(ids, late) {
			t.Fatal("the deleted row was claimed")
		}
		check(t, ids, laneOf, nil, map[int64]bool{late: true})
		if _, err := conn.Exec(ctx, "INSERT INTO "+ident+" OVERRIDING SYSTEM VALUE SELECT * FROM json_populate_record(NULL::"+ident+", $1::json)", back); err != nil {
			t.Fatal(err)
		}
		ids, err = r.marks.ReadOn(ctx, tx, n, nil, laneOf)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(ids, late) {
			t.Fatalf("row %d, committed after the window, not read on while rows after it of its lane were", late)
		}
		check(t, ids, laneOf, nil, nil)
	})
}
