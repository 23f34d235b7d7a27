// Package cursor is the relay's cursor progress: where each lane of an
// outbox table stands, as PostgreSQL snapshots, so that delivering an event
// writes nothing to its row.
//
// A lane's events are delivered in windows. A window is every event of the
// lane whose transaction committed after the snapshot done and before the
// snapshot upto (visible in upto, not in done), the batches of PgQ. Inside a
// window the events go in id order: pos says that every event of the window
// up to it was delivered, and skip lists the ids past pos delivered already
// (those behind a key that waits for its retry). When the window is read to
// its end and nothing in it waits, upto becomes done and the next window
// opens at the next claim, with the snapshot of that moment.
//
// An open transaction holds back only its own events: it is in the xip list
// of the snapshots taken while it runs, so its rows fall in the first window
// whose upto sees it committed, and the others' rows flow meanwhile. Such a
// late row may have a lower id than the rows delivered before it; a window
// finds those (id <= base, the highest id its lane's last window covered)
// through the (txid, id) index when it opens, and starts its id-ordered
// scan at the lowest of them (floor).
//
// The package owns the SQL text, the arithmetic of positions and the
// engine that runs them (Engine: the claims of the lanes' windows, the idle
// lanes' sweep, the save of the positions, and the lanes a worker keeps
// between batches, Keeper); the relay owns the transaction, the charges of
// what it published, and the publishing.
package cursor

import (
	"slices"
	"strconv"
	"strings"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/tablesql"
	"github.com/fxoutbox/outbox/relay/internal/lanelock"
)

// Lane is one lane's position, as stored in the positions table.
type Lane struct {
	Lane int32 `json:"lane"`
	// Done is the snapshot (pg_snapshot's text form) up to which the lane
	// is delivered.
	Done string `json:"done"`
	// Upto ends the open window; "" when the window is closed.
	Upto string `json:"upto,omitempty"`
	// Base is the highest id the lane's last window covered (its Top, once
	// it was read to its end): a new window's rows at or below it are
	// late rows.
	Base int64 `json:"base"`
	// Pos, Floor and Skip place an open window: every window row with an
	// id below Floor or up to Pos is delivered, and so are those in Skip.
	Pos   int64   `json:"pos,omitempty"`
	Floor int64   `json:"floor,omitempty"`
	Skip  []int64 `json:"skip,omitempty"`
	// Top is the highest id visible when the window opened: no row of the
	// window has a higher one.
	Top int64 `json:"top,omitempty"`
}

// Equal reports whether two positions are the same.
func (l Lane) Equal(o Lane) bool {
	return l.Lane == o.Lane && l.Done == o.Done && l.Upto == o.Upto && l.Base == o.Base && l.Pos == o.Pos &&
		l.Floor == o.Floor && l.Top == o.Top && slices.Equal(l.Skip, o.Skip)
}

// Open reports whether the lane has an open window.
func (l Lane) Open() bool { return l.Upto != "" }

// Start is the id after which the lane's next read begins.
func (l Lane) Start() int64 {
	if !l.Open() {
		return l.Base
	}
	return max(l.Pos, l.Floor-1)
}

// Outcome is what became of one row a batch read.
type Outcome struct {
	ID       int64
	Resolved bool // published, or parked: it never needs sending again
}

// Advance returns a lane's position after a batch that read rows (the
// lane's, in id order, with their outcomes) from its window. full says the
// read stopped at its limit, at id last: the window may hold more past it,
// unless last reached Top.
// A row that is not resolved stops the lane before it (the ids resolved
// past it go to Skip); a window read to its end with every row resolved
// closes.
func Advance(l Lane, rows []Outcome, full bool, last int64) Lane {
	first := int64(-1) // the first unresolved row
	for _, o := range rows {
		if !o.Resolved {
			first = o.ID
			break
		}
	}
	highest := l.Base
	for _, o := range rows {
		highest = max(highest, o.ID)
	}
	if full {
		highest = max(highest, last)
	}
	switch {
	case first >= 0:
		l.Pos = max(l.Pos, first-1)
		skip := l.Skip[:0:0]
		for _, id := range l.Skip {
			if id > l.Pos {
				skip = append(skip, id)
			}
		}
		for _, o := range rows {
			if o.Resolved && o.ID > l.Pos {
				skip = append(skip, o.ID)
			}
		}
		slices.Sort(skip)
		l.Skip = slices.Compact(skip)
	case full && last < l.Top:
		l.Pos = max(l.Pos, last)
		skip := l.Skip[:0:0]
		for _, id := range l.Skip {
			if id > l.Pos {
				skip = append(skip, id)
			}
		}
		l.Skip = skip
	default:
		// Read to its end, nothing waiting: the window is delivered, and
		// with it every row of the lane up to Top that upto sees. A row
		// at or below Top that the next window holds committed after
		// upto: a late row, which that window finds by its txid. So the
		// base moves to Top even when the lane had no row in the window,
		// and the next read starts there instead of at the lane's last
		// row: a quiet lane no longer makes every read scan the rows the
		// busy lanes delivered since.
		highest = max(highest, l.Top)
		l.Done, l.Upto = l.Upto, ""
		l.Pos, l.Floor, l.Top, l.Skip = 0, 0, 0, nil
	}
	l.Base = max(l.Base, highest)
	return l
}

