package relay

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/tablesql"
	"github.com/fxoutbox/outbox/relay/internal/claim"
	"github.com/fxoutbox/outbox/relay/internal/cursor"
	"github.com/fxoutbox/outbox/relay/internal/lazytx"
)

// Progress says how a relay records what it delivered.
type Progress int

const (
	// ProgressAuto (the default) follows the table: ProgressCursor where
	// the table has the cursor migration and either a relay already
	// recorded cursor progress on it, or migrations.Install made it with
	// the migration (fxoutbox's OUTBOX_MIGRATE on a new table), or it is
	// partitioned; ProgressMarks otherwise, and always under Ordering
	// Unordered. A table given the cursor migration later stays on marks
	// until its first relay with ProgressCursor starts (its marks relays
	// may still be delivering the events written before; see "Turning it
	// on" in docs/progress.md). The relay reads the table at Start, or at
	// its first batch when the database could not be reached then, logs
	// what it chose, and reports it in Relay.Progress. When the table goes
	// over to cursor progress under a relay that chose marks, its batches
	// fail with ErrCursorTable within 10s instead of sending again what the
	// cursor delivers; restarted, it records cursor progress.
	ProgressAuto Progress = iota
	// ProgressMarks sets published_at on each delivered
	// row: an UPDATE per event (a new tuple, an entry in every index, a
	// dead tuple for vacuum), and Retention deletes the rows later.
	ProgressMarks
	// ProgressCursor records, per lane, the snapshot up to which the lane
	// is delivered and its place in the window after it (see
	// docs/progress.md): one small UPDATE of the lanes' rows per batch and
	// nothing per event, so an event costs the table its INSERT. An open
	// transaction holds back only its own events. It needs the cursor
	// migration (migrations.Cursor.Up) and Ordering PerKey; in Stream mode
	// the relay publishes what the slot decodes and the positions are its
	// checkpoint, once a second (docs/streaming.md); under
	// ExactlyOnce each lane's position also travels in the progress record
	// of its Kafka transaction. A parked event moves to the parked table
	// (<name>_parked) in the transaction that moves its lane past it; a
	// requeue writes it back into the table with a new id and txid, which
	// the next window takes.
	ProgressCursor
)

func (p Progress) String() string {
	switch p {
	case ProgressAuto:
		return "auto"
	case ProgressMarks:
		return "marks"
	case ProgressCursor:
		return "cursor"
	}
	return "Progress(" + strconv.Itoa(int(p)) + ")"
}

// validateProgress checks Progress and what ProgressCursor needs.
func (c Config) validateProgress() error {
	bad := func(why string) error {
		return &outbox.ConfigError{Field: "Progress", Reason: fmt.Sprintf("is %v: %s", c.Progress, why)}
	}
	switch {
	case c.Progress == ProgressMarks || c.Progress == ProgressAuto:
		return nil
	case c.Progress != ProgressCursor:
		return bad("use relay.ProgressAuto, relay.ProgressMarks or relay.ProgressCursor")
	case c.Ordering != PerKey:
		return bad("needs Ordering PerKey: the positions are kept per lane")
	}
	return nil
}

// cursorCols are the columns a cursor claim reads, as claim's.
const cursorCols = "e.id, e.event_id, e.event_type, e.topic, e.partition_key, e.payload, e.headers, e.attempts, e.created_at, e.attempts = 0 AND e.last_error IS NOT NULL"

// cursorTable is the positions table of t (sqlname.Cursor).
func cursorTable(t outbox.Table) outbox.Table {
	t = t.WithDefaults()
	return outbox.Table{Schema: t.Schema, Name: t.Name + "_cursor"}
}

// parkedTable is the parked events' table of t in cursor mode
// (sqlname.Parked).
func parkedTable(t outbox.Table) outbox.Table {
	t = t.WithDefaults()
	return outbox.Table{Schema: t.Schema, Name: t.Name + "_parked"}
}

// cursorState is a relay's cursor progress: its statements, and whether
// the lanes' rows were checked and created.
type cursorState struct {
	q     cursor.Queries
	mu    sync.Mutex
	ready bool
	// checked: when the positions were last checked against the server
	// (see cursorReady).
	checked time.Time
	// idleAt (unix nanoseconds): when a claim next takes the idle lanes
	// along (see cursorClaim).
	idleAt atomic.Int64

	// known is the relay's copy of the lanes' positions, which Find takes
	// as arguments instead of reading every lane's row per claim: read
	// whole once a second (knownAt), and lane by lane from what this
	// relay's batches read and committed. It may be behind the table
	// (other relays' progress, up to a second), which only makes Find
	// look at rows already delivered; it is never ahead, but for a moment
	// after a batch that failed (then it is read again).
	kmu     sync.Mutex
	known   map[int32]cursor.Lane
	knownAt time.Time

	// keepEvery and keepFind replace keepSaveEvery and keptFindEvery
	// when positive (tests).
	keepEvery, keepFind time.Duration
	// keptClaims counts the claims that read the kept lanes without Find
	// and had events to send (tests).
	keptClaims atomic.Int64
	// keptUnreadable counts the reads of kept lanes in one statement that
	// met a row that could not be read (tests).
	keptUnreadable atomic.Int64
	// keptFreed counts the kept lanes let go (see laneKeeper.committed;
	// tests).
	keptFreed atomic.Int64
}

