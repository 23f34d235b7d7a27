package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/locks"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/tablesql"
	"github.com/fxoutbox/outbox/internal/textcut"
	"github.com/fxoutbox/outbox/relay"
)

// StatusOptions tunes ReadStatus. A nil *StatusOptions means the defaults.
type StatusOptions struct {
	// Lanes is the number of lanes the relays use (OUTBOX_LANES), reported
	// next to the lanes held. Default 64.
	Lanes int
	// RateWindow is the period over which the write and publish rates are
	// measured, ending now. Default 1m.
	RateWindow time.Duration
	// RateHorizon bounds the events the publish rate looks at to those
	// written within it, so the query reads recent block ranges (the BRIN
	// index on created_at) instead of the table: events older than the
	// horizon that were published within the window (a drain of an old
	// backlog, requeued or replayed events) are not counted. Default 1h, or
	// the age of the oldest unpublished event plus 10m if that is longer,
	// up to 24h.
	RateHorizon time.Duration
	// ParkedGroups is the most topic and reason groups of parked events
	// reported, largest first; -1 reports none and skips their query (it
	// reads every parked row), for a caller that shows only the counts.
	// Default 20.
	ParkedGroups int
}

func (o *StatusOptions) withDefaults() (StatusOptions, error) {
	var c StatusOptions
	if o != nil {
		c = *o
	}
	if c.Lanes == 0 {
		c.Lanes = 64
	}
	if c.RateWindow == 0 {
		c.RateWindow = time.Minute
	}
	if c.ParkedGroups == 0 {
		c.ParkedGroups = 20
	}
	switch {
	case c.Lanes < 1 || c.Lanes > 4096:
		return c, &outbox.ConfigError{Field: "StatusOptions.Lanes", Reason: fmt.Sprintf("is %d: use 1 to 4096 (default 64)", c.Lanes)}
	case c.RateWindow < time.Second:
		return c, &outbox.ConfigError{Field: "StatusOptions.RateWindow", Reason: fmt.Sprintf("is %v: use at least 1s (default 1m)", c.RateWindow)}
	case c.RateHorizon < 0 || (c.RateHorizon > 0 && c.RateHorizon < c.RateWindow):
		return c, &outbox.ConfigError{Field: "StatusOptions.RateHorizon", Reason: fmt.Sprintf("is %v: use at least RateWindow %v (default 1h)", c.RateHorizon, c.RateWindow)}
	case c.ParkedGroups < -1:
		return c, &outbox.ConfigError{Field: "StatusOptions.ParkedGroups", Reason: fmt.Sprintf("is %d: use at least 1, or -1 for none (default 20)", c.ParkedGroups)}
	}
	return c, nil
}

// Status is a snapshot of an outbox table and the relays working on it.
type Status struct {
	Table string `json:"table"`
	// Backlog is the number of unpublished, unparked events, counted up
	// to 1,000,000 (a bounded index scan, as the relay's outbox.backlog
	// metric counts); BacklogCapped says the count stopped there.
	Backlog       int64 `json:"backlog"`
	BacklogCapped bool  `json:"backlog_capped"`
	// OldestAge is the age of the oldest unpublished, unparked event (by
	// id, the one the relays take first); 0 when there is none, never
	// negative (clocks).
	OldestAge time.Duration `json:"-"`
	// OldestCreatedAt is when that event was written; nil when there is none.
	OldestCreatedAt *time.Time `json:"oldest_created_at"`
	// WrittenPerSecond is the rate of events written during the last
	// RateWindow; PublishedPerSecond the rate of events published during
	// it, among those written within RateHorizon.
	WrittenPerSecond   float64       `json:"written_per_second"`
	PublishedPerSecond float64       `json:"published_per_second"`
	RateWindow         time.Duration `json:"-"`
	RateHorizon        time.Duration `json:"-"`
	// Parked is the number of parked events; ParkedGroups splits them by
	// topic and reason, largest groups first (at most
	// StatusOptions.ParkedGroups).
	Parked       int64         `json:"parked"`
	ParkedGroups []ParkedGroup `json:"parked_groups"`
	// Lanes is the configured number of lanes; LanesHeld are the lanes
	// relays hold right now, with the session holding each. A relay holds
	// its lanes only while a batch is in flight (milliseconds when it keeps
	// up): an empty list is normal for idle relays; a lane held for long
	// (Since) is a batch that hangs.
	Lanes     int        `json:"lanes"`
	LanesHeld []LaneHold `json:"lanes_held"`
	// Sessions are the database sessions seen working for this table's
	// relays: those holding lanes now, and those LISTENing on the table's
	// channel (relays with Listen, one each). A relay that neither listens
	// nor has a batch in flight is not seen.
	Sessions []Session `json:"sessions"`
	// PartitionsKept are, for a partitioned table
	// (migrations.Partitioned), the partitions past their upper bound that the
	// relays keep, with why: the reason starts with its class (retention,
	// undelivered, parked, older, lock_timeout, ahead, detach_pending) and
	// a colon. It is the relays' last word (every CleanupInterval).
	PartitionsKept []relay.PartitionKept `json:"partitions_kept"`
}

