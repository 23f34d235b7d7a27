package outboxtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/migrations"
)

// Querier reads rows: a pgx.Tx, a *pgxpool.Pool or a *pgx.Conn.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Row is an outbox row as the database holds it.
type Row struct {
	// Record holds the event's columns: event_id (as ID), aggregate_type,
	// aggregate_id, event_type, payload, topic, partition_key and headers
	// (which include the trace context of the writer).
	Record
	// Seq is the row's id column: the order of insertion.
	Seq         int64
	CreatedAt   time.Time
	PublishedAt *time.Time // nil until the relay published the event
	Attempts    int
	LastError   string     // "" when none
	ParkedAt    *time.Time // non-nil when the relay parked the event
}

// Inserted returns the rows of table that db sees, in insertion order, only
// those of the given event types when any are named. A query error fails
// the test.
func Inserted(ctx context.Context, t T, db Querier, table outbox.Table, types ...string) []Row {
	t.Helper()
	rows, err := readRows(ctx, db, table, types)
	if err != nil {
		t.Fatalf("%v", err)
		return nil
	}
	return rows
}

func readRows(ctx context.Context, db Querier, table outbox.Table, types []string) ([]Row, error) {
	if err := table.Validate(); err != nil {
		return nil, fmt.Errorf("outboxtest: %w", err)
	}
	sql := "SELECT id, event_id, aggregate_type, aggregate_id, event_type, payload::text, topic, partition_key, headers::text," +
		" created_at, published_at, attempts, last_error, parked_at FROM " + sqlname.Ident(table)
	var args []any
	if len(types) > 0 {
		sql += " WHERE event_type = ANY($1)"
		args = append(args, types)
	}
	rows, err := db.Query(ctx, sql+" ORDER BY id", args...)
	if err != nil {
		return nil, fmt.Errorf("outboxtest: read the outbox rows of %s: %w", table, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Row, error) {
		var (
			r                Row
			payload          string
			headers, lastErr *string
		)
		err := row.Scan(&r.Seq, &r.ID, &r.AggregateType, &r.AggregateID, &r.Type, &payload, &r.Topic, &r.Key, &headers,
			&r.CreatedAt, &r.PublishedAt, &r.Attempts, &lastErr, &r.ParkedAt)
		if err != nil {
			return r, err
		}
		r.Payload = []byte(payload) // jsonb's text: its length is what Add bounded
		r.PayloadBytes = len(r.Payload)
		if headers != nil {
			if err := json.Unmarshal([]byte(*headers), &r.Headers); err != nil {
				return r, err
			}
		}
		if lastErr != nil {
			r.LastError = *lastErr
		}
		return r, nil
	})
	if err != nil {
		return nil, fmt.Errorf("outboxtest: read the outbox rows of %s: %w", table, err)
	}
	return out, nil
}

func records(rows []Row) []Record {
	recs := make([]Record, len(rows))
	for i, r := range rows {
		recs[i] = r.Record
	}
	return recs
}

// RequireInserted fails the test unless exactly one row of table, as db
// sees it, matches want, and returns that row. Pass the pool to see what
// UnitOfWork.Do committed; pass the test's pgx.Tx to see what AddTx
// inserted in it before it commits (or is rolled back).
func RequireInserted(ctx context.Context, t T, db Querier, table outbox.Table, want Want) Row {
	t.Helper()
	var types []string
	if want.Type != "" {
		types = []string{want.Type}
	}
	rows, err := readRows(ctx, db, table, types)
	if err != nil {
		t.Fatalf("%v", err)
		return Row{}
	}
	i := one(t, "the table "+table.String()+" holds", records(rows), want, "name more fields, or use RequireManyInserted")
	if i < 0 {
		return Row{}
	}
	return rows[i]
}

// RequireManyInserted fails the test unless the rows of table whose event
// type one of wants names match wants one to one, in insertion order, with
// none of those types left over. Rows of other types are not looked at, so
// tests that share a table do not see each other's events as long as they
// use different types; every Want must name its Type. It returns the rows.
func RequireManyInserted(ctx context.Context, t T, db Querier, table outbox.Table, wants ...Want) []Row {
	t.Helper()
	var types []string
	for i, w := range wants {
		if w.Type == "" {
			t.Fatalf("outboxtest: RequireManyInserted: wants[%d] names no Type", i)
			return nil
		}
		if !slices.Contains(types, w.Type) {
			types = append(types, w.Type)
		}
	}
	if len(types) == 0 {
		t.Fatalf("outboxtest: RequireManyInserted: no Want given (use RequireNotInserted to check for none)")
		return nil
	}
	rows, err := readRows(ctx, db, table, types)
	if err != nil {
		t.Fatalf("%v", err)
		return nil
	}
	if !many(t, "the table "+table.String()+" holds", records(rows), wants) {
		return nil
	}
	return rows
}

// RequireNotInserted fails the test if a row of table, as db sees it,
// matches want (a zero Want matches every row).
func RequireNotInserted(ctx context.Context, t T, db Querier, table outbox.Table, want Want) {
	t.Helper()
	var types []string
	if want.Type != "" {
		types = []string{want.Type}
	}
	rows, err := readRows(ctx, db, table, types)
	if err != nil {
		t.Fatalf("%v", err)
		return
	}
	var found []Record
	for _, r := range rows {
		if len(want.diff(r.Record)) == 0 {
			found = append(found, r.Record)
		}
	}
	if len(found) > 0 {
		t.Fatalf("outboxtest: the table %s holds %d events matching %s, want none:%s", table, len(found), want, listing(found, nil))
	}
}

// TB is the part of testing.TB that [Table] uses.
type TB interface {
	T
	Cleanup(func())
}

// DB is what [Table] needs: a *pgxpool.Pool or a *pgx.Conn.
type DB interface {
	migrations.DB
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Table creates a schema of its own (named outboxtest_ and random
// characters) holding an outbox table made as a new install's
// (migrations.Install: every migration, the cursor's too, so a relay with
// the default Progress records cursor progress on it), and
// drops the schema when the test ends, through db: db must stay open until
// then, so close a pool with t.Cleanup(pool.Close) registered before Table
// (cleanups run last registered first), not with defer, which runs before
// any cleanup. Tests that each use their own Table never see each other's
// events; a test of several outboxes calls Table once for each.
func Table(t TB, db DB) outbox.Table {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	table := outbox.Table{Schema: "outboxtest_" + hex.EncodeToString(b)}
	ctx := context.Background()
	t.Cleanup(func() {
		if _, err := db.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{table.Schema}.Sanitize()+" CASCADE"); err != nil {
			hint := ""
			if strings.Contains(err.Error(), "closed pool") {
				hint = " (the pool was closed before the test ended: close it with t.Cleanup(pool.Close) registered before outboxtest.Table, not with defer)"
			}
			t.Errorf("outboxtest: drop the test schema %s: %v%s", table.Schema, err, hint)
		}
	})
	if _, err := migrations.Install(ctx, db, table); err != nil {
		t.Fatalf("outboxtest: migrate a test outbox table: %v", err)
		return outbox.Table{}
	}
	return table
}