// knownEvery is how often a relay reads every lane's position.
const knownEvery = time.Second

// findArgs returns Find's arguments from the positions known, reading
// them all when the copy is older than knownEvery.
func (r *Relay) findArgs(ctx context.Context, tx pgx.Tx, k *laneKeeper) (map[string]any, error) {
	c := r.cur
	c.kmu.Lock()
	stale := c.known == nil || time.Since(c.knownAt) >= knownEvery
	c.kmu.Unlock()
	if stale {
		rows, err := tx.Query(ctx, c.q.Positions)
		if err != nil {
			return nil, fmt.Errorf("relay: read the lanes' positions in %s: %w", r.cfg.Table, err)
		}
		all := map[int32]cursor.Lane{}
		var l cursor.Lane
		if _, err = pgx.ForEachRow(rows, []any{&l.Lane, &l.Done, &l.Upto, &l.Base, &l.Pos, &l.Floor, &l.Top, &l.Skip}, func() error {
			all[l.Lane] = l
			l = cursor.Lane{}
			return nil
		}); err != nil {
			return nil, fmt.Errorf("relay: read the lanes' positions in %s: %w", r.cfg.Table, err)
		}
		c.kmu.Lock()
		c.known, c.knownAt = all, time.Now()
		c.kmu.Unlock()
	}
	c.kmu.Lock()
	defer c.kmu.Unlock()
	if !k.keeping() || len(k.lanes) == 0 {
		return cursor.FindArgs(r.cfg.Lanes, c.known), nil
	}
	// The lanes the worker keeps stand where it left them.
	pos := make(map[int32]cursor.Lane, len(c.known))
	for id, l := range c.known {
		pos[id] = l
	}
	for id, l := range k.lanes {
		pos[id] = l
	}
	return cursor.FindArgs(r.cfg.Lanes, pos), nil
}

// remember records lanes' positions read from the table or committed.
func (c *cursorState) remember(lanes ...cursor.Lane) {
	c.kmu.Lock()
	defer c.kmu.Unlock()
	if c.known == nil {
		return
	}
	for _, l := range lanes {
		c.known[l.Lane] = l
	}
}

// forget drops the copy of the positions (a batch failed after it may
// have recorded positions that did not commit): the next claim reads them.
func (c *cursorState) forget() {
	c.kmu.Lock()
	c.known = nil
	c.kmu.Unlock()
}

// idleEvery is the longest a lane without events lags behind: a claim
// takes the closed lanes that others' transactions went past along this
// often (or each PollInterval, if longer), so that they keep up.
const idleEvery = time.Second

// cursorBatch is what a cursor claim read: the locked lanes' positions and
// each read row's lane, for cursorSave.
type cursorBatch struct {
	lanes  map[int32]cursor.Lane
	order  []int32         // the locked lanes, in order
	laneOf map[int64]int32 // read row id -> its lane
	ids    []int64         // every row read, in id order (held ones too)
	held   map[int64]bool  // rows read but not sent: their key waits
	parked []int64         // unreadable rows the pipeline parked
	full   bool            // the read stopped at its limit
	last   int64           // the last id read
	saved  []cursor.Lane   // the positions cursorSave wrote

	// Lanes kept across batches (cursorkeep.go): the worker's keeper, each
	// lane's position after the batch, whether the batch writes the kept
	// positions, the lanes it keeps from now on, and whether its
	// transaction committed.
	own       *laneKeeper
	next      []cursor.Lane
	flush     bool
	take      []int32
	committed bool
}

// newCursorBatch returns an empty batch of the worker's keeper own (nil
// where lanes are not kept): a claim's read fills it; read nothing, it
// writes the kept positions when they are due.
func newCursorBatch(own *laneKeeper) *cursorBatch {
	return &cursorBatch{lanes: map[int32]cursor.Lane{}, laneOf: map[int64]int32{}, held: map[int64]bool{}, own: own}
}

