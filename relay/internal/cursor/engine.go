package cursor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/relay/internal/claim"
	"github.com/fxoutbox/outbox/relay/internal/lanelock"
	"github.com/fxoutbox/outbox/relay/internal/lazytx"
)

// Config is what an Engine needs of its relay. Every field but Pool is
// required.
type Config struct {
	Table outbox.Table
	// Lanes, BatchSize, MaxBatchSize, PollInterval and BatchTimeout are
	// the relay's (relay.Config).
	Lanes, BatchSize, MaxBatchSize int
	PollInterval, BatchTimeout     time.Duration
	NS                             int32  // the table's advisory lock namespace
	Lock                           string // try-locks @candidates in namespace @ns, returning those locked
	// Guarded reads rows by id, setting aside those that cannot be read.
	Guarded claim.Guarded
	// TxSettings ($1: IdleMillis) sets a batch transaction's settings;
	// SessionSettings the same for the session of a kept connection.
	TxSettings, SessionSettings, IdleMillis string
	// ExactlyOnce: a row parked in a batch is not resolved in its
	// positions (see Save).
	ExactlyOnce bool
	DB          interface {
		Begin(ctx context.Context) (pgx.Tx, error)
	}
	// Pool, when the DB is a pool, gives kept lanes their connections
	// (NewKeeper); KeptIdleMillis bounds such a connection's idle session.
	Pool           lanelock.Acquirer
	KeptIdleMillis string
	Logger         *slog.Logger
}

// New returns the cursor progress of cfg.Table. It does no I/O.
func New(cfg Config) *Engine {
	return &Engine{cfg: cfg, Q: NewQueries(cfg.Table, PositionsOf(cfg.Table), ParkedOf(cfg.Table), Cols)}
}

// Cols are the columns a cursor claim reads (claim.Cols of alias e).
const Cols = "e.id, e.event_id, e.event_type, e.topic, e.partition_key, e.payload, e.headers, e.attempts, e.created_at, e.attempts = 0 AND e.last_error IS NOT NULL"

// PositionsOf is the positions table of t (sqlname.Cursor).
func PositionsOf(t outbox.Table) outbox.Table {
	t = t.WithDefaults()
	return outbox.Table{Schema: t.Schema, Name: t.Name + "_cursor"}
}

// ParkedOf is the parked events' table of t in cursor mode
// (sqlname.Parked).
func ParkedOf(t outbox.Table) outbox.Table {
	t = t.WithDefaults()
	return outbox.Table{Schema: t.Schema, Name: t.Name + "_parked"}
}

// ErrNotReady wraps the reasons a table cannot be relayed with cursor
// progress yet; the message says what to do.
var ErrNotReady = errors.New("relay: the table is not ready for cursor progress")

// ErrCluster says the server's transaction ids are behind the lanes'
// positions: the table was restored into another cluster (pg_dump and
// pg_restore, or a move by logical replication), where the positions would
// take new events for delivered ones. The relay stops rather than lose
// them; "Changes of cluster" in docs/progress.md says what to do.
var ErrCluster = errors.New("relay: the lanes' positions come from another PostgreSQL cluster")

// Claim is what a cursor claim read: the rows to publish, in order, those
// that cannot be read, whether more rows are likely waiting, whether the
// lanes with rows are all held by other relays, and the batch (the lanes'
// positions; nil when nothing was read).
type Claim struct {
	Rows          []claim.Row
	Bad           []claim.Unreadable
	More          bool
	HeldElsewhere bool
	Batch         *Batch
}

// SetKeepEvery replaces KeepSaveEvery (tests; before the relay starts).
func (c *Engine) SetKeepEvery(d time.Duration) { c.keepEvery = d }

// SetKeepFind replaces how often a worker that keeps lanes runs Find while
// they have events (tests; before the relay starts).
func (c *Engine) SetKeepFind(d time.Duration) { c.keepFind = d }

