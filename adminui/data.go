package adminui

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/admin"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/tablesql"
)

// The SQL the admin package does not have: a chart, parked groups under a
// filter, an event in any state, and the inbox's parked records under a
// filter. Each reads the partial indexes (parked rows, unpublished rows)
// or the BRIN index on created_at, never the whole table.

// querier is what the queries need: a *pgxpool.Pool, a *pgx.Conn or a
// pgx.Tx.
type querier interface {
	admin.Querier
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// overviewPage is the JSON of /api/overview.
type overviewPage struct {
	Tables  []tableOverview `json:"tables"`
	Inboxes []inboxOverview `json:"inboxes"`
}

// tableOverview is one outbox table on the overview.
type tableOverview struct {
	Table  string       `json:"table"`
	Status admin.Status `json:"status"`
	// Chart counts events published and parked per minute over the last
	// hour, oldest minute first (60 buckets).
	Chart chartData `json:"chart"`
	// Slot is the streaming relay's replication slot, when it exists.
	Slot *tablesql.SlotStatus `json:"slot,omitempty"`
}

// chartData is per-minute counts over the last hour.
type chartData struct {
	Published []int64 `json:"published"`
	Parked    []int64 `json:"parked"`
}

// inboxOverview is one inbox table's parked records.
type inboxOverview struct {
	Table  string                      `json:"table"`
	Parked int64                       `json:"parked"`
	Groups []tablesql.InboxParkedCount `json:"groups"`
}

const chartMinutes = 60

func (h *Handler) overview(ctx context.Context) (overviewPage, error) {
	ov := overviewPage{Tables: make([]tableOverview, len(h.cfg.Tables)), Inboxes: make([]inboxOverview, len(h.cfg.Inboxes))}
	var database string
	if err := h.cfg.DB.QueryRow(ctx, "SELECT current_database()").Scan(&database); err != nil {
		return ov, err
	}
	// The parts are independent statements: run them side by side on the
	// pool, so the page takes as long as the slowest.
	var fns []func() error
	for i, t := range h.cfg.Tables {
		to := &ov.Tables[i]
		to.Table = t.String()
		fns = append(fns,
			func() (err error) {
				to.Status, to.Chart, err = readStatus(ctx, h.cfg.DB, t, h.cfg.Lanes)
				return err
			},
			func() (err error) {
				to.Slot, err = readSlot(ctx, h.cfg.DB, t.Slot(database))
				return err
			})
	}
	for i, t := range h.cfg.Inboxes {
		io := &ov.Inboxes[i]
		io.Table = t.String()
		fns = append(fns, func() (err error) {
			if io.Groups, err = tablesql.CountInboxParked(ctx, h.cfg.DB, t); err != nil {
				return err
			}
			for _, g := range io.Groups {
				io.Parked += g.Count
			}
			return nil
		})
	}
	return ov, parallel(fns...)
}

// parallel runs fns side by side and returns the first error.
func parallel(fns ...func() error) error {
	errs := make([]error, len(fns))
	var wg sync.WaitGroup
	for i, f := range fns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f()
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// readSlot reads the streaming relay's replication slot, nil when there is
// none (the relay polls). ReadStream's setup checks are outboxctl's.
func readSlot(ctx context.Context, db querier, name string) (*tablesql.SlotStatus, error) {
	var slot tablesql.SlotStatus
	rows, err := db.Query(ctx, "SELECT active, coalesce(wal_status, ''), coalesce(confirmed_flush_lsn::text, ''),"+
		" (pg_current_wal_lsn() - confirmed_flush_lsn)::int8 FROM pg_replication_slots WHERE slot_name = $1", name)
	if err != nil {
		return nil, err
	}
	var lag *int64
	n, err := pgx.ForEachRow(rows, []any{&slot.Active, &slot.WALStatus, &slot.ConfirmedFlushLSN, &lag}, func() error { return nil })
	if err != nil || n.RowsAffected() == 0 {
		return nil, err
	}
	slot.Name, slot.Exists, slot.LagBytes = name, true, lag
	return &slot, nil
}

// readStatus reads what admin.ReadStatus reports (without the parked
// groups, which the parked page has) and the chart, each statement on its
// own connection, side by side: ReadStatus runs them one after another on
// one. The backlog count and the oldest waiting event each walk the index
// on unpublished rows past the parked ones, so they run apart too. The
// rates come from the chart: published/s is its last minute.
func readStatus(ctx context.Context, db querier, t outbox.Table, lanes int) (admin.Status, chartData, error) {
	st := admin.Status{Table: t.String(), ParkedGroups: []admin.ParkedGroup{}, Lanes: lanes, RateWindow: time.Minute, RateHorizon: chartHorizon}
	var (
		chart   chartData
		written int64
		ageSec  float64
	)
	ti := sqlname.Ident(t)
	cursor, err := tablesql.InCursorMode(ctx, db, t)
	if err != nil {
		return st, chart, err
	}
	parked, err := tablesql.ParkedIn(ctx, db, t)
	if err != nil {
		return st, chart, err
	}
	backlog := func() error {
		return db.QueryRow(ctx, "SELECT count(*) FROM (SELECT 1 FROM "+ti+" WHERE published_at IS NULL AND parked_at IS NULL LIMIT $1) b",
			tablesql.BacklogCap).Scan(&st.Backlog)
	}
	oldest := func() error {
		rows, err := db.Query(ctx, "SELECT created_at, extract(epoch FROM now() - created_at)::float8 FROM "+ti+
			" WHERE published_at IS NULL AND parked_at IS NULL ORDER BY id LIMIT 1")
		if err != nil {
			return err
		}
		_, err = pgx.ForEachRow(rows, []any{&st.OldestCreatedAt, &ageSec}, func() error { return nil })
		return err
	}
	if cursor {
		// Cursor progress: what waits is read from the lanes' positions.
		backlog = func() error {
			c, err := tablesql.ReadCounts(ctx, db, t)
			st.Backlog, st.OldestCreatedAt, ageSec = c.Backlog, c.OldestCreatedAt, c.OldestAge.Seconds()
			return err
		}
		oldest = func() error { return nil }
	}
	err = parallel(
		backlog,
		oldest,
		func() error {
			return db.QueryRow(ctx, "SELECT (SELECT count(*) FROM "+sqlname.Ident(parked.Table)+" WHERE "+parked.Where+"),"+
				" (SELECT count(*) FROM "+ti+" WHERE created_at >= now() - interval '1 minute')").Scan(&st.Parked, &written)
		},
		func() (err error) {
			st.LanesHeld, st.Sessions, err = admin.ReadRelays(ctx, db, t)
			return err
		},
		func() (err error) {
			chart, err = readChart(ctx, db, t, parked)
			return err
		})
	if err != nil {
		return st, chart, fmt.Errorf("adminui: status of %s: %w", t, err)
	}
	st.BacklogCapped = st.Backlog >= tablesql.BacklogCap
	st.OldestAge = time.Duration(max(0, ageSec) * float64(time.Second))
	st.WrittenPerSecond = float64(written) / 60
	st.PublishedPerSecond = float64(chart.Published[chartMinutes-1]) / 60
	return st, chart, nil
}

// chartHorizon bounds the events the chart's publish counts look at to
// those written within it, as ReadStatus's RateHorizon does: the BRIN index
// on created_at then reads recent block ranges, not the table. Events
// published in the last hour that were written earlier (a drained backlog,
// requeued or replayed events) are not counted.
const chartHorizon = 70 * time.Minute

// readChart counts published events per minute among those written within
// chartHorizon, and parked events per minute from the partial index on
// parked rows (in cursor mode, from the parked table, p).
func readChart(ctx context.Context, db querier, t outbox.Table, p tablesql.ParkedRows) (chartData, error) {
	c := chartData{Published: make([]int64, chartMinutes), Parked: make([]int64, chartMinutes)}
	// Two statements side by side: each reads rows the other does not
	// (recent block ranges; the parked rows).
	series := func(into []int64, sql string, args ...any) func() error {
		return func() error {
			rows, err := db.Query(ctx, sql, args...)
			if err != nil {
				return err
			}
			var ago int
			var n int64
			_, err = pgx.ForEachRow(rows, []any{&ago, &n}, func() error {
				into[chartMinutes-1-min(max(ago, 0), chartMinutes-1)] += n
				return nil
			})
			return err
		}
	}
	return c, parallel(
		series(c.Published, "SELECT floor(extract(epoch FROM now() - published_at) / 60)::int, count(*) FROM "+sqlname.Ident(t)+
			" WHERE created_at >= now() - $1::float8 * interval '1 second' AND published_at >= now() - interval '1 hour' GROUP BY 1", chartHorizon.Seconds()),
		series(c.Parked, "SELECT floor(extract(epoch FROM now() - parked_at) / 60)::int, count(*) FROM "+sqlname.Ident(p.Table)+
			" WHERE "+p.Where+" AND parked_at >= now() - interval '1 hour' GROUP BY 1"))
}

// eventFilter is what the parked pages filter on: the query parameters topic,
// type, key, event_id and reason (the last error contains it, any case).
type eventFilter struct {
	Topic   string `json:"topic,omitempty"`
	Type    string `json:"type,omitempty"`
	Key     string `json:"key,omitempty"`
	EventID string `json:"event_id,omitempty"`
	Reason  string `json:"reason,omitempty"`
	// Consumer filters an inbox's records by consumer name.
	Consumer string `json:"consumer,omitempty"`
}

// Empty reports whether f has no condition.
func (f eventFilter) Empty() bool { return f == eventFilter{} }

// String is the filter as the audit log shows it.
func (f eventFilter) String() string {
	if f.Empty() {
		return "everything"
	}
	b, _ := json.Marshal(f)
	return string(b)
}

var errBadEventID = errors.New("event_id is not a UUID")

func (f eventFilter) admin() (admin.Filter, error) {
	af := admin.Filter{Topic: f.Topic, Type: f.Type, Key: f.Key, Error: f.Reason}
	if f.EventID != "" {
		id, err := uuid.Parse(strings.TrimSpace(f.EventID))
		if err != nil {
			return af, errBadEventID
		}
		af.EventIDs = []uuid.UUID{id}
	}
	return af, nil
}

// parkedGroupRow is a group of parked events of one topic and reason.
type parkedGroupRow struct {
	Topic         string    `json:"topic"`
	ErrorType     string    `json:"error_type"`
	Reason        string    `json:"reason"`
	Count         int64     `json:"count"`
	FirstParkedAt time.Time `json:"first_parked_at"`
	LastParkedAt  time.Time `json:"last_parked_at"`
}

// maxGroups is the most groups the parked page shows.
const maxGroups = 50

// parkedGroups groups the parked events that match f by topic and reason
// (the first 200 bytes of the last error: the relay stores one text per
// cause), largest first. In cursor mode they are the parked table's rows,
// grouped by their reason.
func parkedGroups(ctx context.Context, db querier, t outbox.Table, f admin.Filter, limit int) ([]parkedGroupRow, error) {
	p, err := tablesql.ParkedIn(ctx, db, t)
	if err != nil {
		return nil, err
	}
	args := pgx.NamedArgs{"limit": limit}
	errExpr := p.LastError
	if p.Moved {
		errExpr = "coalesce(reason, '') || ' ' || coalesce(last_error, '')"
	}
	where := tablesql.Filter{EventIDs: f.EventIDs, Topic: f.Topic, Type: f.Type, Key: f.Key, Error: f.Error}.Where(args, errExpr) // the fields the UI sets
	// Grouped by text first: the error type's regular expression then runs
	// once per group, not once per row (5x faster at 100,000 rows).
	rows, err := db.Query(ctx, "SELECT topic, "+tablesql.ErrorTypeSQL+", last_error, n, f, l FROM ("+
		"SELECT coalesce(topic, '') AS topic, left(coalesce("+p.Reason+", ''), 200) AS last_error, count(*) AS n, min(parked_at) AS f, max(parked_at) AS l FROM "+
		sqlname.Ident(p.Table)+" WHERE "+p.Where+where+" GROUP BY 1, 2 ORDER BY 3 DESC, 1, 2 LIMIT @limit) g ORDER BY n DESC, topic, last_error", args)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (parkedGroupRow, error) {
		var g parkedGroupRow
		err := r.Scan(&g.Topic, &g.ErrorType, &g.Reason, &g.Count, &g.FirstParkedAt, &g.LastParkedAt)
		return g, err
	})
}

// eventRow is an event in any state, as the detail page shows it.
type eventRow struct {
	admin.ParkedEvent
	// State is "pending", "published" or "parked".
	State       string     `json:"state"`
	PublishedAt *time.Time `json:"published_at"`
	// TraceID is the trace id of the traceparent header, "" if none.
	TraceID string `json:"trace_id,omitempty"`
}

func getEvent(ctx context.Context, db querier, t outbox.Table, id uuid.UUID) (eventRow, error) {
	var (
		e         eventRow
		parkedAt  *time.Time
		headers   []byte
		lastError *string
	)
	// Under cursor progress a delivered row keeps published_at NULL: its
	// lane's position says it was delivered.
	delivered := "published_at IS NOT NULL"
	if cursor, err := tablesql.InCursorMode(ctx, db, t); err != nil {
		return e, err
	} else if cursor {
		delivered = tablesql.Delivered(t)
	}
	var isDelivered bool
	rows, err := db.Query(ctx, "SELECT id, event_id, event_type, aggregate_type, aggregate_id, topic, partition_key, attempts, last_error, created_at,"+
		" parked_at, published_at, payload, headers, "+delivered+" FROM "+sqlname.Ident(t)+" WHERE event_id = $1", id)
	if err != nil {
		return e, err
	}
	n, err := pgx.ForEachRow(rows, []any{&e.ID, &e.EventID, &e.EventType, &e.AggregateType, &e.AggregateID, &e.Topic, &e.Key, &e.Attempts,
		&lastError, &e.CreatedAt, &parkedAt, &e.PublishedAt, &e.Payload, &headers, &isDelivered}, func() error { return nil })
	if err != nil {
		return e, err
	}
	if n.RowsAffected() == 0 {
		// In cursor mode a parked event moved to the parked table.
		p, err := admin.GetParked(ctx, db, t, id)
		switch {
		case errors.Is(err, admin.ErrNotParked):
			return e, admin.ErrNotFound // it came back meanwhile (requeued)
		case err != nil:
			return e, err
		}
		e.ParkedEvent, e.State = p, "parked"
		e.Headers = p.Headers
		setTraceID(&e)
		return e, nil
	}
	if lastError != nil {
		e.LastError = *lastError
	}
	switch {
	case isDelivered:
		e.State = "published"
	case parkedAt != nil:
		e.State, e.ParkedAt = "parked", *parkedAt
	default:
		e.State = "pending"
	}
	if len(headers) > 0 {
		if err := json.Unmarshal(headers, &e.Headers); err != nil {
			e.Headers = map[string]string{"(headers)": string(headers)}
		}
	}
	setTraceID(&e)
	return e, nil
}

// setTraceID sets e's TraceID from its traceparent header.
func setTraceID(e *eventRow) {
	if tp := e.Headers["traceparent"]; tp != "" {
		if p := strings.Split(tp, "-"); len(p) == 4 && len(p[1]) == 32 {
			e.TraceID = p[1]
		}
	}
}

// prettyJSON indents a JSON document; anything else comes back as text.
func prettyJSON(b []byte) string {
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil {
		return printable(b)
	}
	return out.String()
}

// printable is b as text when it is UTF-8, else as hex.
func printable(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	return fmt.Sprintf("(%d bytes, not UTF-8) %x", len(b), b)
}

// inboxParkedTable is where an inbox keeps its parked records.
func inboxParkedTable(t outbox.Table) outbox.Table {
	return outbox.Table{Schema: t.Schema, Name: t.Name + "_parked"}
}

func (f inboxFilter) sql(args pgx.NamedArgs) string {
	var b strings.Builder
	add := func(cond, name string, v string) {
		if v != "" {
			b.WriteString(" AND " + cond)
			args[name] = v
		}
	}
	add("consumer = @f_consumer", "f_consumer", f.Consumer)
	add("topic = @f_topic", "f_topic", f.Topic)
	add("error_type = @f_error_type", "f_error_type", f.ErrorType)
	add("event_id = @f_event_id", "f_event_id", f.EventID)
	return b.String()
}

const inboxCols = `id, consumer, coalesce(event_id, ''), coalesce(event_type, ''), topic, "partition", "offset", attempts, error_type, last_error, parked_at`

// listInboxParked lists an inbox's parked records matching f after the id
// after, by id (the primary key), without their values.
func listInboxParked(ctx context.Context, db querier, t outbox.Table, f inboxFilter, after int64, limit int) ([]tablesql.InboxParked, error) {
	args := pgx.NamedArgs{"after": after, "limit": limit}
	rows, err := db.Query(ctx, "SELECT "+inboxCols+" FROM "+sqlname.Ident(inboxParkedTable(t))+" WHERE id > @after"+f.sql(args)+" ORDER BY id LIMIT @limit", args)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (tablesql.InboxParked, error) {
		var p tablesql.InboxParked
		err := r.Scan(&p.ID, &p.Consumer, &p.EventID, &p.Type, &p.Topic, &p.Partition, &p.Offset, &p.Attempts, &p.ErrorType, &p.LastError, &p.ParkedAt)
		return p, err
	})
}