// cursorCommitted takes the positions of a batch that committed (or had
// nothing to write) into the relay's copy and the worker's kept lanes.
func (r *Relay) cursorCommitted(ctx context.Context, cb *cursorBatch) {
	r.cur.remember(cb.saved...)
	k := cb.own
	if !k.keeping() {
		return
	}
	if err := k.committed(ctx, cb); err != nil {
		r.cfg.Logger.Warn("outbox relay: lost the connection that keeps lanes; the next holder sends their last events again", "error", err)
		k.drop(ctx)
		r.cur.forget()
		return
	}
	kept := make([]cursor.Lane, 0, len(cb.next))
	for _, l := range cb.next {
		if p, ok := k.lanes[l.Lane]; ok {
			kept = append(kept, p)
		}
	}
	r.cur.remember(kept...)
}

// ErrCursorNotReady wraps the reasons a table cannot be relayed with
// ProgressCursor yet; the message says what to do.
var ErrCursorNotReady = errors.New("relay: the table is not ready for cursor progress")

// ErrCursorCluster says the server's transaction ids are behind the
// lanes' positions: the table was restored into another cluster (pg_dump
// and pg_restore, or a move by logical replication), where the positions
// would take new events for delivered ones. The relay stops rather than
// lose them; "Changes of cluster" in docs/progress.md says what
// to do.
var ErrCursorCluster = errors.New("relay: the lanes' positions come from another PostgreSQL cluster")

// ErrCursorTable is returned by Start of a relay with ProgressMarks on a
// table whose relays record cursor progress: it would send again every
// event the cursor delivered (their published_at is NULL).
var ErrCursorTable = errors.New("relay: the table's relays record cursor progress")

// checkMarks refuses marks progress on a table whose relays record cursor
// progress (tablesql.ForCursor): at Start, at each polling batch until one
// check went through (a relay started while the database was down), and
// again every cursorCheckEvery, so a marks relay that runs when the table
// goes over to cursor progress (its first cursor relay started) stops
// instead of sending again what the cursor delivers.
func (r *Relay) checkMarks(ctx context.Context) error {
	if at := r.marksChecked.Load(); at != 0 && time.Since(time.Unix(0, at)) < cursorCheckEvery {
		return nil
	}
	var inUse bool
	err := pgx.BeginFunc(ctx, r.db, func(tx pgx.Tx) (err error) {
		_, inUse, err = tablesql.ForCursor(ctx, tx, r.cfg.Table)
		return err
	})
	if err != nil {
		return fmt.Errorf("relay: check the progress of %s: %w", r.cfg.Table, err)
	}
	if yes, err := r.isPartitioned(ctx); err != nil {
		return err
	} else if yes {
		return r.partitionedMarks()
	}
	if inUse {
		do := "set Progress to relay.ProgressCursor (OUTBOX_PROGRESS=cursor), or go back to marks as the cursor migration's down file says"
		if r.cfg.Progress == ProgressAuto {
			do = "this relay chose marks when it started (Progress auto) and the table went over to cursor progress since: restart it, and it records cursor progress"
		}
		return fmt.Errorf("%w: %s records cursor progress (%s), and a relay with marks progress would send again every event the cursor delivered: %s", ErrCursorTable, r.cfg.Table, cursorTable(r.cfg.Table), do)
	}
	r.marksChecked.Store(time.Now().UnixNano())
	return nil
}

// cursorCheckEvery is how often a relay checks the positions against the
// server again, to notice a change of cluster under a running relay.
const cursorCheckEvery = 10 * time.Second