// SkipCap is the most ids a lane's Skip holds: while a key of the lane waits
// for its retry, the lane's other keys go on for this many events, then the
// lane waits too.
const SkipCap = 1000

// Queries are the statements of one table's cursor progress.
type Queries struct {
	// Init creates the lanes' rows that do not exist, at the snapshot of
	// the table's first unpublished row (marks mode's backlog is delivered
	// too) or the current one. Lanes that have a row are left out before
	// the insert: ON CONFLICT alone waits for a relay whose batch updated
	// that row (a frozen relay would hold every starting relay back).
	Init string
	// Exists says whether the table and its positions table exist.
	Exists string
	// Check reads the numbers of lanes the positions were made for,
	// whether the server's transaction ids are behind the positions (the
	// table was restored into another cluster), and the unpublished rows
	// that have no txid (written before the cursor migration).
	Check string
	// Find groups the first @window rows waiting in any lane by lane, in
	// order of each lane's first row (the lanes in @owned first: an
	// exactly-once worker's own), and try-locks the lanes that cover the
	// first @n of them (as the marks claim's window does). The lanes'
	// states are its arguments (FindArgs): positions behind the table's
	// only make it find rows that were delivered, never miss one.
	Find string
	// Positions reads every lane's position (the relay's copy for Find).
	Positions string
	// Idle try-locks the closed lanes outside @locked that transactions
	// went past since their done snapshot: a lane without events keeps up
	// that way, so that the late rows of the others are looked for over a
	// short range.
	Idle string
	// Load reads the positions of the lanes in @locked, in a statement
	// after the locks, opening the closed windows at its snapshot. The
	// lanes that the relay kept from earlier batches come as arguments
	// (KeptArgs): their rows are behind what it delivered.
	Load string
	// Kept is Load and Read in one statement, for lanes whose positions
	// the relay gives (KeptReadArgs: the lanes a worker kept across
	// batches, whose rows are behind it): it opens their closed windows at
	// its snapshot, finds those windows' late rows and reads the next @n
	// rows, as Load then Read would. Each row carries the statement's
	// snapshot, the highest id then, and the lowest late row of each lane
	// whose window it opened (see Opened); no row, when the lanes have
	// none to read.
	Kept string
	// Read reads the next @n rows of the lanes' windows, in id order;
	// ReadIDs reads only their ids and lanes (when a row cannot be read).
	// Their arguments are the lanes' states indexed by lane (see
	// ReadArrays).
	Read, ReadIDs string
	// Save writes the lanes' positions.
	Save string
	// Own takes session locks on @lanes in namespace @ns, which the
	// transaction holds already (a lane kept across batches: see
	// docs/progress.md); Release lets them go.
	Own, Release string
	// Cleanup deletes rows older than $1 that every lane delivered, at
	// most $2 of them.
	Cleanup string

	// Parking moves an event out of the table: a copy goes to the parked
	// table and the row is deleted, in the transaction that moves the
	// lane's position past it (the position never waits on a parked row,
	// and the table's rows are only inserted and deleted).
	//
	// Charge counts a try on each failed row ($1 ids, $2 reasons, $3
	// limits, $4 errors): a row whose tries reach its limit (> 0) is copied
	// to the parked table, the others get the try in their row (attempts,
	// last_error, first_failed_at). It returns each row's id and whether it
	// was parked; Unpark then deletes the parked ones.
	Charge string
	// ChargeUnreadable is Charge for rows that cannot be read (@ids,
	// @errs the reasons, @details, @park: park them, or count the try):
	// the copy is made by the server, which never prints the values. It
	// returns id, event_id, topic, partition_key and whether parked.
	ChargeUnreadable string
	// Unpark deletes the rows of $1 that have their copy in the parked
	// table: a statement after the copy's, so that it sees it (and so may
	// a row-level security policy that lets the relay delete such rows).
	Unpark string
	// Adopt moves the rows parked in place (by a relay of an older
	// version, or in marks mode before the table moved to cursor mode)
	// to the parked table; Unpark's statement for them is AdoptUnpark.
	Adopt, AdoptUnpark string

	// The stream's statements under cursor progress (relay/internal/feed,
	// and the relay's handover of the exactly-once stream's record).
	//
	// TryLockAll try-locks every lane (0 to $2 - 1) in namespace $1 and
	// counts those it could not lock (another relay holds them);
	// TryLockLanes is the same for the lanes of $2 (an int[]).
	TryLockAll, TryLockLanes string
	// Checkpoint moves the closed lanes whose done snapshot is not past
	// @done (the stream's checkpoint: every transaction @done sees is
	// delivered) to @done, their base to at least @base.
	Checkpoint string
	// Dones reads every lane's done snapshot and base, in lane order.
	Dones string
	// Uncovered try-locks, in namespace @ns, the lanes whose position does
	// not cover snapshot @s (see Covers) and returns those it locked.
	Uncovered string
	// Covers reads each lane's done snapshot and whether its position
	// covers snapshot @s: its window is closed and its done snapshot sees
	// every transaction @s sees.
	Covers string
	// KeyLanes returns each key of $1 (a text[]) with its lane among $2
	// lanes; RowLanes returns the id and lane of each row of $1 (a
	// bigint[]) among $2 lanes.
	KeyLanes, RowLanes string
}