// KeptClaims counts the claims that read the kept lanes without Find and
// had events to send (tests).
func (c *Engine) KeptClaims() int64 { return c.keptClaims.Load() }

// KeptUnreadable counts the reads of kept lanes in one statement that met
// a row that could not be read (tests).
func (c *Engine) KeptUnreadable() int64 { return c.keptUnreadable.Load() }

// KeptFreed counts the kept lanes let go (tests).
func (c *Engine) KeptFreed() int64 { return c.keptFreed.Load() }

// settings returns the statement that sets tx's settings and its
// arguments, for a claim to send before its first statement; none when tx
// runs on the connection k keeps, whose session has them.
func (e *Engine) settings(tx pgx.Tx, k *Keeper) (string, []any) {
	if k.Settled(tx) {
		return "", nil
	}
	return e.cfg.TxSettings, []any{e.cfg.IdleMillis}
}

// Engine is a relay's cursor progress: its statements, its copy of the
// lanes' positions, whether the lanes' rows were checked and created, and
// the claims, sweeps and saves of the lanes' windows (see the package
// comment). The relay owns the batch's transaction and the publishing.
type Engine struct {
	cfg   Config
	Q     Queries
	mu    sync.Mutex
	ready bool
	// checked: when the positions were last checked against the server
	// (see Ready).
	checked time.Time
	// idleAt (unix nanoseconds): when a claim next takes the idle lanes
	// along (see Claim).
	idleAt atomic.Int64

	// known is the relay's copy of the lanes' positions, which Find takes
	// as arguments instead of reading every lane's row per claim: read
	// whole once a second (knownAt), and lane by lane from what this
	// relay's batches read and committed. It may be behind the table
	// (other relays' progress, up to a second), which only makes Find
	// look at rows already delivered; it is never ahead, but for a moment
	// after a batch that failed (then it is read again).
	kmu     sync.Mutex
	known   map[int32]Lane
	knownAt time.Time

	// keepEvery and keepFind replace KeepSaveEvery and keptFindEvery
	// when positive (tests).
	keepEvery, keepFind time.Duration
	// keptClaims counts the claims that read the kept lanes without Find
	// and had events to send (tests).
	keptClaims atomic.Int64
	// keptUnreadable counts the reads of kept lanes in one statement that
	// met a row that could not be read (tests).
	keptUnreadable atomic.Int64
	// keptFreed counts the kept lanes let go (see Keeper.Committed;
	// tests).
	keptFreed atomic.Int64
}

// knownEvery is how often a relay reads every lane's position.
const knownEvery = time.Second

// findArgs returns Find's arguments from the positions known, reading
// them all when the copy is older than knownEvery.
func (e *Engine) findArgs(ctx context.Context, tx pgx.Tx, k *Keeper) (map[string]any, error) {
	c := e
	c.kmu.Lock()
	stale := c.known == nil || time.Since(c.knownAt) >= knownEvery
	c.kmu.Unlock()
	if stale {
		rows, err := tx.Query(ctx, c.Q.Positions)
		if err != nil {
			return nil, fmt.Errorf("relay: read the lanes' positions in %s: %w", e.cfg.Table, err)
		}
		all := map[int32]Lane{}
		var l Lane
		if _, err = pgx.ForEachRow(rows, []any{&l.Lane, &l.Done, &l.Upto, &l.Base, &l.Pos, &l.Floor, &l.Top, &l.Skip}, func() error {
			all[l.Lane] = l
			l = Lane{}
			return nil
		}); err != nil {
			return nil, fmt.Errorf("relay: read the lanes' positions in %s: %w", e.cfg.Table, err)
		}
		c.kmu.Lock()
		c.known, c.knownAt = all, time.Now()
		c.kmu.Unlock()
	}
	c.kmu.Lock()
	defer c.kmu.Unlock()
	if !k.keeping() || len(k.lanes) == 0 {
		return FindArgs(e.cfg.Lanes, c.known), nil
	}
	// The lanes the worker keeps stand where it left them.
	pos := make(map[int32]Lane, len(c.known))
	for id, l := range c.known {
		pos[id] = l
	}
	for id, l := range k.lanes {
		pos[id] = l
	}
	return FindArgs(e.cfg.Lanes, pos), nil
}

