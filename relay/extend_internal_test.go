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
// window in the lanes it locked: it fills its batch, reads at most 2n rows
// more than one window (and the held key's rows), takes no row of a held lane or of a held key, and
// every lane's rows are a prefix of that lane's waiting rows (no row of a
// locked lane skipped below one taken).
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
	var free string // a key of a free lane
	for _, id := range order {
		if laneOfRow[id] >= 48 {
			free = keyOf[id]
			break
		}
	}
	for _, tc := range []struct {
		name string
		held []string
	}{{"no key held", nil}, {"a key held", []string{free}}} {
		t.Run(tc.name, func(t *testing.T) {
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(ctx) }()
			before := rowsRead(t, tx, tbl)
			laneOf := map[int64]int32{}
			ids, more, err := r.lockLanes(ctx, tx, n, tc.held, 0, laneOf, nil)
			if err != nil {
				t.Fatal(err)
			}
			// One window and the read on, 2n each, and the held key's rows
			// the scans pass over (the key has one row in 640).
			if got, most := rowsRead(t, tx, tbl)-before, int64(4*n+4*n/640+2); got > most {
				t.Errorf("the claim read %d rows; one window and the read on are %d", got, most)
			}
			if len(ids) != n || !more {
				t.Fatalf("locked %d rows (more %v); want a full batch of %d, and more", len(ids), more, n)
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
				if slices.Contains(tc.held, keyOf[id]) {
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
				if !locked || id > last || slices.Contains(tc.held, keyOf[id]) {
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
		})
	}
}