func countInboxParked(ctx context.Context, db querier, t outbox.Table, f inboxFilter, ids []int64) (int, error) {
	args := pgx.NamedArgs{}
	where := f.sql(args)
	if ids != nil {
		where += " AND id = ANY(@ids)"
		args["ids"] = ids
	}
	var n int
	err := db.QueryRow(ctx, "SELECT count(*) FROM "+sqlname.Ident(inboxParkedTable(t))+" WHERE true"+where, args).Scan(&n)
	return n, err
}

// deleteInboxParked deletes the records matching f (and ids, when not
// nil), chunk rows per statement in id order.
func deleteInboxParked(ctx context.Context, db querier, t outbox.Table, f inboxFilter, ids []int64, chunk int, progress func(int)) (int, error) {
	args := pgx.NamedArgs{"chunk": chunk}
	where := f.sql(args)
	if ids != nil {
		where += " AND id = ANY(@ids)"
		args["ids"] = ids
	}
	tbl := sqlname.Ident(inboxParkedTable(t))
	sql := "WITH c AS (SELECT id FROM " + tbl + " WHERE id > @after" + where + " ORDER BY id LIMIT @chunk)," +
		" d AS (DELETE FROM " + tbl + " p USING c WHERE p.id = c.id RETURNING 1) SELECT (SELECT max(id) FROM c), (SELECT count(*) FROM d)::int"
	done := 0
	var after int64
	for {
		if err := ctx.Err(); err != nil {
			return done, err
		}
		args["after"] = after
		var last *int64
		var n int
		if err := db.QueryRow(ctx, sql, args).Scan(&last, &n); err != nil {
			return done, err
		}
		if last == nil {
			return done, nil
		}
		after, done = *last, done+n
		progress(done)
	}
}