// cursorReady checks that the table has the cursor migration, that the
// lanes' rows agree with Lanes, that no unpublished row predates the
// migration and that the server's transaction ids are not behind the
// positions, and creates the lanes' rows that are missing; once, then
// every cursorCheckEvery.
func (r *Relay) cursorReady(ctx context.Context) error {
	cs := r.cur
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.ready && time.Since(cs.checked) < cursorCheckEvery {
		return nil
	}
	return pgx.BeginFunc(ctx, r.db, func(tx pgx.Tx) error {
		var ok bool
		if err := tx.QueryRow(ctx, cs.q.Exists).Scan(&ok); err != nil {
			return fmt.Errorf("relay: cursor progress of %s: %w", r.cfg.Table, err)
		}
		if !ok {
			return fmt.Errorf("%w: %s, its positions table %s or its parked table %s does not exist: apply the cursor migrations (migrations.Cursor.Up, OUTBOX_MIGRATE=true with OUTBOX_PROGRESS=cursor, or the SQL files in migrations/cursor/)", ErrCursorNotReady, r.cfg.Table, cursorTable(r.cfg.Table), parkedTable(r.cfg.Table))
		}
		var lanes []int32
		var behind bool
		var old int64
		if err := tx.QueryRow(ctx, cs.q.Check).Scan(&lanes, &behind, &old); err != nil {
			return fmt.Errorf("relay: cursor progress of %s: %w", r.cfg.Table, err)
		}
		for _, n := range lanes {
			if int(n) != r.cfg.Lanes {
				return fmt.Errorf("%w: %s: its lanes' positions were made for Lanes %d, this relay has %d: every relay of a table must use the same Lanes", ErrCursorNotReady, r.cfg.Table, n, r.cfg.Lanes)
			}
		}
		if behind {
			cs.ready = false
			return fmt.Errorf("%w: %s: this server's transaction ids are behind the snapshots in %s, so the table was restored or moved into another cluster; new events would be taken for delivered ones. Stop the relays and follow \"Changes of cluster\" in docs/progress.md (outboxctl cursor rebase)", ErrCursorCluster, r.cfg.Table, cursorTable(r.cfg.Table))
		}
		if cs.ready {
			cs.checked = time.Now()
			return nil
		}
		if old > 0 {
			return fmt.Errorf("%w: %s has %d unpublished events written before the cursor migration (txid is NULL): run the relay with marks progress until they are published (outboxctl status shows the backlog), then switch to cursor", ErrCursorNotReady, r.cfg.Table, old)
		}
		if _, err := tx.Exec(ctx, cs.q.Init, pgx.NamedArgs{"lanes": r.cfg.Lanes}); err != nil {
			return fmt.Errorf("relay: cursor progress of %s: create the lanes' positions: %w", r.cfg.Table, err)
		}
		// Events parked in their rows (in marks mode, or by an older
		// relay) move to the parked table, where admin and outboxctl look
		// for them in cursor mode.
		b := &pgx.Batch{}
		b.Queue(cs.q.Adopt)
		b.Queue(cs.q.AdoptUnpark)
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return fmt.Errorf("relay: cursor progress of %s: move the events parked in their rows to %s: %w", r.cfg.Table, parkedTable(r.cfg.Table), err)
		}
		cs.ready, cs.checked = true, time.Now()
		return nil
	})
}

// cursorClaim is the claim under ProgressCursor: it finds the lanes with
// waiting rows and try-locks those that cover about n of them (skipping the
// lanes other relays hold), reads their positions in a new statement
// (opening their windows), and reads the next n rows of those windows in id
// order. Rows whose key waits for a failed event's retry are read but not
// returned; their lane stops before them.
//
// k is the worker's keeper (nil where lanes are not kept): a claim that
// finds nothing while the kept positions are due returns an empty batch,
// whose save writes them.
func (r *Relay) cursorClaim(ctx context.Context, tx pgx.Tx, n int, held []string, k *laneKeeper) (claimed, error) {
	if err := r.cursorReady(ctx); err != nil {
		return claimed{}, err
	}
	if err := r.cursorSweep(ctx); err != nil {
		return claimed{}, err
	}
	if k.fast() {
		// The lanes the worker keeps, without Find: their positions are
		// the worker's and their locks its connection's.
		// While rows the last Find saw may be left, the worker claims
		// again at once, as after that Find (seenFor).
		c, err := r.cursorReadKept(ctx, tx, k.kept(), n, held, k.seenFor(n), k, true)
		if err != nil || len(c.rows) > 0 || len(c.bad) > 0 {
			if err == nil {
				r.cur.keptClaims.Add(1)
				k.took(len(c.rows) + len(c.bad))
			}
			return c, err
		}
		if k.everyLane() {
			// Nothing to send, and there is no other lane: no row waits
			// but those the read held back (their keys' retries are not
			// due). Find would lock the same lanes and read them again.
			k.searched(0, n)
			if c.cur == nil && k.due() {
				return claimed{cur: newCursorBatch(k)}, nil
			}
			return c, nil
		}
		// Nothing to send in the kept lanes: Find looks at every lane
		// (this read wrote nothing and is forgotten).
	}
	locked, seen, heldElsewhere, err := r.cursorFind(ctx, tx, n, nil, k)
	k.searched(seen, n)
	if err == nil && len(locked) == 0 && k.due() {
		return claimed{cur: newCursorBatch(k)}, nil
	}
	if err != nil || len(locked) == 0 {
		return claimed{heldElsewhere: err == nil && heldElsewhere && seen > 0}, err
	}
	c, err := r.cursorReadKept(ctx, tx, locked, n, held, seen, k, false)
	if err == nil {
		k.took(len(c.rows) + len(c.bad)) // read from what this Find saw
	}
	return c, err
}

