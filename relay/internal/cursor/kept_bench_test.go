package cursor_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/migrations"
	"github.com/fxoutbox/outbox/relay/internal/cursor"
	"github.com/fxoutbox/outbox/relay/internal/marks"
)

// cols are the relay's (cursorCols).
const cols = "e.id, e.event_id, e.event_type, e.topic, e.partition_key, e.payload, e.headers, e.attempts, e.created_at, e.attempts = 0 AND e.last_error IS NOT NULL"

// BenchmarkKept is a worker that keeps every lane of 64 and reads them
// with Kept, one statement per batch, as a cursor relay alone on its table
// does at 1,000 events/s: each op commits two events (one transaction
// each), then reads with Kept on a connection with the relay's session
// settings, and moves the lanes' positions as the relay does. running=N:
// N more transactions have written an event and are still running when
// the batch reads (so its snapshot lists them); they commit after it, and
// the next batch finds their rows as late rows, as with writers that
// commit all the time. It reports the PostgreSQL CPU of the reading
// backend per batch (pg_us/batch, from /proc: run it on the server's
// machine), most of what a cursor relay costs the server.
//
//	go test ./relay/internal/cursor/ -run XXX -bench Kept -benchtime 1500x
func BenchmarkKept(b *testing.B) {
	for _, held := range []int{0, 4, 16} {
		b.Run(fmt.Sprintf("running=%d", held), func(b *testing.B) { benchKept(b, held) })
	}
}

func benchKept(b *testing.B, held int) {
	ctx := context.Background()
	pool := testenv.Pool(b)
	table := testenv.Table(b, pool)
	if err := migrations.Cursor.Up(ctx, pool, table); err != nil {
		b.Fatal(err)
	}
	q := cursor.NewQueries(table, sqlname.Cursor(table), sqlname.Parked(table), cols)
	const lanes = 64
	perBatch := held + 2
	insert := "INSERT INTO " + sqlname.Ident(table) + " (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key)" +
		" VALUES (gen_random_uuid(), 'a', $1, 'a.b', '{}', 't', $1)"
	for range 1000 { // a table in service
		if _, err := pool.Exec(ctx, insert, key()); err != nil {
			b.Fatal(err)
		}
	}
	var snap string
	var top int64
	if err := pool.QueryRow(ctx, "SELECT pg_current_snapshot()::text, (SELECT max(id) FROM "+sqlname.Ident(table)+")").Scan(&snap, &top); err != nil {
		b.Fatal(err)
	}
	kept := make([]cursor.Lane, lanes)
	for i := range kept {
		kept[i] = cursor.Lane{Lane: int32(i), Done: snap, Base: top}
	}
	pc, err := pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	conn := pc.Hijack()
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, marks.SessionSettings(true, marks.CommitDefault), "60000"); err != nil {
		b.Fatal(err)
	}
	var pid int
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		b.Fatal(err)
	}
	// open: transactions that wrote and are still running when the batch
	// reads (its snapshot lists them), committed after it; their rows are
	// the next batch's late rows, as with writers committing all the time.
	var open []pgx.Tx
	batch := func() int {
		for _, tx := range open {
			if err := tx.Commit(ctx); err != nil {
				b.Fatal(err)
			}
		}
		open = open[:0]
		for i := range perBatch {
			if i < held {
				tx, err := pool.Begin(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := tx.Exec(ctx, insert, key()); err != nil {
					b.Fatal(err)
				}
				open = append(open, tx)
				continue
			}
			if _, err := pool.Exec(ctx, insert, key()); err != nil {
				b.Fatal(err)
			}
		}
		args := cursor.KeptReadArgs(lanes, kept)
		args["n"], args["lanes"] = 50, lanes
		rows, err := conn.Query(ctx, q.Kept, pgx.NamedArgs(args))
		if err != nil {
			b.Fatal(err)
		}
		byLane := map[int32][]cursor.Outcome{}
		var id, last int64
		var lane int32
		var now string
		var lateLanes []int32
		var lateIDs []int64
		dest := []any{&id, nil, nil, nil, nil, nil, nil, nil, nil, nil, &lane, &now, &top, &lateLanes, &lateIDs} // cols' others skipped
		n := 0
		for rows.Next() {
			if err := rows.Scan(dest...); err != nil {
				b.Fatal(err)
			}
			byLane[lane] = append(byLane[lane], cursor.Outcome{ID: id, Resolved: true})
			last = id
			n++
		}
		if err := rows.Err(); err != nil {
			b.Fatal(err)
		}
		if n == 0 {
			return 0
		}
		lates := map[int32]int64{}
		for i, l := range lateLanes {
			lates[l] = lateIDs[i]
		}
		for i, l := range kept {
			l = cursor.Opened(l, now, top, lates)
			kept[i] = cursor.Advance(l, byLane[l.Lane], n == 50, last)
		}
		return n
	}
	for range 20 { // the plan is cached and the lanes' windows turn
		batch()
	}
	cpu0 := procCPU(b, pid)
	b.ResetTimer()
	events := 0
	for range b.N {
		events += batch()
	}
	b.StopTimer()
	for _, tx := range open {
		_ = tx.Rollback(ctx)
	}
	if events < b.N*(perBatch-held) {
		b.Fatalf("read %d events, want at least %d", events, b.N*(perBatch-held))
	}
	b.ReportMetric((procCPU(b, pid)-cpu0)*1e6/float64(b.N), "pg_us/batch")
}

// procCPU is the user and system CPU seconds of process pid.
// key is one of 10,000 keys, at random.
func key() string { return "k" + strconv.Itoa(rand.IntN(10_000)) }

func procCPU(b *testing.B, pid int) float64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Skipf("the server's backend is not on this machine: %v", err)
	}
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	u, _ := strconv.ParseFloat(f[11], 64)
	k, _ := strconv.ParseFloat(f[12], 64)
	return (u + k) / 100 // USER_HZ
}