// MarshalJSON writes durations in seconds: oldest_age_seconds,
// rate_window_seconds and rate_horizon_seconds.
func (s Status) MarshalJSON() ([]byte, error) {
	type plain Status
	return json.Marshal(struct {
		plain
		OldestAge   float64 `json:"oldest_age_seconds"`
		RateWindow  float64 `json:"rate_window_seconds"`
		RateHorizon float64 `json:"rate_horizon_seconds"`
	}{plain(s), s.OldestAge.Seconds(), s.RateWindow.Seconds(), s.RateHorizon.Seconds()})
}

// ParkedGroup counts the parked events of one topic and reason.
type ParkedGroup struct {
	Topic string `json:"topic"`
	// ErrorType is the cause the relay recorded with the error (its
	// error.type, e.g. kafka.message_too_large, invalid_topic), or _OTHER
	// for errors recorded without one (by older versions, or by hand).
	ErrorType string `json:"error_type"`
	// Reason is the group's last error, cut to 200 bytes: the relay stores
	// one text per cause (see "Error types" in docs/operating.md), shown as
	// stored. Errors stored with numbers in them (by older versions, or by
	// hand) are grouped with their numbers replaced by N, and then show so.
	// Example is one of the errors as recorded.
	Reason        string    `json:"reason"`
	Example       string    `json:"example"`
	Count         int64     `json:"count"`
	FirstParkedAt time.Time `json:"first_parked_at"`
	LastParkedAt  time.Time `json:"last_parked_at"`
}

// LaneHold is a lane a relay holds: an advisory lock of its batch's
// transaction.
type LaneHold struct {
	Lane int `json:"lane"`
	PID  int `json:"pid"`
	// Since is when the holding transaction began; nil if the role may not
	// see the session.
	Since *time.Time `json:"since"`
}

// Session is a database session of a relay.
type Session struct {
	PID int `json:"pid"`
	// Application is the session's application_name (set it per service
	// in the connection string, e.g. ?application_name=orders-relay).
	Application string `json:"application"`
	// Client is the client's address; empty for a Unix socket or when the
	// role may not see it.
	Client    string     `json:"client"`
	Connected *time.Time `json:"connected"`
	// State is pg_stat_activity.state: "active", "idle in transaction", ...
	State string `json:"state"`
	// Lanes are the lanes the session holds now, in order.
	Lanes []int `json:"lanes"`
	// Listening says the session LISTENs on the table's channel.
	Listening bool `json:"listening"`
	// StatsReporter says the session holds the lock of the relay that
	// reports the table-wide gauges (internal/locks.StatsReporter).
	StatsReporter bool `json:"stats_reporter"`
}

// ReadStatus reads the table's status: counts from the partial indexes
// (in cursor mode, from the lanes' positions), rates from the BRIN index on
// created_at, parked groups from the parked index (in cursor mode, the
// parked table), and the relays' lanes and sessions from pg_locks and
// pg_stat_activity. Each statement stands alone; the numbers are close in
// time, not one snapshot.
func ReadStatus(ctx context.Context, db Querier, table outbox.Table, opts *StatusOptions) (Status, error) {
	st, err := readStatus(ctx, db, table, opts)
	if err != nil {
		return st, fmt.Errorf("admin: status of %s: %w", table, err)
	}
	return st, nil
}