// cursorFind try-locks the lanes with waiting rows that cover about n of
// them, returning the lanes locked, how many waiting rows the window saw,
// and whether lanes with rows were held by others.
//
// The lanes in owned (an exactly-once worker's) come first.
func (r *Relay) cursorFind(ctx context.Context, tx pgx.Tx, n int, owned []int32, k *laneKeeper) (locked []int32, seen int, heldElsewhere bool, err error) {
	// The window grows (4x, up to 32n) while the lanes in it are all held
	// by other relays: a frozen or slow relay's lanes may fill the oldest
	// rows, and the others' work lies past them.
	for window := 2 * n; ; window *= 4 {
		seen, heldElsewhere = 0, false
		type cand struct {
			lane int32
			cnt  int
		}
		var cands []cand // lanes past the first n rows, not tried yet
		covered := 0
		pre, preArgs := "", []any(nil)
		if window == 2*n {
			pre, preArgs = r.settings(tx, k)
		}
		args, err := r.findArgs(ctx, tx, k)
		if err != nil {
			return nil, 0, false, err
		}
		args["window"], args["lanes"], args["n"], args["ns"], args["owned"] = window, r.cfg.Lanes, n, r.q.ns, owned
		err = claim.Query(ctx, tx, pre, preArgs, r.cur.q.Find, pgx.NamedArgs(args), func(rows pgx.Rows) error {
			var lane int32
			var cnt int
			var got *bool
			_, err := pgx.ForEachRow(rows, []any{&lane, &cnt, &got}, func() error {
				seen += cnt
				switch {
				case got == nil:
					cands = append(cands, cand{lane, cnt})
				case *got:
					locked = append(locked, lane)
					covered += cnt
				default:
					heldElsewhere = true
				}
				return nil
			})
			return err
		})
		if err != nil {
			return nil, 0, false, fmt.Errorf("relay: find lanes in %s: %w", r.cfg.Table, err)
		}
		// Lanes held by other relays left the batch short: try the next
		// lanes in order of their first row, a chunk at a time.
		for len(cands) > 0 && covered < n {
			var chunk []int32
			want := map[int32]int{}
			for need := n - covered; len(cands) > 0 && need > 0; cands = cands[1:] {
				chunk = append(chunk, cands[0].lane)
				want[cands[0].lane] = cands[0].cnt
				need -= cands[0].cnt
			}
			rows, err := tx.Query(ctx, r.q.Lock, pgx.NamedArgs{"candidates": chunk, "ns": r.q.ns})
			if err != nil {
				return nil, 0, false, fmt.Errorf("relay: lock lanes: %w", err)
			}
			got, err := pgx.CollectRows(rows, pgx.RowTo[int32])
			if err != nil {
				return nil, 0, false, fmt.Errorf("relay: lock lanes: %w", err)
			}
			for _, l := range got {
				locked = append(locked, l)
				covered += want[l]
			}
		}
		if len(locked) > 0 || !heldElsewhere || seen < window || window >= 32*n {
			return locked, seen, heldElsewhere, nil
		}
	}
}

// cursorSweep, once a second (or PollInterval), moves on the closed lanes
// that transactions went past and nobody holds, in a short transaction of
// its own: a lane without events keeps up that way, its window opening and
// closing with the others', so that late rows are looked for over a short
// range. It publishes nothing (a row it meets stops its lane, for the next
// claim to find), and it never holds a lane while a batch publishes: a
// relay frozen in a batch holds only the lanes of that batch's rows.
func (r *Relay) cursorSweep(ctx context.Context) error {
	now := time.Now()
	if now.UnixNano() < r.cur.idleAt.Load() {
		return nil
	}
	r.cur.idleAt.Store(now.Add(max(idleEvery, r.cfg.PollInterval)).UnixNano())
	var saved []cursor.Lane
	err := pgx.BeginFunc(ctx, r.db, func(tx pgx.Tx) error {
		var idle []int32
		err := claim.Query(ctx, tx, r.txSettings, []any{r.idleMillis}, r.cur.q.Idle, pgx.NamedArgs{"locked": []int32{}, "ns": r.q.ns}, func(rows pgx.Rows) error {
			var err error
			idle, err = pgx.CollectRows(rows, pgx.RowTo[int32])
			return err
		})
		if err != nil || len(idle) == 0 {
			return err
		}
		saved, err = r.moveOn(ctx, tx, idle)
		return err
	})
	if err == nil {
		r.cur.remember(saved...)
	} else {
		r.cur.forget()
	}
	if err != nil {
		return fmt.Errorf("relay: move on the idle lanes of %s: %w", r.cfg.Table, err)
	}
	return nil
}

