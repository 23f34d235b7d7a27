package relay

import (
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
)

// Ordering says what a relay promises about the order of events in Kafka.
type Ordering int

const (
	// PerKey (the default) publishes the events of each partition key in
	// the order they were written, also with many relay replicas on one
	// table and across their crashes. Keys are hashed into Lanes; a claim
	// takes transaction-scoped advisory locks on the lanes it publishes, so
	// one relay at a time publishes a lane, and then reads those lanes' rows
	// in id order in a new statement (whose snapshot sees everything the
	// previous holder marked).
	PerKey Ordering = iota
	// Unordered claims rows with a plain FOR UPDATE SKIP LOCKED, as the
	// classic outbox relay does. It is the fastest claim, and per-key order
	// still holds with a single relay; with several replicas, two of them
	// can hold different events of one key at once and publish them out of
	// order. Choose it only when consumers do not rely on order.
	Unordered
)

func (o Ordering) String() string {
	switch o {
	case PerKey:
		return "per-key"
	case Unordered:
		return "unordered"
	}
	return "Ordering(" + strconv.Itoa(int(o)) + ")"
}

// lane is the SQL expression that maps a row's partition key to its lane;
// $lanes is the number of lanes. hashtext is stable across servers and
// versions (PostgreSQL 12+).
const lane = "((hashtext(partition_key) & 2147483647) % @lanes)"

type queries struct {
	claim   string // unordered: lock rows
	window  string // per key: lanes with work among the first rows, in order of their first row
	lock    string // per key: try-lock candidate lanes
	read    string // per key: the rows the window saw in locked lanes
	mark    string
	attempt string
	cleanup string
	ns      int32 // advisory lock namespace of the table
}

func newQueries(t outbox.Table) queries {
	cols := "id, event_id, event_type, topic, partition_key, payload, headers, attempts, created_at"
	h := fnv.New32a()
	h.Write([]byte("fxoutbox:" + t.String()))
	return queries{
		claim: "SELECT " + cols + " FROM " + t.Ident() +
			" WHERE published_at IS NULL AND parked_at IS NULL ORDER BY id LIMIT @n FOR UPDATE SKIP LOCKED",
		// window groups the oldest unpublished rows by lane, in order of
		// each lane's first row, with their ids, and try-locks the lanes
		// that cover the first @n of them: true when locked, false when
		// another relay holds them; lanes past the first @n come back null.
		window: "SELECT lane, cnt, ids, CASE WHEN before < @n THEN pg_try_advisory_xact_lock(@ns, lane) END FROM (" +
			"SELECT lane, count(*)::int AS cnt, array_agg(id ORDER BY id) AS ids, min(id) AS first," +
			" coalesce(sum(count(*)) OVER (ORDER BY min(id) ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS before" +
			" FROM (SELECT id, " + lane + " AS lane FROM " + t.Ident() +
			" WHERE published_at IS NULL AND parked_at IS NULL ORDER BY id LIMIT @window) w GROUP BY lane) c ORDER BY first",
		lock: "SELECT l FROM unnest(@candidates::int[]) AS l WHERE pg_try_advisory_xact_lock(@ns, l)",
		// read takes the rows the window saw in the locked lanes, in a new
		// statement: its snapshot, taken after the locks were granted, drops
		// the rows the lanes' previous holder published or parked meanwhile.
		read: "SELECT " + cols + " FROM " + t.Ident() +
			" WHERE id = ANY(@ids::bigint[]) AND published_at IS NULL AND parked_at IS NULL ORDER BY id LIMIT @n",
		mark: "UPDATE " + t.Ident() + " SET published_at = now() WHERE id = ANY($1)",
		attempt: "UPDATE " + t.Ident() + " e SET attempts = e.attempts + 1, last_error = f.err," +
			" parked_at = CASE WHEN f.lim > 0 AND e.attempts + 1 >= f.lim THEN now() END" +
			" FROM unnest($1::bigint[], $2::text[], $3::int[]) AS f(id, err, lim) WHERE e.id = f.id" +
			" RETURNING e.id, e.parked_at IS NOT NULL",
		// created_at <= published_at, so the created_at condition (BRIN
		// index) narrows the scan to old block ranges.
		cleanup: "DELETE FROM " + t.Ident() + " WHERE id IN (SELECT id FROM " + t.Ident() +
			" WHERE created_at < $1 AND published_at < $1 LIMIT $2 FOR UPDATE SKIP LOCKED)",
		ns: int32(h.Sum32()),
	}
}

// txSettings returns the statement that sets a batch transaction's
// settings, and its argument: the server-side bound (a relay that hangs
// while holding locks loses them after BatchTimeout + 5s) and, unless
// SynchronousCommit, an asynchronous commit.
func txSettings(cfg Config) (sql, idleMillis string) {
	sql = "SELECT set_config('idle_in_transaction_session_timeout', $1, true)"
	if !cfg.SynchronousCommit {
		sql += ", set_config('synchronous_commit', 'off', true)"
	}
	return sql, strconv.FormatInt((cfg.BatchTimeout + 5*time.Second).Milliseconds(), 10)
}