// readStatus is ReadStatus without the error's context: one statement per
// part of Status, one after another, so that it reads top to bottom as
// the status prints.
func readStatus(ctx context.Context, db Querier, table outbox.Table, opts *StatusOptions) (Status, error) {
	st := Status{Table: table.String(), ParkedGroups: []ParkedGroup{}, LanesHeld: []LaneHold{}, Sessions: []Session{}, PartitionsKept: []relay.PartitionKept{}}
	if err := table.Validate(); err != nil {
		return st, err
	}
	o, err := opts.withDefaults()
	if err != nil {
		return st, err
	}
	st.Lanes, st.RateWindow = o.Lanes, o.RateWindow
	t := sqlname.Ident(table)

	c, err := tablesql.ReadCounts(ctx, db, table)
	if err != nil {
		return st, err
	}
	st.Backlog, st.BacklogCapped, st.OldestCreatedAt, st.OldestAge, st.Parked = c.Backlog, c.BacklogCapped, c.OldestCreatedAt, c.OldestAge, c.Parked
	st.PartitionsKept = []relay.PartitionKept{}
	for _, p := range c.PartitionsKept {
		st.PartitionsKept = append(st.PartitionsKept, relay.PartitionKept(p))
	}

	st.RateHorizon = o.RateHorizon
	if st.RateHorizon == 0 {
		st.RateHorizon = min(max(time.Hour, st.OldestAge+10*time.Minute), 24*time.Hour)
	}
	// Both counts read the BRIN index on created_at: rows are appended in
	// created_at order, and created_at <= published_at.
	var written, pub int64
	rows, err := db.Query(ctx, "SELECT (SELECT count(*) FROM "+t+" WHERE created_at >= now() - @window::float8 * interval '1 second'),"+
		" (SELECT count(*) FROM "+t+" WHERE created_at >= now() - @horizon::float8 * interval '1 second'"+
		" AND published_at >= now() - @window::float8 * interval '1 second')",
		pgx.NamedArgs{"window": o.RateWindow.Seconds(), "horizon": st.RateHorizon.Seconds()})
	if err != nil {
		return st, err
	}
	if _, err := pgx.ForEachRow(rows, []any{&written, &pub}, func() error { return nil }); err != nil {
		return st, err
	}
	st.WrittenPerSecond = float64(written) / o.RateWindow.Seconds()
	st.PublishedPerSecond = float64(pub) / o.RateWindow.Seconds()

	if st.Parked > 0 && o.ParkedGroups > 0 {
		p, err := tablesql.ParkedIn(ctx, db, table)
		if err != nil {
			return st, err
		}
		// Grouped by the reason with its numbers replaced by N, which also
		// groups reasons stored with numbers in them (by older versions, or
		// by hand); a group of one text shows it as stored. The rows are
		// grouped by their first 200 bytes first, so that the regular
		// expressions run once per distinct text, not once per row (at
		// 100,000 parked rows: 1.2s -> 0.15s); the error type is within
		// them.
		rows, err = db.Query(ctx, "SELECT topic, "+tablesql.ErrorTypeSQL+","+
			" CASE WHEN min(mn) = max(mx) THEN left(min(mn), 200) ELSE reason END,"+
			" min(mn), sum(n)::int8, min(f), max(l) FROM ("+
			"SELECT topic, last_error, regexp_replace(last_error, '[0-9]+', 'N', 'g') AS reason, mn, mx, n, f, l FROM ("+
			"SELECT coalesce(topic, '') AS topic, left(coalesce("+p.Reason+", ''), 200) AS last_error, min(coalesce("+p.Reason+", '')) AS mn, max(coalesce("+p.Reason+", '')) AS mx,"+
			" count(*) AS n, min(parked_at) AS f, max(parked_at) AS l"+
			" FROM "+sqlname.Ident(p.Table)+" WHERE "+p.Where+" GROUP BY 1, 2) d) p GROUP BY topic, 2, reason ORDER BY sum(n) DESC, topic, reason LIMIT @groups",
			pgx.NamedArgs{"groups": o.ParkedGroups})
		if err != nil {
			return st, err
		}
		var g ParkedGroup
		if _, err := pgx.ForEachRow(rows, []any{&g.Topic, &g.ErrorType, &g.Reason, &g.Example, &g.Count, &g.FirstParkedAt, &g.LastParkedAt}, func() error {
			g.Example = textcut.Cut(g.Example, 1000)
			st.ParkedGroups = append(st.ParkedGroups, g)
			return nil
		}); err != nil {
			return st, err
		}
	}

	st.LanesHeld, st.Sessions, err = readRelays(ctx, db, table)
	return st, err
}

