package faulttest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/tablesql"
	"github.com/fxoutbox/outbox/migrations"
	"github.com/fxoutbox/outbox/relay"
)

// envProgress selects the progress of the relays the battery starts:
// "cursor" runs every per-key relay, polling or streaming, either delivery
// (in this process, the re-exec'd relay processes, the orders service of
// the SIGTERM test) with relay.ProgressCursor on tables that have the cursor migration,
// and the checks then read what was delivered from the lanes' positions
// instead of published_at. Unset (or "marks"): the relays' default, except
// for exactly-once streaming relays, which always record cursor progress
// (see progressFor).
const envProgress = "OUTBOX_TEST_PROGRESS"

// parseChoice returns the one of values whose String is s (any case, spaces
// around ignored), values[0] when s is empty: the battery's variables take
// the spellings of OUTBOX_DELIVERY and OUTBOX_PROGRESS, which are the
// values' String.
func parseChoice[T fmt.Stringer](s string, values ...T) (T, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	var names []string
	for _, v := range values {
		if s == "" || s == v.String() {
			return v, nil
		}
		names = append(names, v.String())
	}
	var zero T
	return zero, fmt.Errorf("%q: use %s", s, strings.Join(names, " or "))
}

var (
	progressOnce sync.Once
	progressVal  relay.Progress
	progressErr  error
)

// testProgress is the progress OUTBOX_TEST_PROGRESS asks for; a bad value
// fails the test.
func testProgress(t testing.TB) relay.Progress {
	t.Helper()
	progressOnce.Do(func() {
		progressVal, progressErr = parseChoice(os.Getenv(envProgress), relay.ProgressMarks, relay.ProgressCursor)
	})
	if progressErr != nil {
		t.Fatalf("%s: %v", envProgress, progressErr)
	}
	return progressVal
}

// progressFor is the progress of a scenario's relays: OUTBOX_TEST_PROGRESS,
// except for exactly-once streaming, which records cursor progress only
// (the relay refuses marks in Stream mode): its relays get ProgressCursor,
// and the log says so when the variable asked for marks or was unset.
// Exactly-once polling relays record either (under cursor their positions
// travel in the Kafka transactions' progress records too).
func progressFor(t testing.TB, delivery relay.Delivery, mode relay.Mode) relay.Progress {
	t.Helper()
	p := testProgress(t)
	if p == relay.ProgressCursor || delivery != relay.ExactlyOnce || mode != relay.Stream {
		return p
	}
	asked := os.Getenv(envProgress)
	if strings.TrimSpace(asked) == "" {
		asked = "(unset: marks)"
	}
	t.Logf("%s=%s: exactly-once streaming records cursor progress only (the relay refuses marks in Stream mode): this scenario's relays run with cursor progress, on a table with the cursor migration", envProgress, asked)
	return relay.ProgressCursor
}

// cursorReady applies the cursor migration to table (before any event is
// written: a cursor relay refuses rows written before it).
func cursorReady(t testing.TB, db migrations.DB, table outbox.Table) {
	t.Helper()
	if err := migrations.Cursor.Up(context.Background(), db, table); err != nil {
		t.Fatalf("cursor migration: %v", err)
	}
}

// defaultLanes is relay.Config.Lanes' default, the lanes of the battery's
// relays, for tablesql.Lane.
const defaultLanes = "64"

// deliveredSQL is the condition, on a row of table (unqualified columns),
// that the row was delivered, under progress p: published_at set (marks),
// or held by its lane's position (cursor): in the lane's done snapshot
// (tablesql.Delivered), or delivered in the lane's open window (at or
// below its start, or in its skip list), as tablesql's backlog counts it.
//
// tablesql.Delivered alone leaves out the rows of open windows: a window
// whose last batch stopped at its limit stays open until its lane's next
// claim, which needs a new event of the lane, so a wait on it alone could
// wait for ever once the writers stop.
func deliveredSQL(table outbox.Table, p relay.Progress) string {
	if p != relay.ProgressCursor {
		return "published_at IS NOT NULL"
	}
	return "(" + tablesql.Delivered(table) + " OR EXISTS (SELECT FROM " + sqlname.Ident(sqlname.Cursor(table)) + " w" +
		" WHERE w.lane = " + tablesql.Lane("partition_key", "w.lanes") + " AND w.upto IS NOT NULL AND pg_visible_in_snapshot(txid, w.upto)" +
		" AND (id <= greatest(w.pos, w.floor - 1) OR id = ANY(w.skip))))"
}

// waitingSQL is the negation of deliveredSQL: the rows not delivered yet
// (parked ones included, as published_at IS NULL includes them).
func waitingSQL(table outbox.Table, p relay.Progress) string {
	if p != relay.ProgressCursor {
		return "published_at IS NULL"
	}
	return "NOT " + deliveredSQL(table, p)
}

// cursorCounts returns, in one snapshot, the rows of table and its counts
// as tablesql.ReadCounts (admin.ReadStatus) computes them from the lanes'
// positions: the backlog and the parked rows.
func cursorCounts(ctx context.Context, db tablesql.Querier, table outbox.Table) (rows int64, c tablesql.Counts, err error) {
	begin, ok := db.(interface {
		BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error)
	})
	if !ok {
		c, err = tablesql.ReadCounts(ctx, db, table)
		return 0, c, err
	}
	err = func() error {
		tx, err := begin.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if err := tx.QueryRow(ctx, "SELECT count(*) FROM "+sqlname.Ident(table)).Scan(&rows); err != nil {
			return err
		}
		c, err = tablesql.ReadCounts(ctx, tx, table)
		return err
	}()
	return rows, c, err
}
