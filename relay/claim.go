package relay

import (
	"strconv"
	"time"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/locks"
	"github.com/fxoutbox/outbox/relay/internal/claim"
	"github.com/fxoutbox/outbox/relay/internal/cursor"
	"github.com/fxoutbox/outbox/relay/internal/marks"
	"github.com/fxoutbox/outbox/relay/internal/streamsql"
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

// queries are the marks progress's statements, with the batch statements
// both progress modes share (relay/internal/marks), the stream's statements
// on its slot and the table's snapshot (relay/internal/streamsql), and the
// table's advisory lock namespace.
type queries struct {
	marks.Queries
	stream streamsql.Queries
	ns     int32 // advisory lock namespace of the table
}

// newQueries returns table t's statements and lock namespace.
func newQueries(t outbox.Table) queries {
	q := queries{Queries: marks.NewQueries(t, claim.Cols), stream: streamsql.NewQueries(t), ns: locks.Namespace(t.String())}
	return q
}

// txSettings returns the statement that sets a batch transaction's
// settings, the same for a session the relay keeps (see cursor.Keeper), and
// their argument: the planner's settings (see below), the server-side bound (a relay that hangs
// while holding locks loses them after BatchTimeout + 5s) and, unless
// SynchronousCommit, an asynchronous commit.
func txSettings(cfg Config, p Progress) (tx, session, idleMillis string) {
	// No parallel plans and no JIT: a batch's statements read a few rows,
	// and a Gather's start-up or a JIT compilation (seconds, where an
	// estimate went wrong) costs more than they do.
	//
	// The cursor's statements find rows through the (txid, id) index by
	// transaction ids that the table's statistics cannot predict: after a
	// bulk load (many rows per transaction) the planner expects each id to
	// match thousands of rows and scans the table instead, on every claim.
	// So no sequential scans under ProgressCursor; and generic plans: a
	// custom plan of the cursor's statements weighs each of their CTEs for
	// the values at hand, and making one cost more than running the
	// generic plan (bench cost section: cursor_relay_pg_us_per_event).
	commit := marks.CommitDefault
	switch {
	case cfg.Delivery == ExactlyOnce:
		// A lane's marks must be durable before its next Kafka
		// transaction: only its last one is read back.
		commit = marks.CommitSync
	case !cfg.SynchronousCommit:
		commit = marks.CommitAsync
	}
	cursor := p == ProgressCursor
	return marks.TxSettings(cursor, commit), marks.SessionSettings(cursor, commit), strconv.FormatInt((cfg.BatchTimeout + 5*time.Second).Milliseconds(), 10)
}

// claimed is what a finder (see pipeline) claimed in a batch's
// transaction.
type claimed struct {
	rows []claim.Row        // readable rows, in order
	bad  []claim.Unreadable // rows that cannot be read, in order
	more bool               // more unpublished rows are likely waiting
	// heldElsewhere: no rows, because the lanes of the unpublished rows the
	// claim saw are all held by other relays (PerKey only).
	heldElsewhere bool
	// marked: the finder claimed rows by marking them published in the
	// transaction (the stream does); deliver takes the mark back from
	// those that fail.
	marked bool
	// deferred: rows were left in the table for a sweep (the stream).
	deferred bool
	// eo: the ExactlyOnce batch (its worker's transaction), nil otherwise.
	eo *eoBatch
	// cur: the ProgressCursor batch (its lanes' positions), nil otherwise.
	cur *cursor.Batch
	// retry: nothing was claimed, and the next batch should run at once
	// (an exactly-once worker was fenced while taking lanes).
	retry bool
}