// moveOn reads on the lanes locked in tx without publishing (see
// cursorSweep) and writes the positions that changed, which it returns: a
// window with no row left in it closes, one with rows stops before them,
// for the next claim.
func (r *Relay) moveOn(ctx context.Context, tx pgx.Tx, locked []int32) ([]cursor.Lane, error) {
	c, err := r.cursorRead(ctx, tx, locked, r.cfg.BatchSize, nil, 0, map[int32]bool{}, nil, false)
	if err != nil {
		return nil, err
	}
	b := &pgx.Batch{}
	r.cursorSave(ctx, b, c.cur, nil, nil, nil)
	if b.Len() == 0 {
		return nil, nil
	}
	return c.cur.saved, tx.SendBatch(ctx, b).Close()
}

// cursorRead is the rest of a cursor claim, on the lanes locked: it reads
// their positions in a new statement (opening their windows) and the next
// n rows of those windows in id order. Rows whose key waits for a failed
// event's retry are read but not returned; their lane stops before them.
//
// With publish not nil, only the rows of the lanes in it are returned; the
// others' stop their lanes (an exactly-once worker publishes only the lanes
// it took over).
//
// The positions of the lanes the worker keeps (k) are its own, not their
// rows'. first says that the read is the transaction's first statement,
// which sets its settings (txSettings) as Find does otherwise.
func (r *Relay) cursorRead(ctx context.Context, tx pgx.Tx, locked []int32, n int, held []string, seen int, publish map[int32]bool, k *laneKeeper, first bool) (claimed, error) {
	q := r.cur.q
	// A new statement: its snapshot sees what the lanes' previous holder
	// committed.
	cb := newCursorBatch(k)
	loadArgs := cursor.KeptArgs(k.given(locked))
	loadArgs["locked"], loadArgs["lanes"] = locked, r.cfg.Lanes
	pre, preArgs := "", []any(nil)
	if first {
		pre, preArgs = r.settings(tx, k)
	}
	var l cursor.Lane
	var floor *int64
	err := claim.Query(ctx, tx, pre, preArgs, q.Load, pgx.NamedArgs(loadArgs), func(rows pgx.Rows) error {
		_, err := pgx.ForEachRow(rows, []any{&l.Lane, &l.Done, &l.Upto, &l.Base, &l.Pos, &floor, &l.Skip, &l.Top}, func() error {
			l.Floor = l.Base + 1
			if floor != nil {
				l.Floor = *floor
			}
			cb.lanes[l.Lane] = l
			cb.order = append(cb.order, l.Lane)
			r.cur.remember(l)
			l = cursor.Lane{}
			return nil
		})
		return err
	})
	if err != nil {
		return claimed{}, fmt.Errorf("relay: read the lanes' positions in %s: %w", r.cfg.Table, err)
	}
	if len(cb.order) != len(locked) {
		// A lane without its row: the positions were changed under the relay.
		r.cur.mu.Lock()
		r.cur.ready = false
		r.cur.mu.Unlock()
		return claimed{}, fmt.Errorf("relay: %s: %d of %d lanes have no position row", r.cfg.Table, len(locked)-len(cb.order), len(locked))
	}
	read := make(map[int32]cursor.Lane, len(cb.order))
	skip := []int64{} // not nil: a NULL array would match no row
	from := int64(-1)
	for _, id := range cb.order {
		l := cb.lanes[id]
		read[id] = l
		skip = append(skip, l.Skip...)
		if from < 0 || l.Start() < from {
			from = l.Start()
		}
	}
	dones, uptos, starts := cursor.ReadArrays(r.cfg.Lanes, read)
	var out []claim.Row
	var x claim.Row
	var lane int32
	var bad []claim.Unreadable
	readArgs := pgx.NamedArgs{"dones": dones, "uptos": uptos, "starts": starts, "skip": skip, "from": from, "n": n, "lanes": r.cfg.Lanes}
	if publish != nil && len(publish) == 0 {
		// Nothing to publish (the idle lanes' sweep): the ids are enough.
		err = claim.Query(ctx, tx, "", nil, q.ReadIDs, readArgs, func(rs pgx.Rows) error {
			var id int64
			_, err := pgx.ForEachRow(rs, []any{&id, &lane}, func() error {
				cb.laneOf[id] = lane
				cb.ids = append(cb.ids, id)
				cb.held[id] = true
				return nil
			})
			return err
		})
		if err != nil {
			return claimed{}, fmt.Errorf("relay: read the idle lanes of %s: %w", r.cfg.Table, err)
		}
		cb.full = len(cb.ids) == n
		if len(cb.ids) > 0 {
			cb.last = cb.ids[len(cb.ids)-1]
		}
		return claimed{cur: cb}, nil
	}
	// Under a savepoint: a row that cannot be read (see isUnreadable) does
	// not abort the transaction.
	err = claim.Query(ctx, tx, r.q.Savepoint, nil, q.Read, readArgs, func(rs pgx.Rows) error {
		_, err := pgx.ForEachRow(rs, x.Scan(&lane), func() error {
			cb.laneOf[x.ID] = lane
			cb.ids = append(cb.ids, x.ID)
			out = append(out, x)
			x = claim.Row{}
			return nil
		})
		return err
	})
	if err != nil && claim.IsUnreadable(err) {
		// Read the ids alone, then the rows by id, setting aside those that
		// cannot be read (readGuarded); they are charged (parked) in the
		// pipeline, and their lanes go on past them.
		if _, e := tx.Exec(ctx, r.q.RollbackTo); e != nil {
			return claimed{}, fmt.Errorf("relay: claim from %s: isolate an unreadable row: %w", r.cfg.Table, e)
		}
		cb.ids, out = nil, nil
		clear(cb.laneOf)
		var rs pgx.Rows
		if rs, err = tx.Query(ctx, q.ReadIDs, readArgs); err == nil {
			var id int64
			_, err = pgx.ForEachRow(rs, []any{&id, &lane}, func() error {
				cb.laneOf[id] = lane
				cb.ids = append(cb.ids, id)
				return nil
			})
		}
		if err == nil {
			var g claimed
			g, err = r.readGuarded(ctx, tx, cb.ids, n)
			out, bad = g.rows, g.bad
		}
	}
	if err != nil {
		return claimed{}, fmt.Errorf("relay: claim from %s: %w", r.cfg.Table, err)
	}
	return cb.finish(out, bad, n, held, seen, publish), nil
}