// remember records lanes' positions read from the table or committed.
func (c *Engine) Remember(lanes ...Lane) {
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
func (c *Engine) Forget() {
	c.kmu.Lock()
	c.known = nil
	c.kmu.Unlock()
}

// idleEvery is the longest a lane without events lags behind: a claim
// takes the closed lanes that others' transactions went past along this
// often (or each PollInterval, if longer), so that they keep up.
const idleEvery = time.Second

// Batch is what a cursor claim read: the locked lanes' positions and
// each read row's lane, for Save.
type Batch struct {
	lanes  map[int32]Lane
	order  []int32         // the locked lanes, in order
	LaneOf map[int64]int32 // read row id -> its lane
	IDs    []int64         // every row read, in id order (held ones too)
	Held   map[int64]bool  // rows read but not sent: their key waits
	Parked []int64         // unreadable rows the pipeline parked
	full   bool            // the read stopped at its limit
	last   int64           // the last id read
	saved  []Lane          // the positions Save wrote

	// Lanes kept across batches (cursorkeep.go): the worker's keeper, each
	// lane's position after the batch, whether the batch writes the kept
	// positions, the lanes it keeps from now on, and whether its
	// transaction committed.
	own       *Keeper
	next      []Lane
	flush     bool
	take      []int32
	Committed bool
}

// newBatch returns an empty batch of the worker's keeper own (nil
// where lanes are not kept): a claim's read fills it; read nothing, it
// writes the kept positions when they are due.
func newBatch(own *Keeper) *Batch {
	return &Batch{lanes: map[int32]Lane{}, LaneOf: map[int64]int32{}, Held: map[int64]bool{}, own: own}
}

// read notes a row read, in id order, and its lane.
func (cb *Batch) read(id int64, lane int32) {
	cb.LaneOf[id] = lane
	cb.IDs = append(cb.IDs, id)
}

// Committed takes the positions of a batch that committed (or had
// nothing to write) into the relay's copy and the worker's kept lanes.
func (e *Engine) Committed(ctx context.Context, cb *Batch) {
	e.Remember(cb.saved...)
	k := cb.own
	if !k.keeping() {
		return
	}
	if err := k.committed(ctx, cb); err != nil {
		e.cfg.Logger.Warn("outbox relay: lost the connection that keeps lanes; the next holder sends their last events again", "error", err)
		k.Drop(ctx)
		e.Forget()
		return
	}
	kept := make([]Lane, 0, len(cb.next))
	for _, l := range cb.next {
		if p, ok := k.lanes[l.Lane]; ok {
			kept = append(kept, p)
		}
	}
	e.Remember(kept...)
}

// CheckEvery is how often a relay checks the table again while it runs:
// under cursor progress the positions against the server (a change of
// cluster), under marks whether the table went over to cursor progress
// (the relay's checkMarks).
const CheckEvery = 10 * time.Second

// Ready checks that the table has the cursor migration, that the
// lanes' rows agree with Lanes, that no unpublished row predates the
// migration and that the server's transaction ids are not behind the
// positions, and creates the lanes' rows that are missing; once, then
// every CheckEvery.
func (e *Engine) Ready(ctx context.Context) error {
	cs := e
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.ready && time.Since(cs.checked) < CheckEvery {
		return nil
	}
	return pgx.BeginFunc(ctx, e.cfg.DB, func(tx pgx.Tx) error {
		var ok bool
		if err := tx.QueryRow(ctx, cs.Q.Exists).Scan(&ok); err != nil {
			return fmt.Errorf("relay: cursor progress of %s: %w", e.cfg.Table, err)
		}
		if !ok {
			return fmt.Errorf("%w: %s, its positions table %s or its parked table %s does not exist: apply the cursor migrations (migrations.Cursor.Up, OUTBOX_MIGRATE=true with OUTBOX_PROGRESS=cursor, or the SQL files in migrations/cursor/)", ErrNotReady, e.cfg.Table, PositionsOf(e.cfg.Table), ParkedOf(e.cfg.Table))
		}
		var lanes []int32
		var behind bool
		var old int64
		if err := tx.QueryRow(ctx, cs.Q.Check).Scan(&lanes, &behind, &old); err != nil {
			return fmt.Errorf("relay: cursor progress of %s: %w", e.cfg.Table, err)
		}
		for _, n := range lanes {
			if int(n) != e.cfg.Lanes {
				return fmt.Errorf("%w: %s: its lanes' positions were made for Lanes %d, this relay has %d: every relay of a table must use the same Lanes", ErrNotReady, e.cfg.Table, n, e.cfg.Lanes)
			}
		}
		if behind {
			cs.ready = false
			return fmt.Errorf("%w: %s: this server's transaction ids are behind the snapshots in %s, so the table was restored or moved into another cluster; new events would be taken for delivered ones. Stop the relays and follow \"Changes of cluster\" in docs/progress.md (outboxctl cursor rebase)", ErrCluster, e.cfg.Table, PositionsOf(e.cfg.Table))
		}
		if cs.ready {
			cs.checked = time.Now()
			return nil
		}
		if old > 0 {
			return fmt.Errorf("%w: %s has %d unpublished events written before the cursor migration (txid is NULL): run the relay with marks progress until they are published (outboxctl status shows the backlog), then switch to cursor", ErrNotReady, e.cfg.Table, old)
		}
		if _, err := tx.Exec(ctx, cs.Q.Init, pgx.NamedArgs{"lanes": e.cfg.Lanes}); err != nil {
			return fmt.Errorf("relay: cursor progress of %s: create the lanes' positions: %w", e.cfg.Table, err)
		}
		// Events parked in their rows (in marks mode, or by an older
		// relay) move to the parked table, where admin and outboxctl look
		// for them in cursor mode.
		b := &pgx.Batch{}
		b.Queue(cs.Q.Adopt)
		b.Queue(cs.Q.AdoptUnpark)
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return fmt.Errorf("relay: cursor progress of %s: move the events parked in their rows to %s: %w", e.cfg.Table, ParkedOf(e.cfg.Table), err)
		}
		cs.ready, cs.checked = true, time.Now()
		return nil
	})
}

