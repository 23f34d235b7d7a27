// Package marks is the relay's marks progress (the default): a delivered
// event is marked in its own row (published_at), a failed one is charged
// in its row (attempts, last_error) and parked there (parked_at), and
// cleanup deletes the marked rows after the retention.
//
// A claim finds the oldest waiting rows. Under per-key ordering it groups
// a window of them by lane and try-locks the lanes (Window, then Lock for
// further lanes), and reads the locked lanes' rows in a new statement
// (Read), whose snapshot sees what the lanes' previous holder marked; an
// unordered claim locks rows with FOR UPDATE SKIP LOCKED (Claim). The
// stream's claim marks the streamed rows in one statement (StreamClaim).
//
// The package also holds the statements that both progress modes run: a
// batch transaction's settings (TxSettings), the savepoint around a read of
// rows (Savepoint, RollbackTo), the try-lock of candidate lanes (Lock) and
// the wake-up channel's LISTEN (Listen).
//
// The package owns the SQL text and the claims that run it (Engine: the
// lanes' windows and locks, the guarded read of their rows); the relay owns
// the transaction, the marks and charges of what it published, and the
// publishing.
package marks

import (
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/tablesql"
)

// Queries are the statements of one table's marks progress. A claim
// statement's arguments are @n (the most rows to take), @held (the keys
// left out, those waiting for a failed event's retry) and, in Window's
// variants, @window, @lanes, @ns (the lock namespace) and @owned.
type Queries struct {
	// Claim (Unordered) locks and reads the first @n waiting rows.
	Claim string
	// Window (PerKey) groups the first @window waiting rows by lane, in
	// order of each lane's first row, with their ids, and try-locks the
	// lanes that cover the first @n of them: true when locked, false when
	// another relay holds them; lanes past the first @n come back null.
	Window string
	// ClaimHeld and WindowHeld are Claim and Window without the rows of
	// the keys in @held, used only while some key is held.
	ClaimHeld, WindowHeld string
	// WindowOwned and WindowOwnedHeld are Window and WindowHeld for an
	// exactly-once worker: the lanes in @owned first (taking another's
	// lane fences its producer).
	WindowOwned, WindowOwnedHeld string
	// ReadOn (and ReadOnHeld, without the rows of the keys in @held) reads
	// on past the window for an exactly-once worker whose locked lanes
	// held less than a batch in it: of the first @scan waiting rows, those
	// of the lanes @locked, at most @n, in id order (id, lane), in one
	// snapshot: each lane's rows are a prefix of its waiting rows.
	ReadOn, ReadOnHeld string
	// ClaimIDs is ClaimHeld reading only the rows' ids (Unordered,
	// isolating rows that cannot be read).
	ClaimIDs string
	// Read takes the rows @ids (those Window saw in the locked lanes) that
	// are still waiting, at most @n, in id order, in a new statement: its
	// snapshot, taken after the locks were granted, drops the rows the
	// lanes' previous holder published or parked meanwhile.
	Read string
	// FirstID is the id of the first waiting row of @ids (the one a failed
	// Read could not print).
	FirstID string
	// Unreadable charges (and, with @park, parks) the rows @ids that
	// cannot be read, with the reasons @errs, without reading them. It
	// returns id, event_id, topic, partition_key and whether parked.
	Unreadable string
	// Mark marks the rows $1 published; Unmark takes the mark back (from
	// rows the stream claimed that failed).
	Mark, Unmark string
	// Attempt charges a try on each failed row ($1 ids, $2 reasons, $3
	// limits): a row whose tries reach its limit (> 0) is parked. A
	// negative attempts (written by hand) counts as 0. It returns each
	// row's id and whether it was parked.
	Attempt string
	// Cleanup deletes rows published before $1, at most $2 of them.
	Cleanup string
	// MarkCommitted (ExactlyOnce) marks the events $1 (uuids, those of a
	// lane's last Kafka transaction) published, leaving out a row an
	// operator replayed since (attempts 0 with a last error). Durable
	// goes before it: such a mark must survive a crash.
	MarkCommitted, Durable string

	// The stream's claim: StreamClaim marks the streamed rows @ids that
	// are still waiting published, only those whose lane this transaction
	// holds (or gets: @ns, @lanes) and whose key has no waiting row below
	// @top outside the batch @batch. StreamState returns each present row
	// of @ids, whether it waits, and whether the claim would have taken
	// it (such a row was not visible yet). The Unordered variants take
	// every waiting row, locked with SKIP LOCKED.
	StreamClaim, StreamClaimUnordered string
	StreamState, StreamStateUnordered string

	// Savepoint goes before a read of rows, so that a row that cannot be
	// read does not abort the batch; RollbackTo returns to it, keeping
	// the lane locks. Both progress modes use them.
	Savepoint, RollbackTo string
	// Lock try-locks the lanes @candidates in namespace @ns and returns
	// those it locked. Both progress modes use it.
	Lock string
	// Listen subscribes a connection to the table's wake-up channel
	// (sqlname.Channel), which writers NOTIFY after a commit. Both
	// progress modes use it.
	Listen string

	// Upto holds, for each of Claim, ClaimHeld, ClaimIDs, Window and
	// WindowHeld, its variant that takes only rows with id <= @upto (the
	// sweep of a streaming relay: the rows past it are the stream's).
	Upto map[string]string
}