// covers says a lane's position covers snapshot @s: its window is closed
// and its done snapshot sees every transaction @s sees.
const covers = "upto IS NULL AND pg_snapshot_xmax(@s::pg_snapshot) <= pg_snapshot_xmax(done)" +
	" AND NOT EXISTS (SELECT FROM pg_snapshot_xip(done) x WHERE x < pg_snapshot_xmax(@s::pg_snapshot)" +
	" AND x NOT IN (SELECT pg_snapshot_xip(@s::pg_snapshot)))"

// parkCols are the columns of an event that the parked table keeps, as
// the table has them.
const parkCols = "id, event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, headers, created_at"

// parkedCopy returns the INSERT into the parked table p of table t's rows
// e joined with f (id, reason, err) where cond holds, with attempts n (an
// expression), returning rets of the parked row. A parked copy of the same
// event (a writer wrote its event again after it was parked) is replaced:
// the newer one is the one to requeue.
func parkedCopy(t, p, cond, n, rets string) string {
	set := []string{}
	for _, c := range strings.Split(parkCols+", reason, last_error, attempts, first_try_at, last_try_at, parked_at", ", ") {
		if c != "event_id" {
			set = append(set, c+" = EXCLUDED."+c)
		}
	}
	return "INSERT INTO " + p + " (" + parkCols + ", reason, last_error, attempts, first_try_at, last_try_at, parked_at)" +
		" SELECT e." + strings.ReplaceAll(parkCols, ", ", ", e.") + ", f.reason, f.err, " + n + ", coalesce(e.first_failed_at, now()), now(), now()" +
		" FROM " + t + " e JOIN f ON e.id = f.id WHERE " + cond +
		" ON CONFLICT (event_id) DO UPDATE SET " + strings.Join(set, ", ") + " RETURNING " + rets
}

// skipArray is the Skip of a lane given as text x.s ("1,2,3", see
// JoinSkip), as the bigint[] the positions table keeps.
const skipArray = "CASE WHEN coalesce(x.s, '') = '' THEN '{}'::bigint[] ELSE coalesce((SELECT array_agg(s::bigint ORDER BY s::bigint) FROM unnest(string_to_array(x.s, ',')) s), '{}') END"