// ReadRelays reads what ReadStatus reports of the relays: the lanes held
// right now and the sessions seen working for the table (LanesHeld and
// Sessions), from pg_locks and pg_stat_activity, in one statement.
func ReadRelays(ctx context.Context, db Querier, table outbox.Table) ([]LaneHold, []Session, error) {
	if err := table.Validate(); err != nil {
		return nil, nil, err
	}
	held, sessions, err := readRelays(ctx, db, table)
	if err != nil {
		return held, sessions, fmt.Errorf("admin: relays of %s: %w", table, err)
	}
	return held, sessions, nil
}

func readRelays(ctx context.Context, db Querier, table outbox.Table) ([]LaneHold, []Session, error) {
	st := Status{LanesHeld: []LaneHold{}, Sessions: []Session{}}
	// Lanes are advisory locks (namespace, lane): in pg_locks, classid is
	// the namespace as an unsigned number, objid the lane, objsubid 2.
	// The stats reporter's session lock has the same namespace and the
	// second key locks.StatsReporter (negative: objid past any lane).
	rows, err := db.Query(ctx, "WITH locks AS (SELECT l.pid, l.objid::int8 AS key FROM pg_locks l"+
		" WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 AND l.classid::int8 = @ns"+
		" AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())),"+
		" held AS (SELECT pid, key AS lane FROM locks WHERE key < 2147483648)"+
		" SELECT a.pid, coalesce(a.application_name, ''), coalesce(host(a.client_addr), ''), a.backend_start, a.xact_start, coalesce(a.state, ''),"+
		" coalesce((SELECT array_agg(h.lane::int ORDER BY h.lane) FROM held h WHERE h.pid = a.pid), '{}'),"+
		" coalesce(a.query = @listen AND a.datname = current_database(), false),"+
		" EXISTS (SELECT 1 FROM locks k WHERE k.pid = a.pid AND k.key = @reporter)"+
		" FROM pg_stat_activity a WHERE a.pid IN (SELECT pid FROM locks) OR (a.query = @listen AND a.datname = current_database())"+
		" ORDER BY a.pid",
		pgx.NamedArgs{"ns": int64(uint32(locks.Namespace(table.String()))), "reporter": int64(uint32(reporterLock)),
			"listen": "LISTEN " + pgx.Identifier{sqlname.Channel(table)}.Sanitize()})
	if err != nil {
		return st.LanesHeld, st.Sessions, err
	}
	var (
		s     Session
		since *time.Time
	)
	if _, err := pgx.ForEachRow(rows, []any{&s.PID, &s.Application, &s.Client, &s.Connected, &since, &s.State, &s.Lanes, &s.Listening, &s.StatsReporter}, func() error {
		for _, l := range s.Lanes {
			h := LaneHold{Lane: l, PID: s.PID}
			if since != nil {
				t := *since
				h.Since = &t
			}
			st.LanesHeld = append(st.LanesHeld, h)
		}
		st.Sessions = append(st.Sessions, s)
		s, since = Session{}, nil
		return nil
	}); err != nil {
		return st.LanesHeld, st.Sessions, err
	}
	return st.LanesHeld, st.Sessions, nil
}

// reporterLock is locks.StatsReporter in a variable, so that it
// converts to the unsigned objid pg_locks shows.
var reporterLock = locks.StatsReporter