// NewQueries returns the statements for table, reading cols (the relay's
// columns of a row, in the order it scans them) in Claim, ClaimHeld and
// Read.
func NewQueries(table outbox.Table, cols string) Queries {
	t := sqlname.Ident(table)
	lane := tablesql.Lane("partition_key", "@lanes")
	const notHeld = " AND partition_key <> ALL(@held::text[])"
	window := func(held, prefer string) string {
		return "SELECT lane, cnt, ids, CASE WHEN before < @n THEN pg_try_advisory_xact_lock(@ns, lane) END FROM (" +
			"SELECT lane, count(*)::int AS cnt, array_agg(id ORDER BY id) AS ids, min(id) AS first," +
			" coalesce(sum(count(*)) OVER (ORDER BY " + prefer + "min(id) ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS before" +
			" FROM (SELECT id, " + lane + " AS lane FROM " + t +
			" WHERE published_at IS NULL AND parked_at IS NULL" + held + " ORDER BY id LIMIT @window) w GROUP BY lane) c ORDER BY " + prefer + "first"
	}
	const owned = "lane = ANY(@owned::int[]) DESC, "
	readOn := func(held string) string {
		return "SELECT w.id, w.lane FROM (SELECT id, " + lane + " AS lane FROM " + t +
			" WHERE published_at IS NULL AND parked_at IS NULL" + held + " ORDER BY id LIMIT @scan) w" +
			" WHERE w.lane = ANY(@locked::int[]) ORDER BY w.id LIMIT @n"
	}
	q := Queries{
		Claim: "SELECT " + cols + " FROM " + t +
			" WHERE published_at IS NULL AND parked_at IS NULL ORDER BY id LIMIT @n FOR UPDATE SKIP LOCKED",
		ClaimHeld: "SELECT " + cols + " FROM " + t +
			" WHERE published_at IS NULL AND parked_at IS NULL" + notHeld + " ORDER BY id LIMIT @n FOR UPDATE SKIP LOCKED",
		ClaimIDs: "SELECT id FROM " + t +
			" WHERE published_at IS NULL AND parked_at IS NULL" + notHeld + " ORDER BY id LIMIT @n FOR UPDATE SKIP LOCKED",
		Window:          window("", ""),
		WindowHeld:      window(notHeld, ""),
		WindowOwned:     window("", owned),
		WindowOwnedHeld: window(notHeld, owned),
		ReadOn:          readOn(""),
		ReadOnHeld:      readOn(notHeld),
		Read: "SELECT " + cols + " FROM " + t +
			" WHERE id = ANY(@ids::bigint[]) AND published_at IS NULL AND parked_at IS NULL ORDER BY id LIMIT @n",
		FirstID: "SELECT id FROM " + t +
			" WHERE id = ANY(@ids::bigint[]) AND published_at IS NULL AND parked_at IS NULL ORDER BY id LIMIT 1",
		Unreadable: "UPDATE " + t + " e SET attempts = e.attempts + 1, last_error = f.err," +
			" parked_at = CASE WHEN @park::bool THEN now() END" +
			" FROM unnest(@ids::bigint[], @errs::text[]) AS f(id, err) WHERE e.id = f.id AND e.published_at IS NULL AND e.parked_at IS NULL" +
			" RETURNING e.id, e.event_id, e.topic, e.partition_key, e.parked_at IS NOT NULL",
		Mark:   "UPDATE " + t + " SET published_at = now() WHERE id = ANY($1)",
		Unmark: "UPDATE " + t + " SET published_at = NULL WHERE id = ANY($1)",
		Attempt: "UPDATE " + t + " e SET attempts = greatest(e.attempts, 0) + 1, last_error = f.err," +
			" parked_at = CASE WHEN f.lim > 0 AND greatest(e.attempts, 0) + 1 >= f.lim THEN now() END" +
			" FROM unnest($1::bigint[], $2::text[], $3::int[]) AS f(id, err, lim) WHERE e.id = f.id" +
			" RETURNING e.id, e.parked_at IS NOT NULL",
		// created_at <= published_at, so the created_at condition (BRIN
		// index) narrows the scan to old block ranges.
		Cleanup: "DELETE FROM " + t + " WHERE id IN (SELECT id FROM " + t +
			" WHERE created_at < $1 AND published_at < $1 LIMIT $2 FOR UPDATE SKIP LOCKED)",
		MarkCommitted: "UPDATE " + t + " SET published_at = now() WHERE event_id = ANY($1::uuid[]) AND published_at IS NULL" +
			" AND NOT (attempts = 0 AND last_error IS NOT NULL)",
		Durable: "SELECT " + setConfig("synchronous_commit", "'on'", "true"),
		StreamClaim: "UPDATE " + t + " e SET published_at = now()" +
			" WHERE e.id = ANY(@ids::bigint[]) AND e.published_at IS NULL AND e.parked_at IS NULL AND " + streamTakes(t) +
			" RETURNING e.id",
		StreamClaimUnordered: "UPDATE " + t + " SET published_at = now() WHERE id IN (SELECT id FROM " + t +
			" WHERE id = ANY(@ids::bigint[]) AND published_at IS NULL AND parked_at IS NULL FOR UPDATE SKIP LOCKED) RETURNING id",
		StreamState: "SELECT e.id, e.published_at IS NULL AND e.parked_at IS NULL, " + streamTakes(t) +
			" FROM " + t + " e WHERE e.id = ANY(@ids::bigint[])",
		StreamStateUnordered: "SELECT id, published_at IS NULL AND parked_at IS NULL, false FROM " + t + " WHERE id = ANY(@ids::bigint[])",
		Savepoint:            "SAVEPOINT fxoutbox_read",
		RollbackTo:           "ROLLBACK TO SAVEPOINT fxoutbox_read",
		Lock:                 "SELECT l FROM unnest(@candidates::int[]) AS l WHERE pg_try_advisory_xact_lock(@ns, l)",
		Listen:               "LISTEN " + pgx.Identifier{sqlname.Channel(table)}.Sanitize(),
	}
	const cond = "WHERE published_at IS NULL AND parked_at IS NULL"
	q.Upto = map[string]string{}
	for _, sql := range []string{q.Claim, q.ClaimHeld, q.ClaimIDs, q.Window, q.WindowHeld} {
		q.Upto[sql] = strings.Replace(sql, cond, cond+" AND id <= @upto", 1)
	}
	return q
}