// finish is the end of a cursor claim that read out (and bad) of at most n
// rows: rows whose key waits for a retry, or whose lane stopped, are read
// but not returned.
func (cb *cursorBatch) finish(out []claim.Row, bad []claim.Unreadable, n int, held []string, seen int, publish map[int32]bool) claimed {
	cb.full = len(cb.ids) == n
	if len(cb.ids) > 0 {
		cb.last = cb.ids[len(cb.ids)-1]
	}
	// Keys waiting for a retry: their rows stay (the lane stops at the
	// first), and so do the rest of a lane whose Skip is full.
	waits := map[string]bool{}
	for _, k := range held {
		waits[k] = true
	}
	stopped := map[int32]bool{}
	kept := out[:0:0]
	for _, x := range out {
		lane := cb.laneOf[x.ID]
		if waits[x.Key] || stopped[lane] || publish != nil && !publish[lane] {
			cb.held[x.ID] = true
			if len(cb.lanes[lane].Skip) >= cursor.SkipCap {
				stopped[lane] = true
			}
			continue
		}
		kept = append(kept, x)
	}
	return claimed{rows: kept, bad: bad, more: cb.full || seen >= 2*n, cur: cb}
}

// cursorReadKept is cursorRead for a claim that publishes, in one
// statement (cursor.Queries.Kept) instead of Load and Read where every lane
// locked is one the worker keeps (k): their positions are the worker's.
// It reads nothing, and returns no batch, when those lanes have no row to
// read (their windows stay as they were). Where a row cannot be read the
// transaction goes back to the savepoint and cursorRead reads the lanes
// again, setting the row aside.
func (r *Relay) cursorReadKept(ctx context.Context, tx pgx.Tx, locked []int32, n int, held []string, seen int, k *laneKeeper, first bool) (claimed, error) {
	given := k.given(locked)
	if len(given) != len(locked) || len(given) == 0 {
		return r.cursorRead(ctx, tx, locked, n, held, seen, nil, k, first)
	}
	cb := newCursorBatch(k)
	args := cursor.KeptReadArgs(r.cfg.Lanes, given)
	args["n"], args["lanes"] = n, r.cfg.Lanes
	var out []claim.Row
	var x claim.Row
	var lane int32
	var now string
	var top int64
	var lateLanes []int32
	var lateIDs []int64
	b := &pgx.Batch{}
	if first {
		if pre, args := r.settings(tx, k); pre != "" {
			b.Queue(pre, args...)
		}
	}
	// Before the batch's transaction begins, when it can (see lazytx.Tx);
	// otherwise under a savepoint, as cursorRead's Read.
	conn, alone := lazytx.Outside(tx)
	if !alone {
		b.Queue(r.q.Savepoint)
	}
	b.Queue(r.cur.q.Kept, pgx.NamedArgs(args)).Query(func(rs pgx.Rows) error {
		_, err := pgx.ForEachRow(rs, x.Scan(&lane, &now, &top, &lateLanes, &lateIDs), func() error {
			cb.laneOf[x.ID] = lane
			cb.ids = append(cb.ids, x.ID)
			out = append(out, x)
			x = claim.Row{}
			return nil
		})
		return err
	})
	var send interface {
		SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	} = tx
	if alone {
		send = conn
	}
	err := send.SendBatch(ctx, b).Close()
	if err != nil && claim.IsUnreadable(err) {
		if !alone {
			if _, e := tx.Exec(ctx, r.q.RollbackTo); e != nil {
				return claimed{}, fmt.Errorf("relay: claim from %s: isolate an unreadable row: %w", r.cfg.Table, e)
			}
		}
		r.cur.keptUnreadable.Add(1)
		return r.cursorRead(ctx, tx, locked, n, held, seen, nil, k, false)
	}
	if err != nil {
		return claimed{}, fmt.Errorf("relay: claim from %s: %w", r.cfg.Table, err)
	}
	if len(out) == 0 {
		return claimed{more: seen >= 2*n}, nil
	}
	lates := make(map[int32]int64, len(lateLanes))
	for i, l := range lateLanes {
		if i < len(lateIDs) {
			lates[l] = lateIDs[i]
		}
	}
	for _, l := range given {
		l = cursor.Opened(l, now, top, lates)
		cb.lanes[l.Lane] = l
		cb.order = append(cb.order, l.Lane)
		r.cur.remember(l)
	}
	return cb.finish(out, nil, n, held, seen, nil), nil
}