// NewQueries returns the statements for table, its positions table cursor
// and its parked table parked, reading cols (the relay's columns, for
// alias e) in Read.
func NewQueries(table, cursor, parked outbox.Table, cols string) Queries {
	t, c, p := sqlname.Ident(table), sqlname.Ident(cursor), sqlname.Ident(parked)
	const waiting = " AND e.published_at IS NULL AND e.parked_at IS NULL"
	// waitingLate is waiting in a form the planner does not match to the
	// unpublished partial index: in cursor mode that index holds every row,
	// but after a move from marks the statistics say it holds few, and the
	// late rows' scan would walk it whole instead of the (txid, id) index.
	const waitingLate = " AND coalesce(e.published_at, e.parked_at) IS NULL"
	// inWindow: row e belongs to lane state c's window (upto NULL: the
	// window the next claim opens, ending now).
	const inWindow = " NOT pg_visible_in_snapshot(e.txid, c.done) AND (c.upto IS NULL OR pg_visible_in_snapshot(e.txid, c.upto))"
	// The lanes' states are arrays indexed by lane + 1 (NULL for a lane
	// not in the statement), read once per statement: a row's lane picks
	// its state by subscript, so the scan stays an index scan in id order
	// that stops at its LIMIT (a join with the states made the planner sort
	// the whole backlog by lane).
	ln := tablesql.Lane("e.partition_key", "@lanes") + " + 1"
	// read: the lanes' states arrive as arrays indexed by lane + 1, built
	// by the relay (NULL for a lane not in the batch), and are converted
	// once per statement (the scalar subqueries).
	read := func(cols string) string {
		return "SELECT " + cols + " FROM " + t + " e" +
			" WHERE e.id > @from AND e.id > ((SELECT @starts::bigint[]))[" + ln + "]" +
			" AND NOT pg_visible_in_snapshot(e.txid, ((SELECT @dones::text[]::pg_snapshot[]))[" + ln + "])" +
			" AND pg_visible_in_snapshot(e.txid, ((SELECT @uptos::text[]::pg_snapshot[]))[" + ln + "])" +
			" AND e.id <> ALL(@skip::bigint[])" + waiting +
			" ORDER BY e.id LIMIT @n"
	}
	// given: the lanes' states for Find, from its arguments (see
	// FindArgs): the relay keeps the positions it last read and wrote, so
	// that a claim does not read every lane's row (a long transaction
	// elsewhere keeps their old versions, and the table grows).
	given := "WITH k AS MATERIALIZED (SELECT @start::bigint AS start, @dones::text[]::pg_snapshot[] AS dones, @closed::bool[] AS closed," +
		" @starts::bigint[] AS starts, @bases::bigint[] AS bases, @skips::bigint[] AS skips, @xips::text[]::xid8[] AS xips," +
		" @xmax::text::xid8 AS xmax, @base::bigint AS base)"
	// late: a closed lane's rows at or below its base that its next window
	// holds (txid from the (txid, id) index, the other conditions per row).
	// "e.id + 0" keeps the planner off the id indexes: an id range at or
	// below base is every row the table holds (the unpublished partial
	// index holds them all in cursor mode), while the txid range is the
	// few rows of transactions that were running.
	late := func(from, txid string) string {
		return "(SELECT e.id, " + ln + " - 1 AS lane FROM " + from + " WHERE " + txid + " AND e.id + 0 <= (SELECT base FROM k)" +
			" AND ((SELECT closed FROM k))[" + ln + "] AND e.id <= ((SELECT bases FROM k))[" + ln + "]" +
			" AND NOT pg_visible_in_snapshot(e.txid, ((SELECT dones FROM k))[" + ln + "])" + waitingLate +
			" ORDER BY e.txid LIMIT @window)"
	}
	// byXip: the rows of the transactions running at the done snapshots,
	// an index probe per transaction. As "txid = ANY(xips)" the planner
	// weighs the probes by the table's statistics, and where transactions
	// wrote many rows each (a batch writer, a bulk load) it chose to scan
	// the whole table; a lateral probe per transaction has no such choice.
	byXip := "unnest((SELECT xips FROM k)::xid8[]) x(xid) CROSS JOIN LATERAL (SELECT * FROM " + t + " e WHERE e.txid = x.xid OFFSET 0) e"
	// opened: the late rows of the lanes whose windows this statement
	// opens (at or below the lane's base, in the window): txid from the
	// (txid, id) index, the rest per row.
	opened := func(from, txid string) string {
		return "(SELECT e.id, " + ln + " - 1 AS lane FROM " + from + " WHERE " + txid + " AND e.id + 0 <= (SELECT base FROM k)" +
			" AND ((SELECT opening FROM k))[" + ln + "] AND e.id <= ((SELECT bases FROM k))[" + ln + "]" +
			" AND NOT pg_visible_in_snapshot(e.txid, ((SELECT dones FROM k))[" + ln + "])" +
			" AND pg_visible_in_snapshot(e.txid, (SELECT now FROM s))" + waitingLate + " ORDER BY e.txid)"
	}
	// snapTop opens a statement that opens windows: its snapshot (now)
	// and the highest id it sees (top). lateOpened (after k, the opening
	// lanes' arrays) are the late rows of the windows it opens.
	snapTop := "WITH s AS MATERIALIZED (SELECT pg_current_snapshot() AS now, coalesce((SELECT max(id) FROM " + t + "), 0) AS top),"
	lateOpened := " l AS (" + opened(t+" e", "e.txid >= (SELECT xmax FROM k) AND e.txid < pg_snapshot_xmax((SELECT now FROM s))") +
		" UNION ALL " + opened(byXip, "true") + "),"
	q := Queries{
		Exists: "SELECT to_regclass(" + literal(t) + ") IS NOT NULL AND to_regclass(" + literal(c) + ") IS NOT NULL AND to_regclass(" + literal(p) + ") IS NOT NULL",
		Init: "INSERT INTO " + c + " (lane, lanes, done, base) SELECT g, @lanes, s.done, s.base FROM generate_series(0, @lanes - 1) g," +
			" (SELECT CASE WHEN f.txid IS NULL THEN pg_current_snapshot()" +
			" ELSE (least(f.txid, pg_snapshot_xmin(pg_current_snapshot()))::text || ':' || least(f.txid, pg_snapshot_xmin(pg_current_snapshot()))::text || ':')::pg_snapshot END AS done," +
			" coalesce(f.id - 1, (SELECT max(id) FROM " + t + "), 0) AS base" +
			" FROM (SELECT 1) one LEFT JOIN LATERAL (SELECT min(e.txid) AS txid, min(e.id) AS id FROM " + t + " e WHERE e.txid IS NOT NULL" + waiting + ") f ON true) s" +
			" WHERE NOT EXISTS (SELECT FROM " + c + " x WHERE x.lane = g)" +
			" ON CONFLICT (lane) DO NOTHING",
		Check: "SELECT coalesce((SELECT array_agg(DISTINCT lanes) FROM " + c + "), '{}')," +
			" coalesce((SELECT max(pg_snapshot_xmax(done)) > pg_snapshot_xmax(pg_current_snapshot()) FROM " + c + "), false)," +
			" (SELECT count(*) FROM (SELECT 1 FROM " + t + " e WHERE e.txid IS NULL" + waiting + " LIMIT 1000) x)",
		// The waiting rows past each lane's start (its window's, or all
		// those its next window opens on), and, of the closed lanes, the
		// late rows at or below their base: rows of the transactions in
		// done's xip list, or past its xmax (a row whose id was drawn
		// before its transaction's id).
		Find: given + "," +
			" w AS ((SELECT e.id, " + ln + " - 1 AS lane FROM " + t + " e" +
			" WHERE e.id > (SELECT start FROM k) AND e.id > ((SELECT starts FROM k))[" + ln + "]" +
			" AND NOT pg_visible_in_snapshot(e.txid, ((SELECT dones FROM k))[" + ln + "]) AND e.id <> ALL((SELECT skips FROM k)::bigint[])" + waiting +
			" ORDER BY e.id LIMIT @window)" +
			" UNION ALL " + late(t+" e", "e.txid >= (SELECT xmax FROM k)") +
			" UNION ALL " + late(byXip, "true") + ")" +
			" SELECT lane, cnt, CASE WHEN before < @n THEN pg_try_advisory_xact_lock(@ns, lane) END FROM (" +
			"SELECT lane, count(*)::int AS cnt, min(id) AS first, lane = ANY(coalesce(@owned::int[], '{}')) AS mine," +
			" coalesce(sum(count(*)) OVER (ORDER BY lane = ANY(coalesce(@owned::int[], '{}')) DESC, min(id) ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS before" +
			" FROM (SELECT DISTINCT id, lane FROM w) w GROUP BY lane) g ORDER BY mine DESC, first",
		// Load opens each closed window at this statement's snapshot: its
		// floor is the lowest late row (at or below base), found through
		// the (txid, id) index.
		Load: snapTop +
			" c AS MATERIALIZED (SELECT c.lane, c.done, coalesce(c.upto, s.now) AS upto, c.upto IS NULL AS opening, c.base, c.pos, c.floor, c.top, c.skip" +
			" FROM " + c + " c, s WHERE c.lane = ANY(@locked::int[]) AND c.lane <> ALL(@kl::int[])" +
			" UNION ALL SELECT x.l, x.d::pg_snapshot, coalesce(x.u::pg_snapshot, s.now), x.u IS NULL, x.b, x.p, x.f, x.t, " + skipArray +
			" FROM unnest(@kl::int[], @kd::text[], @ku::text[], @kb::bigint[], @kp::bigint[], @kf::bigint[], @kt::bigint[], @ks::text[]) AS x(l, d, u, b, p, f, t, s), s" +
			" WHERE x.l = ANY(@locked::int[]))," +
			" k AS MATERIALIZED (SELECT ARRAY(SELECT c.opening FROM generate_series(0, @lanes - 1) g LEFT JOIN c ON c.lane = g ORDER BY g) AS opening," +
			" ARRAY(SELECT c.done FROM generate_series(0, @lanes - 1) g LEFT JOIN c ON c.lane = g ORDER BY g) AS dones," +
			" ARRAY(SELECT c.base FROM generate_series(0, @lanes - 1) g LEFT JOIN c ON c.lane = g ORDER BY g) AS bases," +
			" (SELECT min(pg_snapshot_xmax(done)) FROM c WHERE opening) AS xmax, (SELECT max(base) FROM c WHERE opening) AS base," +
			" coalesce((SELECT array_agg(DISTINCT x) FROM c, pg_snapshot_xip(c.done) x WHERE c.opening), '{}') AS xips)," +
			lateOpened +
			" late AS (SELECT lane, min(id) AS id FROM l GROUP BY lane)" +
			" SELECT c.lane, c.done::text, c.upto::text, c.base, CASE WHEN c.opening THEN 0 ELSE c.pos END," +
			" CASE WHEN c.opening THEN least(c.base + 1, late.id) ELSE c.floor END, CASE WHEN c.opening THEN '{}' ELSE c.skip END," +
			" CASE WHEN c.opening THEN (SELECT top FROM s) ELSE c.top END" +
			" FROM c LEFT JOIN late ON late.lane = c.lane ORDER BY c.lane",
		Kept: snapTop +
			" k AS MATERIALIZED (SELECT @opening::bool[] AS opening, @dones::text[]::pg_snapshot[] AS dones, @bases::bigint[] AS bases," +
			" @uptos::text[]::pg_snapshot[] AS uptos, @starts::bigint[] AS starts, @xmax::text::xid8 AS xmax, @base::bigint AS base," +
			" @xips::text[]::xid8[] AS xips)," +
			lateOpened +
			" m AS MATERIALIZED (SELECT lane, min(id) AS id FROM l GROUP BY lane)," +
			// A lane whose window opens on late rows starts below them.
			" f AS MATERIALIZED (SELECT CASE WHEN EXISTS (SELECT FROM m) THEN (SELECT array_agg(CASE WHEN m.id IS NULL THEN u.st ELSE least(u.st, m.id - 1) END ORDER BY u.i)" +
			" FROM unnest((SELECT starts FROM k)) WITH ORDINALITY u(st, i) LEFT JOIN m ON m.lane = u.i - 1) ELSE (SELECT starts FROM k) END AS starts)," +
			" r AS (SELECT " + cols + ", " + ln + " - 1 AS lane FROM " + t + " e" +
			" WHERE e.id > least(@from::bigint, (SELECT min(id) - 1 FROM m)) AND e.id > ((SELECT starts FROM f))[" + ln + "]" +
			" AND NOT pg_visible_in_snapshot(e.txid, ((SELECT dones FROM k))[" + ln + "])" +
			" AND pg_visible_in_snapshot(e.txid, coalesce(((SELECT uptos FROM k))[" + ln + "], (SELECT now FROM s)))" +
			" AND e.id <> ALL(@skip::bigint[])" + waiting +
			" ORDER BY e.id LIMIT @n)" +
			" SELECT r.*, (SELECT now::text FROM s), (SELECT top FROM s)," +
			" coalesce((SELECT array_agg(lane ORDER BY lane) FROM m), '{}'), coalesce((SELECT array_agg(id ORDER BY lane) FROM m), '{}')" +
			" FROM r ORDER BY r.id",
		Positions: "SELECT lane, done::text, coalesce(upto::text, ''), base, coalesce(pos, 0), coalesce(floor, base + 1), coalesce(top, 0), coalesce(skip, '{}') FROM " + c,
		Read:      read(cols + ", " + ln + " - 1"),
		ReadIDs:   read("e.id, " + ln + " - 1"),
		Save: "UPDATE " + c + " c SET done = x.d::pg_snapshot, upto = x.u::pg_snapshot, base = x.b, pos = x.p, floor = x.f, top = x.t," +
			" skip = " + skipArray + ", updated_at = now()" +
			" FROM unnest(@lane::int[], @done::text[], @upto::text[], @base::bigint[], @pos::bigint[], @floor::bigint[], @top::bigint[], @skip::text[]) AS x(l, d, u, b, p, f, t, s)" +
			" WHERE c.lane = x.l",
		Own:     lanelock.Own,
		Release: lanelock.Release,
		Idle: "SELECT lane FROM (SELECT lane FROM " + c + " WHERE upto IS NULL AND lane <> ALL(coalesce(@locked::int[], '{}'))" +
			" AND pg_snapshot_xmax(done) < pg_snapshot_xmax(pg_current_snapshot()) OFFSET 0) s WHERE pg_try_advisory_xact_lock(@ns, lane)",
		// Cleanup deletes rows that their lane's done snapshot holds.
		Cleanup: "DELETE FROM " + t + " WHERE id IN (SELECT e.id FROM " + t + " e WHERE e.created_at < $1 AND e.parked_at IS NULL" +
			" AND (e.published_at < $1 OR EXISTS (SELECT FROM " + c + " c WHERE c.lane = " + tablesql.Lane("e.partition_key", "c.lanes") + "" +
			" AND pg_visible_in_snapshot(e.txid, c.done))) LIMIT $2 FOR UPDATE SKIP LOCKED)",
	}
	// A negative attempts (written by hand) counts as 0.
	const tries = "greatest(e.attempts, 0) + 1"
	const full = "f.lim > 0 AND " + tries + " >= f.lim"
	q.Charge = "WITH f AS (SELECT * FROM unnest($1::bigint[], $2::text[], $3::int[], $4::text[]) AS f(id, reason, lim, err))," +
		" p AS (" + parkedCopy(t, p, full, tries, "id") + ")," +
		" u AS (UPDATE " + t + " e SET attempts = " + tries + ", last_error = f.reason, first_failed_at = coalesce(e.first_failed_at, now())" +
		" FROM f WHERE e.id = f.id AND NOT (" + full + ") RETURNING e.id)" +
		" SELECT id, true FROM p UNION ALL SELECT id, false FROM u"
	const unread = "e.published_at IS NULL AND e.parked_at IS NULL"
	q.ChargeUnreadable = "WITH f AS (SELECT * FROM unnest(@ids::bigint[], @errs::text[], @details::text[]) AS f(id, reason, err))," +
		" p AS (" + parkedCopy(t, p, "@park::bool AND "+unread, tries, "id, event_id, topic, partition_key") + ")," +
		" u AS (UPDATE " + t + " e SET attempts = " + tries + ", last_error = f.reason, first_failed_at = coalesce(e.first_failed_at, now())" +
		" FROM f WHERE e.id = f.id AND NOT @park::bool AND " + unread + " RETURNING e.id, e.event_id, e.topic, e.partition_key)" +
		" SELECT id, event_id, topic, partition_key, true FROM p UNION ALL SELECT id, event_id, topic, partition_key, false FROM u"
	q.Unpark = "DELETE FROM " + t + " e USING " + p + " x WHERE e.id = ANY($1::bigint[]) AND x.id = e.id AND x.event_id = e.event_id"
	q.Adopt = "INSERT INTO " + p + " (" + parkCols + ", reason, last_error, attempts, first_try_at, last_try_at, parked_at)" +
		" SELECT e." + strings.ReplaceAll(parkCols, ", ", ", e.") + ", coalesce(e.last_error, ''), e.last_error, e.attempts, e.first_failed_at, e.parked_at, e.parked_at" +
		" FROM " + t + " e WHERE e.parked_at IS NOT NULL AND e.published_at IS NULL ON CONFLICT DO NOTHING"
	q.AdoptUnpark = "DELETE FROM " + t + " e USING " + p + " x WHERE e.parked_at IS NOT NULL AND e.published_at IS NULL AND x.id = e.id AND x.event_id = e.event_id"
	q.TryLockAll = "SELECT count(*) FILTER (WHERE NOT pg_try_advisory_xact_lock($1, g)) FROM generate_series(0, $2 - 1) g"
	q.TryLockLanes = "SELECT count(*) FILTER (WHERE NOT pg_try_advisory_xact_lock($1, g)) FROM unnest($2::int[]) g"
	q.Checkpoint = "UPDATE " + c + " SET done = @done::pg_snapshot, upto = NULL, base = greatest(base, @base), pos = 0, floor = 0, top = 0, skip = '{}', updated_at = now()" +
		" WHERE upto IS NULL AND pg_snapshot_xmax(done) <= pg_snapshot_xmax(@done::pg_snapshot)"
	q.Dones = "SELECT done::text, base FROM " + c + " ORDER BY lane"
	q.Uncovered = "SELECT lane FROM (SELECT lane FROM " + c + " WHERE NOT (" + covers + ") OFFSET 0) s WHERE pg_try_advisory_xact_lock(@ns, lane)"
	q.Covers = "SELECT done::text, " + covers + " FROM " + c
	q.KeyLanes = "SELECT k, " + tablesql.Lane("k", "$2::int") + " FROM unnest($1::text[]) k"
	q.RowLanes = "SELECT id, " + tablesql.Lane("partition_key", "$2::int") + " FROM " + t + " WHERE id = ANY($1::bigint[])"
	return q
}