// streamTakes is the stream claim's condition on a streamed row e of
// table t: its lane is this
// transaction's or becomes it (the lanes polling relays try-lock), and its
// key has no waiting row below @top outside the batch @batch. The waiting
// keys are read once per statement: a correlated check per row walked the
// batch's own rows for each row, quadratic in the batch size.
func streamTakes(t string) string {
	return "pg_try_advisory_xact_lock(@ns, " + tablesql.Lane("e.partition_key", "@lanes") + "::int)" +
		" AND e.partition_key <> ALL (ARRAY(SELECT o.partition_key FROM " + t + " o" +
		" WHERE o.published_at IS NULL AND o.parked_at IS NULL AND o.id < @top AND o.id <> ALL(@batch::bigint[])))"
}

// Commit is how a batch transaction commits (see TxSettings).
type Commit int

const (
	// CommitDefault leaves synchronous_commit as the server has it.
	CommitDefault Commit = iota
	// CommitSync sets synchronous_commit on.
	CommitSync
	// CommitAsync sets synchronous_commit off.
	CommitAsync
)

// TxSettings returns the statement that sets a batch transaction's
// settings (either progress mode), its argument $1 the
// idle_in_transaction_session_timeout in milliseconds: no parallel plans
// and no JIT; for cursor progress's statements no sequential scans and
// generic plans (they are prepared once per connection, and their custom
// plans cost more to make, about 1 ms each, the planner weighing every CTE
// for the values at hand, than their generic plan takes to run); and
// synchronous_commit as commit says.
func TxSettings(cursor bool, commit Commit) string { return settings(cursor, commit, "true") }

// SessionSettings is TxSettings for a whole session: that of a connection
// the relay keeps for itself, whose batches then need no statement for
// them.
func SessionSettings(cursor bool, commit Commit) string { return settings(cursor, commit, "false") }

func settings(cursor bool, commit Commit, local string) string {
	sql := "SELECT " + setConfig("idle_in_transaction_session_timeout", "$1", local) + ", " +
		setConfig("max_parallel_workers_per_gather", "'0'", local) + ", " + setConfig("jit", "'off'", local)
	if cursor {
		sql += ", " + setConfig("enable_seqscan", "'off'", local) + ", " + setConfig("plan_cache_mode", "'force_generic_plan'", local)
	}
	switch commit {
	case CommitSync:
		sql += ", " + setConfig("synchronous_commit", "'on'", local)
	case CommitAsync:
		sql += ", " + setConfig("synchronous_commit", "'off'", local)
	}
	return sql
}

// setConfig is set_config of name to the SQL expression value, for the
// transaction (local "true") or the session ("false").
func setConfig(name, value, local string) string {
	return "set_config('" + name + "', " + value + ", " + local + ")"
}