// cursorSave writes the positions of a cursor batch's lanes after its
// publish: published and parked rows are resolved, the others (failed,
// waiting behind their key) stop their lane.
//
// Under ExactlyOnce a row parked in this batch is not resolved yet: the
// position must be the one the batch's Kafka transaction recorded (see
// eoSettle), and the next batch's read no longer finds the row, which
// moved to the parked table in this transaction. (If the transaction does
// not commit, the row stays, unparked, and the recorded position stops
// before it.)
func (r *Relay) cursorSave(ctx context.Context, b *pgx.Batch, cb *cursorBatch, sent []claim.Row, errs []error, parked map[int64]bool) {
	resolved := make(map[int64]bool, len(sent))
	if r.eo == nil {
		for _, id := range cb.parked {
			resolved[id] = true
		}
	}
	for i, x := range sent {
		if errs[i] == nil || r.eo == nil && parked[x.ID] {
			resolved[x.ID] = true
		}
	}
	// A lane whose position did not change is not written.
	var changed []cursor.Lane
	next := cb.advance(func(id int64) bool { return resolved[id] })
	for _, l := range next {
		if old := cb.lanes[l.Lane]; !old.Equal(l) {
			changed = append(changed, l)
		}
	}
	if cb.own.keeping() {
		// Lanes kept across batches: written when due (see laneKeeper).
		cb.own.plan(b, cb, next, changed)
		return
	}
	if len(changed) > 0 {
		r.cursorSaveLanes(b, changed)
	}
	cb.saved = changed
}

// advance returns the position of each of the batch's lanes after it, with
// resolved saying which of the rows read were published (or parked).
func (cb *cursorBatch) advance(resolved func(id int64) bool) []cursor.Lane {
	outcomes := map[int32][]cursor.Outcome{}
	for _, id := range cb.ids {
		l := cb.laneOf[id]
		outcomes[l] = append(outcomes[l], cursor.Outcome{ID: id, Resolved: resolved(id)})
	}
	out := make([]cursor.Lane, len(cb.order))
	for i, id := range cb.order {
		out[i] = cursor.Advance(cb.lanes[id], outcomes[id], cb.full, cb.last)
	}
	return out
}

// cursorSaveLanes queues the statement that writes lanes' positions.
func (r *Relay) cursorSaveLanes(b *pgx.Batch, lanes []cursor.Lane) {
	n := len(lanes)
	lane, done, upto, skip := make([]int32, 0, n), make([]string, 0, n), make([]*string, 0, n), make([]string, 0, n)
	base, pos, floor, top := make([]int64, 0, n), make([]int64, 0, n), make([]int64, 0, n), make([]int64, 0, n)
	for _, l := range lanes {
		id := l.Lane
		lane, done, base, pos, floor, top = append(lane, id), append(done, l.Done), append(base, l.Base), append(pos, l.Pos), append(floor, l.Floor), append(top, l.Top)
		var u *string
		if l.Upto != "" {
			u = &l.Upto
		}
		upto, skip = append(upto, u), append(skip, cursor.JoinSkip(l.Skip))
	}
	b.Queue(r.cur.q.Save, pgx.NamedArgs{"lane": lane, "done": done, "upto": upto, "base": base, "pos": pos, "floor": floor, "top": top, "skip": skip})
}