// Claim is the claim of cursor progress: it finds the lanes with
// waiting rows and try-locks those that cover about n of them (skipping the
// lanes other relays hold), reads their positions in a new statement
// (opening their windows), and reads the next n rows of those windows in id
// order. Rows whose key waits for a failed event's retry are read but not
// returned; their lane stops before them.
//
// k is the worker's keeper (nil where lanes are not kept): a claim that
// finds nothing while the kept positions are due returns an empty batch,
// whose save writes them.
func (e *Engine) Claim(ctx context.Context, tx pgx.Tx, n int, held []string, k *Keeper) (Claim, error) {
	if err := e.Ready(ctx); err != nil {
		return Claim{}, err
	}
	if err := e.Sweep(ctx); err != nil {
		return Claim{}, err
	}
	if k.fast() {
		// The lanes the worker keeps, without Find: their positions are
		// the worker's and their locks its connection's.
		// While rows the last Find saw may be left, the worker claims
		// again at once, as after that Find (seenFor).
		c, err := e.readKept(ctx, tx, k.kept(), n, held, k.seenFor(n), k, true)
		if err != nil || len(c.Rows) > 0 || len(c.Bad) > 0 {
			if err == nil {
				e.keptClaims.Add(1)
				k.took(len(c.Rows) + len(c.Bad))
			}
			return c, err
		}
		if k.everyLane() {
			// Nothing to send, and there is no other lane: no row waits
			// but those the read held back (their keys' retries are not
			// due). Find would lock the same lanes and read them again.
			k.searched(0, n)
			if c.Batch == nil && k.due() {
				return Claim{Batch: newBatch(k)}, nil
			}
			return c, nil
		}
		// Nothing to send in the kept lanes: Find looks at every lane
		// (this read wrote nothing and is forgotten).
	}
	locked, seen, heldElsewhere, err := e.Find(ctx, tx, n, nil, k)
	k.searched(seen, n)
	if err == nil && len(locked) == 0 && k.due() {
		return Claim{Batch: newBatch(k)}, nil
	}
	if err != nil || len(locked) == 0 {
		return Claim{HeldElsewhere: err == nil && heldElsewhere && seen > 0}, err
	}
	c, err := e.readKept(ctx, tx, locked, n, held, seen, k, false)
	if err == nil {
		k.took(len(c.Rows) + len(c.Bad)) // read from what this Find saw
	}
	return c, err
}