// FindArgs returns Find's arguments for the lanes' positions pos (a lane
// without one is NULL: none of its rows is found).
func FindArgs(lanes int, pos map[int32]Lane) map[string]any {
	dones, starts, bases := make([]*string, lanes), make([]*int64, lanes), make([]*int64, lanes)
	closed := make([]*bool, lanes)
	skips := []int64{}
	var start *int64
	var cl closedLanes
	for id, l := range pos {
		if id < 0 || int(id) >= lanes {
			continue
		}
		d, st, b, c := l.Done, l.Start(), l.Base, !l.Open()
		dones[id], starts[id], bases[id], closed[id] = &d, &st, &b, &c
		skips = append(skips, l.Skip...)
		if start == nil || st < *start {
			start = &st
		}
		if c {
			cl.add(l)
		}
	}
	if start == nil {
		zero := int64(0)
		start = &zero
	}
	return map[string]any{"start": *start, "dones": dones, "closed": closed, "starts": starts, "bases": bases,
		"skips": skips, "xips": cl.xipList(), "xmax": cl.xmaxText(), "base": cl.base}
}

// closedLanes gathers what the late rows' search needs of the closed lanes
// whose windows a statement opens: their highest base, the lowest xmax of
// their done snapshots, and those snapshots' running transactions.
type closedLanes struct {
	base *int64
	xmax *uint64
	xips []string
	seen map[string]bool
}