// query runs sql and hands its rows to scan. The claim's first statement
// (first) goes in one round trip with the transaction's settings.
func (r *Relay) query(ctx context.Context, tx pgx.Tx, first bool, sql string, args pgx.NamedArgs, scan func(pgx.Rows) error) error {
	if !first {
		rows, err := tx.Query(ctx, sql, args)
		if err != nil {
			return err
		}
		defer rows.Close()
		if err := scan(rows); err != nil {
			return err
		}
		rows.Close()
		return rows.Err()
	}
	b := &pgx.Batch{}
	b.Queue(r.txSettings, r.idleMillis)
	b.Queue(sql, args).Query(scan)
	return tx.SendBatch(ctx, b).Close()
}

// claim returns the next batch of up to n rows, locked for this
// transaction (under PerKey, by the lanes' advisory locks), and whether more
// unpublished rows are likely waiting behind them.
func (r *Relay) claim(ctx context.Context, tx pgx.Tx, n int) (rows []row, more bool, err error) {
	if r.cfg.Ordering == Unordered {
		rows, err = r.readRows(ctx, tx, true, n, r.q.claim, pgx.NamedArgs{"n": n})
		return rows, len(rows) == n, err
	}
	ids, more, err := r.lockLanes(ctx, tx, n)
	if err != nil || len(ids) == 0 {
		return nil, false, err
	}
	// A new statement: its snapshot is taken after the locks were granted.
	rows, err = r.readRows(ctx, tx, false, n, r.q.read, pgx.NamedArgs{"ids": ids, "n": n})
	return rows, more || len(rows) == n, err
}

// lockLanes locks lanes that hold about n of the oldest unpublished events,
// skipping lanes other relays hold, and returns the ids of their events in
// order. It looks at a window of the oldest rows (2n, growing 4x up to 32n
// when the lanes in it are taken), so each replica finds work past the
// others' lanes. A relay alone on its table locks its lanes in the first
// window's statement; one that finds lanes held tries further lanes a chunk
// at a time. Every unpublished event of a lane older than the window's last
// one is in the window, so reading the window's ids of a locked lane keeps
// its keys' order. more reports unpublished rows this batch does not take.
func (r *Relay) lockLanes(ctx context.Context, tx pgx.Tx, n int) (ids []int64, more bool, err error) {
	covered := 0
	tried := map[int32]bool{}
	for window := 2 * n; ; window *= 4 {
		type laneRows struct {
			lane int32
			ids  []int64
		}
		var cands []laneRows
		seen := 0
		var (
			lr  laneRows
			got *bool
		)
		// Only the first window locks in its statement: the lanes a larger
		// one adds all come after those already tried.
		lockUpTo := 0
		if window == 2*n {
			lockUpTo = n
		}
		err = r.query(ctx, tx, window == 2*n, r.q.window, pgx.NamedArgs{"window": window, "lanes": r.cfg.Lanes, "n": lockUpTo, "ns": r.q.ns},
			func(rows pgx.Rows) error {
				var cnt int
				_, err := pgx.ForEachRow(rows, []any{&lr.lane, &cnt, &lr.ids, &got}, func() error {
					seen += cnt
					switch {
					case tried[lr.lane]:
					case got == nil:
						cands = append(cands, lr)
					case *got:
						tried[lr.lane] = true
						ids = append(ids, lr.ids...)
						covered += len(lr.ids)
					default:
						tried[lr.lane] = true
					}
					lr = laneRows{}
					return nil
				})
				return err
			})
		if err != nil {
			return nil, false, fmt.Errorf("relay: find lanes in %s: %w", r.cfg.Table, err)
		}
		// Lanes held by other relays left the batch short: try the next
		// lanes in order of their oldest event, a chunk at a time.
		for len(cands) > 0 && covered < n {
			var chunk []int32
			want := map[int32][]int64{}
			for need := n - covered; len(cands) > 0 && need > 0; cands = cands[1:] {
				chunk = append(chunk, cands[0].lane)
				want[cands[0].lane] = cands[0].ids
				tried[cands[0].lane] = true
				need -= len(cands[0].ids)
			}
			rows, err := tx.Query(ctx, r.q.lock, pgx.NamedArgs{"candidates": chunk, "ns": r.q.ns})
			if err != nil {
				return nil, false, fmt.Errorf("relay: lock lanes: %w", err)
			}
			got, err := pgx.CollectRows(rows, pgx.RowTo[int32])
			if err != nil {
				return nil, false, fmt.Errorf("relay: lock lanes: %w", err)
			}
			for _, l := range got {
				ids = append(ids, want[l]...)
				covered += len(want[l])
			}
		}
		// Done when the batch is covered, the window held every unpublished
		// row, or the window is as large as it gets.
		if covered >= n || seen < window || window >= 32*n {
			slices.Sort(ids)
			return ids, seen >= window || seen > covered, nil
		}
	}
}

func (r *Relay) readRows(ctx context.Context, tx pgx.Tx, first bool, n int, sql string, args pgx.NamedArgs) ([]row, error) {
	out := make([]row, 0, n)
	var x row
	err := r.query(ctx, tx, first, sql, args, func(rs pgx.Rows) error {
		_, err := pgx.ForEachRow(rs, []any{&x.id, &x.eventID, &x.eventType, &x.topic, &x.key, &x.payload, &x.headers, &x.attempts, &x.createdAt}, func() error {
			out = append(out, x)
			x = row{}
			return nil
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("relay: claim from %s: %w", r.cfg.Table, err)
	}
	return out, nil
}