// Find try-locks the lanes with waiting rows that cover about n of
// them, returning the lanes locked, how many waiting rows the window saw,
// and whether lanes with rows were held by others.
//
// The lanes in owned (an exactly-once worker's) come first.
func (e *Engine) Find(ctx context.Context, tx pgx.Tx, n int, owned []int32, k *Keeper) (locked []int32, seen int, heldElsewhere bool, err error) {
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
			pre, preArgs = e.settings(tx, k)
		}
		args, err := e.findArgs(ctx, tx, k)
		if err != nil {
			return nil, 0, false, err
		}
		args["window"], args["lanes"], args["n"], args["ns"], args["owned"] = window, e.cfg.Lanes, n, e.cfg.NS, owned
		err = claim.Query(ctx, tx, pre, preArgs, e.Q.Find, pgx.NamedArgs(args), func(rows pgx.Rows) error {
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
			return nil, 0, false, fmt.Errorf("relay: find lanes in %s: %w", e.cfg.Table, err)
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
			rows, err := tx.Query(ctx, e.cfg.Lock, pgx.NamedArgs{"candidates": chunk, "ns": e.cfg.NS})
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

// Sweep, once a second (or PollInterval), moves on the closed lanes
// that transactions went past and nobody holds, in a short transaction of
// its own: a lane without events keeps up that way, its window opening and
// closing with the others', so that late rows are looked for over a short
// range. It publishes nothing (a row it meets stops its lane, for the next
// claim to find), and it never holds a lane while a batch publishes: a
// relay frozen in a batch holds only the lanes of that batch's rows.
func (e *Engine) Sweep(ctx context.Context) error {
	now := time.Now()
	if now.UnixNano() < e.idleAt.Load() {
		return nil
	}
	e.idleAt.Store(now.Add(max(idleEvery, e.cfg.PollInterval)).UnixNano())
	var saved []Lane
	err := pgx.BeginFunc(ctx, e.cfg.DB, func(tx pgx.Tx) error {
		var idle []int32
		err := claim.Query(ctx, tx, e.cfg.TxSettings, []any{e.cfg.IdleMillis}, e.Q.Idle, pgx.NamedArgs{"locked": []int32{}, "ns": e.cfg.NS}, func(rows pgx.Rows) error {
			var err error
			idle, err = pgx.CollectRows(rows, pgx.RowTo[int32])
			return err
		})
		if err != nil || len(idle) == 0 {
			return err
		}
		saved, err = e.MoveOn(ctx, tx, idle)
		return err
	})
	if err == nil {
		e.Remember(saved...)
	} else {
		e.Forget()
	}
	if err != nil {
		return fmt.Errorf("relay: move on the idle lanes of %s: %w", e.cfg.Table, err)
	}
	return nil
}

// MoveOn reads on the lanes locked in tx without publishing (see
// Sweep) and writes the positions that changed, which it returns: a
// window with no row left in it closes, one with rows stops before them,
// for the next claim.
func (e *Engine) MoveOn(ctx context.Context, tx pgx.Tx, locked []int32) ([]Lane, error) {
	c, err := e.Read(ctx, tx, locked, e.cfg.BatchSize, nil, 0, map[int32]bool{}, nil, false)
	if err != nil {
		return nil, err
	}
	b := &pgx.Batch{}
	e.Save(ctx, b, c.Batch, nil, nil, nil)
	if b.Len() == 0 {
		return nil, nil
	}
	return c.Batch.saved, tx.SendBatch(ctx, b).Close()
}

// Read is the rest of a cursor claim, on the lanes locked: it reads
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
func (e *Engine) Read(ctx context.Context, tx pgx.Tx, locked []int32, n int, held []string, seen int, publish map[int32]bool, k *Keeper, first bool) (Claim, error) {
	q := e.Q
	// A new statement: its snapshot sees what the lanes' previous holder
	// committed.
	cb := newBatch(k)
	loadArgs := KeptArgs(k.given(locked))
	loadArgs["locked"], loadArgs["lanes"] = locked, e.cfg.Lanes
	pre, preArgs := "", []any(nil)
	if first {
		pre, preArgs = e.settings(tx, k)
	}
	var l Lane
	var floor *int64
	err := claim.Query(ctx, tx, pre, preArgs, q.Load, pgx.NamedArgs(loadArgs), func(rows pgx.Rows) error {
		_, err := pgx.ForEachRow(rows, []any{&l.Lane, &l.Done, &l.Upto, &l.Base, &l.Pos, &floor, &l.Skip, &l.Top}, func() error {
			l.Floor = l.Base + 1
			if floor != nil {
				l.Floor = *floor
			}
			cb.lanes[l.Lane] = l
			cb.order = append(cb.order, l.Lane)
			e.Remember(l)
			l = Lane{}
			return nil
		})
		return err
	})
	if err != nil {
		return Claim{}, fmt.Errorf("relay: read the lanes' positions in %s: %w", e.cfg.Table, err)
	}
	if len(cb.order) != len(locked) {
		// A lane without its row: the positions were changed under the relay.
		e.mu.Lock()
		e.ready = false
		e.mu.Unlock()
		return Claim{}, fmt.Errorf("relay: %s: %d of %d lanes have no position row", e.cfg.Table, len(locked)-len(cb.order), len(locked))
	}
	read := make(map[int32]Lane, len(cb.order))
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
	dones, uptos, starts := ReadArrays(e.cfg.Lanes, read)
	var out []claim.Row
	var x claim.Row
	var lane int32
	var bad []claim.Unreadable
	readArgs := pgx.NamedArgs{"dones": dones, "uptos": uptos, "starts": starts, "skip": skip, "from": from, "n": n, "lanes": e.cfg.Lanes}
	if publish != nil && len(publish) == 0 {
		// Nothing to publish (the idle lanes' sweep): the ids are enough.
		err = claim.Query(ctx, tx, "", nil, q.ReadIDs, readArgs, func(rs pgx.Rows) error {
			var id int64
			_, err := pgx.ForEachRow(rs, []any{&id, &lane}, func() error {
				cb.read(id, lane)
				cb.Held[id] = true
				return nil
			})
			return err
		})
		if err != nil {
			return Claim{}, fmt.Errorf("relay: read the idle lanes of %s: %w", e.cfg.Table, err)
		}
		cb.full = len(cb.IDs) == n
		if len(cb.IDs) > 0 {
			cb.last = cb.IDs[len(cb.IDs)-1]
		}
		return Claim{Batch: cb}, nil
	}
	// Under a savepoint: a row that cannot be read (see claim.IsUnreadable) does
	// not abort the transaction.
	err = claim.Query(ctx, tx, e.cfg.Guarded.Savepoint, nil, q.Read, readArgs, func(rs pgx.Rows) error {
		_, err := pgx.ForEachRow(rs, x.Scan(&lane), func() error {
			cb.read(x.ID, lane)
			out = append(out, x)
			x = claim.Row{}
			return nil
		})
		return err
	})
	if err != nil && claim.IsUnreadable(err) {
		// Read the ids alone, then the rows by id, setting aside those that
		// cannot be read (claim.Guarded); they are charged (parked) in the
		// pipeline, and their lanes go on past them.
		if _, rerr := tx.Exec(ctx, e.cfg.Guarded.RollbackTo); rerr != nil {
			return Claim{}, fmt.Errorf("relay: claim from %s: isolate an unreadable row: %w", e.cfg.Table, rerr)
		}
		cb.IDs, out = nil, nil
		clear(cb.LaneOf)
		var rs pgx.Rows
		if rs, err = tx.Query(ctx, q.ReadIDs, readArgs); err == nil {
			var id int64
			_, err = pgx.ForEachRow(rs, []any{&id, &lane}, func() error {
				cb.read(id, lane)
				return nil
			})
		}
		if err == nil {
			out, bad, _, err = e.cfg.Guarded.ReadGuarded(ctx, tx, cb.IDs, n)
		}
	}
	if err != nil {
		return Claim{}, fmt.Errorf("relay: claim from %s: %w", e.cfg.Table, err)
	}
	return cb.finish(out, bad, n, held, seen, publish), nil
}

// finish is the end of a cursor claim that read out (and bad) of at most n
// rows: rows whose key waits for a retry, or whose lane stopped, are read
// but not returned.
func (cb *Batch) finish(out []claim.Row, bad []claim.Unreadable, n int, held []string, seen int, publish map[int32]bool) Claim {
	cb.full = len(cb.IDs) == n
	if len(cb.IDs) > 0 {
		cb.last = cb.IDs[len(cb.IDs)-1]
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
		lane := cb.LaneOf[x.ID]
		if waits[x.Key] || stopped[lane] || publish != nil && !publish[lane] {
			cb.Held[x.ID] = true
			if len(cb.lanes[lane].Skip) >= SkipCap {
				stopped[lane] = true
			}
			continue
		}
		kept = append(kept, x)
	}
	return Claim{Rows: kept, Bad: bad, More: cb.full || seen >= 2*n, Batch: cb}
}

// readKept is Read for a claim that publishes, in one
// statement (Queries.Kept) instead of Load and Read where every lane
// locked is one the worker keeps (k): their positions are the worker's.
// It reads nothing, and returns no batch, when those lanes have no row to
// read (their windows stay as they were). Where a row cannot be read the
// transaction goes back to the savepoint and Read reads the lanes
// again, setting the row aside.
func (e *Engine) readKept(ctx context.Context, tx pgx.Tx, locked []int32, n int, held []string, seen int, k *Keeper, first bool) (Claim, error) {
	given := k.given(locked)
	if len(given) != len(locked) || len(given) == 0 {
		return e.Read(ctx, tx, locked, n, held, seen, nil, k, first)
	}
	cb := newBatch(k)
	args := KeptReadArgs(e.cfg.Lanes, given)
	args["n"], args["lanes"] = n, e.cfg.Lanes
	var out []claim.Row
	var x claim.Row
	var lane int32
	var now string
	var top int64
	var lateLanes []int32
	var lateIDs []int64
	b := &pgx.Batch{}
	if first {
		if pre, args := e.settings(tx, k); pre != "" {
			b.Queue(pre, args...)
		}
	}
	// Before the batch's transaction begins, when it can (see lazytx.Tx);
	// otherwise under a savepoint, as Read's Read.
	conn, alone := lazytx.Outside(tx)
	if !alone {
		b.Queue(e.cfg.Guarded.Savepoint)
	}
	b.Queue(e.Q.Kept, pgx.NamedArgs(args)).Query(func(rs pgx.Rows) error {
		_, err := pgx.ForEachRow(rs, x.Scan(&lane, &now, &top, &lateLanes, &lateIDs), func() error {
			cb.read(x.ID, lane)
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
			if _, rerr := tx.Exec(ctx, e.cfg.Guarded.RollbackTo); rerr != nil {
				return Claim{}, fmt.Errorf("relay: claim from %s: isolate an unreadable row: %w", e.cfg.Table, rerr)
			}
		}
		e.keptUnreadable.Add(1)
		return e.Read(ctx, tx, locked, n, held, seen, nil, k, false)
	}
	if err != nil {
		return Claim{}, fmt.Errorf("relay: claim from %s: %w", e.cfg.Table, err)
	}
	if len(out) == 0 {
		return Claim{More: seen >= 2*n}, nil
	}
	lates := make(map[int32]int64, len(lateLanes))
	for i, l := range lateLanes {
		if i < len(lateIDs) {
			lates[l] = lateIDs[i]
		}
	}
	for _, l := range given {
		l = Opened(l, now, top, lates)
		cb.lanes[l.Lane] = l
		cb.order = append(cb.order, l.Lane)
		e.Remember(l)
	}
	return cb.finish(out, nil, n, held, seen, nil), nil
}

// Save writes the positions of a cursor batch's lanes after its
// publish: published and parked rows are resolved, the others (failed,
// waiting behind their key) stop their lane.
//
// Under ExactlyOnce a row parked in this batch is not resolved yet: the
// position must be the one the batch's Kafka transaction recorded (see
// the relay's exactly-once settle), and the next batch's read no longer finds the row, which
// moved to the parked table in this transaction. (If the transaction does
// not commit, the row stays, unparked, and the recorded position stops
// before it.)
func (e *Engine) Save(ctx context.Context, b *pgx.Batch, cb *Batch, sent []claim.Row, errs []error, parked map[int64]bool) {
	resolved := make(map[int64]bool, len(sent))
	if !e.cfg.ExactlyOnce {
		for _, id := range cb.Parked {
			resolved[id] = true
		}
	}
	for i, x := range sent {
		if errs[i] == nil || !e.cfg.ExactlyOnce && parked[x.ID] {
			resolved[x.ID] = true
		}
	}
	// A lane whose position did not change is not written.
	var changed []Lane
	next := cb.Advance(func(id int64) bool { return resolved[id] })
	for _, l := range next {
		if old := cb.lanes[l.Lane]; !old.Equal(l) {
			changed = append(changed, l)
		}
	}
	if cb.own.keeping() {
		// Lanes kept across batches: written when due (see Keeper).
		cb.own.plan(b, cb, next, changed)
		return
	}
	if len(changed) > 0 {
		e.SaveLanes(b, changed)
	}
	cb.saved = changed
}

// advance returns the position of each of the batch's lanes after it, with
// resolved saying which of the rows read were published (or parked).
func (cb *Batch) Advance(resolved func(id int64) bool) []Lane {
	outcomes := map[int32][]Outcome{}
	for _, id := range cb.IDs {
		l := cb.LaneOf[id]
		outcomes[l] = append(outcomes[l], Outcome{ID: id, Resolved: resolved(id)})
	}
	out := make([]Lane, len(cb.order))
	for i, id := range cb.order {
		out[i] = Advance(cb.lanes[id], outcomes[id], cb.full, cb.last)
	}
	return out
}

// SaveLanes queues the statement that writes lanes' positions.
func (e *Engine) SaveLanes(b *pgx.Batch, lanes []Lane) {
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
		upto, skip = append(upto, u), append(skip, JoinSkip(l.Skip))
	}
	b.Queue(e.Q.Save, pgx.NamedArgs{"lane": lane, "done": done, "upto": upto, "base": base, "pos": pos, "floor": floor, "top": top, "skip": skip})
}