func (c *closedLanes) add(l Lane) {
	if c.base == nil || l.Base > *c.base {
		b := l.Base
		c.base = &b
	}
	x, xip := snapshotParts(l.Done)
	if c.xmax == nil || x < *c.xmax {
		c.xmax = &x
	}
	if c.seen == nil {
		c.seen = map[string]bool{}
	}
	for _, v := range xip {
		if !c.seen[v] {
			c.seen[v] = true
			c.xips = append(c.xips, v)
		}
	}
}

// xipList is the running transactions, never nil (a NULL array matches no
// row).
func (c *closedLanes) xipList() []string {
	if c.xips == nil {
		return []string{}
	}
	return c.xips
}

// xmaxText is the lowest xmax as text (xid8's input), nil without a lane.
func (c *closedLanes) xmaxText() *string {
	if c.xmax == nil {
		return nil
	}
	t := strconv.FormatUint(*c.xmax, 10)
	return &t
}

// snapshotParts returns a pg_snapshot's xmax and its xip list, from its
// text form "xmin:xmax:xip,...". A malformed one gives 0 (every
// transaction counts as past it: the lane's rows are looked for widely).
func snapshotParts(s string) (xmax uint64, xip []string) {
	parts := strings.SplitN(s, ":", 3)
	if len(parts) != 3 {
		return 0, nil
	}
	xmax, _ = strconv.ParseUint(parts[1], 10, 64)
	if parts[2] != "" {
		xip = strings.Split(parts[2], ",")
	}
	return xmax, xip
}

// ReadArrays returns Read's arguments @dones, @uptos and @starts for the
// lanes' positions: arrays of length lanes, NULL where a lane is not read.
func ReadArrays(lanes int, pos map[int32]Lane) (dones, uptos []*string, starts []*int64) {
	dones, uptos, starts = make([]*string, lanes), make([]*string, lanes), make([]*int64, lanes)
	for id, l := range pos {
		if id < 0 || int(id) >= lanes {
			continue
		}
		d, u, st := l.Done, l.Upto, l.Start()
		dones[id], uptos[id], starts[id] = &d, &u, &st
	}
	return dones, uptos, starts
}

// literal quotes s as an SQL string literal.
func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// JoinSkip is Skip in the text form Save takes ("1,2,3").
func JoinSkip(ids []int64) string {
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = strconv.FormatInt(id, 10)
	}
	return strings.Join(parts, ",")
}

// KeptArgs returns Load's arguments for the positions of the lanes a relay
// kept (their rows in the table are behind them): @kl, @kd, @ku, @kb, @kp,
// @kf, @kt and @ks, as Save's.
func KeptArgs(kept []Lane) map[string]any {
	n := len(kept)
	lane, done, upto, skip := make([]int32, 0, n), make([]string, 0, n), make([]*string, 0, n), make([]string, 0, n)
	base, pos, floor, top := make([]int64, 0, n), make([]int64, 0, n), make([]int64, 0, n), make([]int64, 0, n)
	for _, l := range kept {
		lane, done, base, pos, floor, top = append(lane, l.Lane), append(done, l.Done), append(base, l.Base), append(pos, l.Pos), append(floor, l.Floor), append(top, l.Top)
		var u *string
		if l.Upto != "" {
			u = &l.Upto
		}
		upto, skip = append(upto, u), append(skip, JoinSkip(l.Skip))
	}
	return map[string]any{"kl": lane, "kd": done, "ku": upto, "kb": base, "kp": pos, "kf": floor, "kt": top, "ks": skip}
}

// KeptReadArgs returns Kept's arguments for the positions of the lanes a
// relay kept, and @from, @skip: as Load's then Read's would be, but for
// the snapshot, which Kept takes.
func KeptReadArgs(lanes int, kept []Lane) map[string]any {
	opening, dones, uptos := make([]*bool, lanes), make([]*string, lanes), make([]*string, lanes)
	bases, starts := make([]*int64, lanes), make([]*int64, lanes)
	skip := []int64{}
	var from *int64
	var cl closedLanes
	for _, l := range kept {
		if l.Lane < 0 || int(l.Lane) >= lanes {
			continue
		}
		o, d, b := !l.Open(), l.Done, l.Base
		opening[l.Lane], dones[l.Lane], bases[l.Lane] = &o, &d, &b
		// An opening window starts at its base (Kept lowers that to its
		// late rows), an open one where it stands.
		st := l.Start()
		starts[l.Lane] = &st
		if from == nil || st < *from {
			from = &st
		}
		if l.Open() {
			u := l.Upto
			uptos[l.Lane] = &u
			skip = append(skip, l.Skip...)
			continue
		}
		cl.add(l)
	}
	if from == nil {
		zero := int64(0)
		from = &zero
	}
	return map[string]any{"opening": opening, "dones": dones, "uptos": uptos, "bases": bases, "starts": starts,
		"xmax": cl.xmaxText(), "base": cl.base, "xips": cl.xipList(), "from": *from, "skip": skip}
}

// Opened returns the position of kept lane l after Kept read with the
// snapshot now, the highest id top and the lowest late row of the lanes
// whose windows it opened (lates, by lane): a closed window opens at now,
// as Load opens it.
func Opened(l Lane, now string, top int64, lates map[int32]int64) Lane {
	if l.Open() {
		return l
	}
	l.Upto, l.Pos, l.Skip, l.Top = now, 0, []int64{}, top
	l.Floor = l.Base + 1
	if id, ok := lates[l.Lane]; ok && id < l.Floor {
		l.Floor = id
	}
	return l
}
