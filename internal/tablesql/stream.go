package tablesql

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/textcut"
	"github.com/fxoutbox/outbox/migrations"
)

// serverSetup is what the server says of its replication settings and the
// role.
type serverSetup struct {
	walLevel            string
	maxSlots, maxSender int
	replication         bool // REPLICATION, SUPERUSER, or rds_replication
	role, database      string
	slotsUsed           int
	slotNames           []string
}

func readServerSetup(ctx context.Context, db Querier) (serverSetup, error) {
	var s serverSetup
	rows, err := db.Query(ctx, `SELECT current_setting('wal_level'), current_setting('max_replication_slots')::int, current_setting('max_wal_senders')::int,
		coalesce((SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user), false)
			OR EXISTS (SELECT FROM pg_roles WHERE rolname = 'rds_replication' AND pg_has_role(current_user, oid, 'MEMBER')),
		current_user, current_database(),
		(SELECT count(*) FROM pg_replication_slots),
		(SELECT coalesce((array_agg(slot_name::text ORDER BY slot_name))[1:5], '{}') FROM pg_replication_slots)`)
	if err != nil {
		return s, err
	}
	_, err = pgx.ForEachRow(rows, []any{&s.walLevel, &s.maxSlots, &s.maxSender, &s.replication, &s.role, &s.database, &s.slotsUsed, &s.slotNames}, func() error { return nil })
	return s, err
}

// slotRow is a row of pg_replication_slots, read with to_jsonb so that the
// columns of every supported version decode.
type slotRow struct {
	SlotType          string  `json:"slot_type"`
	Plugin            *string `json:"plugin"`
	Database          *string `json:"database"`
	Temporary         bool    `json:"temporary"`
	Active            bool    `json:"active"`
	ActivePID         *int    `json:"active_pid"`
	RestartLSN        *string `json:"restart_lsn"`
	ConfirmedFlushLSN *string `json:"confirmed_flush_lsn"`
	WALStatus         *string `json:"wal_status"`          // 13+
	SafeWALSize       *int64  `json:"safe_wal_size"`       // 13+
	Conflicting       *bool   `json:"conflicting"`         // 16+
	InvalidationCause *string `json:"invalidation_reason"` // 17+
}

func (r slotRow) lost() bool {
	return (r.WALStatus != nil && *r.WALStatus == "lost") || (r.Conflicting != nil && *r.Conflicting) || r.InvalidationCause != nil
}

func str(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// readSlot reads the slot named name; ok is false when there is none. The
// byte counts are from the server's current WAL position (its replay
// position on a standby).
func readSlot(ctx context.Context, db Querier, name string) (r slotRow, lag, retained *int64, ok bool, err error) {
	rows, err := db.Query(ctx, `SELECT to_jsonb(s), pg_wal_lsn_diff(w.lsn, s.confirmed_flush_lsn)::int8, pg_wal_lsn_diff(w.lsn, s.restart_lsn)::int8
		FROM pg_replication_slots s,
			(SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END AS lsn) w
		WHERE s.slot_name = $1`, name)
	if err != nil {
		return r, nil, nil, false, err
	}
	var raw []byte
	n, err := pgx.ForEachRow(rows, []any{&raw, &lag, &retained}, func() error { return nil })
	if err != nil || n.RowsAffected() == 0 {
		return r, nil, nil, false, err
	}
	return r, lag, retained, true, json.Unmarshal(raw, &r)
}

// CheckStream checks that the server is set up for the streaming relay of
// table (relay.Stream), in this order: wal_level is logical; the table's
// publication (outbox.Table.Publication) exists and is FOR TABLE the table
// WITH (publish = 'insert'); the current role has REPLICATION (or is a
// superuser); max_replication_slots and max_wal_senders are above 0 and,
// when the table's slot does not exist yet, a slot is free; and if the
// slot (outbox.Table.Slot) exists, it is a pgoutput logical slot of this
// database and was not invalidated. The first problem found is returned as
// a *outbox.StreamSetupError; a failing query as a wrapped error.
//
// It reads only catalogs and settings every role may read, and changes
// nothing. The role is the current one (current_user): connect as the
// role the relay's replication connection logs in as.
func CheckStream(ctx context.Context, db Querier, table outbox.Table) error {
	table = table.WithDefaults()
	if err := table.Validate(); err != nil {
		return err
	}
	if err := checkStream(ctx, db, table); err != nil {
		var se *outbox.StreamSetupError
		if errors.As(err, &se) {
			return err
		}
		return fmt.Errorf("admin: check streaming setup of %s: %w", table, err)
	}
	return nil
}

func checkStream(ctx context.Context, db Querier, table outbox.Table) error {
	fail := func(check, reason, fix string) error {
		return &outbox.StreamSetupError{Table: table.String(), Check: check, Reason: reason, Fix: fix}
	}
	s, err := readServerSetup(ctx, db)
	if err != nil {
		return err
	}
	if s.walLevel != "logical" {
		return fail(outbox.StreamCheckWALLevel, fmt.Sprintf("wal_level is %s, not logical, so the server cannot decode its WAL into a replication slot", s.walLevel),
			"set wal_level = logical in postgresql.conf (or as a superuser: ALTER SYSTEM SET wal_level = logical) and restart PostgreSQL, a reload is not enough;"+
				" on Amazon RDS and Aurora set rds.logical_replication = 1 in the DB parameter group and reboot;"+
				" on Google Cloud SQL set the flag cloudsql.logical_decoding = on;"+
				" on Azure Database for PostgreSQL set the server parameter wal_level = logical and restart."+
				" Or run the relay in polling mode (the default), which needs none of this")
	}

	if err := checkTable(ctx, db, table); err != nil {
		return err
	}
	p, err := migrations.ReadPublication(ctx, db, table)
	if err != nil {
		return err
	}
	if !p.Exists {
		return fail(outbox.StreamCheckPublication, fmt.Sprintf("the publication %s does not exist", p.Name),
			"create it as the table's owner: migrations.Stream.Up, the migration in migrations/stream/, or "+p.Fix(table))
	}
	if problems := p.Problems(); len(problems) > 0 {
		return fail(outbox.StreamCheckPublication, fmt.Sprintf("the publication %s %s", p.Name, strings.Join(problems, "; ")),
			"fix it as its owner ("+p.Owner+"): "+p.Fix(table))
	}

	if !s.replication {
		role := pgx.Identifier{s.role}.Sanitize()
		return fail(outbox.StreamCheckReplicationRole, fmt.Sprintf("the role %s has neither REPLICATION nor SUPERUSER, so it can neither create the slot nor open a replication connection", role),
			fmt.Sprintf("as a superuser: ALTER ROLE %s REPLICATION (on Amazon RDS and Aurora: GRANT rds_replication TO %s), or connect the relay as a role that has it (migrations/roles.example.sql)", role, role))
	}

	if s.maxSlots == 0 {
		return fail(outbox.StreamCheckReplicationCapacity, "max_replication_slots is 0",
			"set max_replication_slots to at least the number of slots the server needs (one per streaming outbox table, plus other subscribers), e.g. 10, in postgresql.conf and restart PostgreSQL")
	}
	if s.maxSender == 0 {
		return fail(outbox.StreamCheckReplicationCapacity, "max_wal_senders is 0",
			"set max_wal_senders to at least the number of replication connections the server serves (one per streaming relay, plus standbys), e.g. 10, in postgresql.conf and restart PostgreSQL")
	}

	slot := table.Slot(s.database)
	r, _, _, exists, err := readSlot(ctx, db, slot)
	if err != nil {
		return err
	}
	if !exists {
		if s.slotsUsed >= s.maxSlots {
			return fail(outbox.StreamCheckReplicationCapacity, fmt.Sprintf("all %d replication slots (max_replication_slots) are taken (%s), so the relay cannot create %s", s.maxSlots, strings.Join(s.slotNames, ", "), slot),
				"raise max_replication_slots in postgresql.conf and restart PostgreSQL, or drop a slot no longer used: SELECT pg_drop_replication_slot('<name>')")
		}
		return nil
	}
	drop := fmt.Sprintf("SELECT pg_drop_replication_slot('%s'), or outboxctl stream drop-slot", slot)
	switch {
	case r.SlotType != "logical":
		return fail(outbox.StreamCheckSlot, fmt.Sprintf("a %s replication slot named %s exists; the relay needs a logical one of that name", r.SlotType, slot),
			"if nothing else uses it, drop it and the relay creates its own: "+drop)
	case str(r.Plugin) != "pgoutput":
		return fail(outbox.StreamCheckSlot, fmt.Sprintf("the replication slot %s uses the output plugin %q, not pgoutput", slot, textcut.Clip(str(r.Plugin), 60)),
			"if nothing else uses it, drop it and the relay creates its own: "+drop)
	case str(r.Database) != s.database:
		return fail(outbox.StreamCheckSlot, fmt.Sprintf("the replication slot %s belongs to the database %q, not to %q: slot names are shared by the whole server, and this one was not created by this table's relay", slot, textcut.Clip(str(r.Database), 60), s.database),
			fmt.Sprintf("if nothing uses it, drop it from the database %q: %s", textcut.Clip(str(r.Database), 60), drop))
	case r.lost():
		return fail(outbox.StreamCheckSlotLost, fmt.Sprintf("the replication slot %s was invalidated (wal_status lost): it fell further behind than max_slot_wal_keep_size allows and PostgreSQL removed WAL it still needed", slot),
			"a streaming relay drops the lost slot and creates a new one by itself, publishing meanwhile from the table by polling (from the marks, or from the lanes' positions its last checkpoint wrote); a relay that cannot drop it (no REPLICATION) polls until an operator does: "+drop+
				"; if the relay fell that far behind in normal operation, raise max_slot_wal_keep_size")
	}
	return nil
}

// checkTable fails when the table is missing: the publication would be
// reported missing for the wrong reason.
func checkTable(ctx context.Context, db Querier, table outbox.Table) error {
	rows, err := db.Query(ctx, "SELECT to_regclass($1) IS NOT NULL", sqlname.Ident(table))
	if err != nil {
		return err
	}
	ok, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[bool])
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%w: %s: apply the migrations (migrations.Outbox.Up, OUTBOX_MIGRATE=true with fxoutbox, or the SQL files in migrations/)", migrations.ErrNoTable, table)
	}
	return nil
}

// StreamSetup is a snapshot of what the streaming relay of a table relies
// on (tablesql.StreamSetup): the server's settings, the table's publication and its slot.
type StreamSetup struct {
	Table string `json:"table"`
	// WALLevel is the server's wal_level; streaming needs logical.
	WALLevel string `json:"wal_level"`
	// MaxSlotWALKeepSize is max_slot_wal_keep_size as the server shows it
	// ("-1" is unlimited; "" before PostgreSQL 13), and in bytes (-1 when
	// unlimited or unknown): the most WAL a slot may keep before the server
	// invalidates it.
	MaxSlotWALKeepSize      string `json:"max_slot_wal_keep_size"`
	MaxSlotWALKeepSizeBytes int64  `json:"max_slot_wal_keep_size_bytes"`
	MaxReplicationSlots     int    `json:"max_replication_slots"`
	MaxWALSenders           int    `json:"max_wal_senders"`
	// Replication says the current role has REPLICATION (or is a
	// superuser); Role names it.
	Role        string `json:"role"`
	Replication bool   `json:"replication"`
	// Publication is the table's publication; PublicationOK says it is what
	// the relay reads, and PublicationProblems what differs when not.
	Publication         migrations.Publication `json:"publication"`
	PublicationOK       bool                   `json:"publication_ok"`
	PublicationProblems []string               `json:"publication_problems"`
	Slot                SlotStatus             `json:"slot"`
	// Checkpoint is, for a table in cursor mode, where a relay that cannot
	// stream (its slot lost or dropped) resumes by polling: the lanes'
	// positions, which the streaming relay writes once a second. Nil for a
	// table in marks mode, whose marks say it.
	Checkpoint *StreamCheckpoint `json:"checkpoint,omitempty"`
	// Setup is what CheckStream says: "" when the setup is right, else its
	// error (Check names the failed check).
	Setup      string `json:"setup_error,omitempty"`
	SetupCheck string `json:"setup_check,omitempty"`
}

// StreamCheckpoint is the lanes' positions of a table in cursor mode.
type StreamCheckpoint struct {
	// Oldest is when the least recently written lane's position was
	// written; AgeSeconds is its age on the server's clock.
	Oldest     time.Time `json:"oldest"`
	AgeSeconds float64   `json:"age_seconds"`
	// OpenWindows counts the lanes a polling relay is delivering (a
	// streaming relay leaves none open).
	OpenWindows int `json:"open_windows"`
}

// SlotStatus is the table's replication slot, from pg_replication_slots.
type SlotStatus struct {
	Name   string `json:"name"`
	Exists bool   `json:"exists"`
	// Type is logical or physical; Plugin its output plugin (pgoutput);
	// Database the database it decodes.
	Type      string `json:"type,omitempty"`
	Plugin    string `json:"plugin,omitempty"`
	Database  string `json:"database,omitempty"`
	Temporary bool   `json:"temporary"`
	// Active says a session streams from it now, ActivePID which one (the
	// streaming relay's walsender).
	Active    bool `json:"active"`
	ActivePID *int `json:"active_pid"`
	// WALStatus is reserved, extended, unreserved (about to be invalidated)
	// or lost (invalidated); "" before PostgreSQL 13.
	WALStatus string `json:"wal_status,omitempty"`
	// ConfirmedFlushLSN is the position up to which the relay confirmed
	// (every event before it is in Kafka); RestartLSN the oldest WAL the
	// slot keeps.
	ConfirmedFlushLSN string `json:"confirmed_flush_lsn,omitempty"`
	RestartLSN        string `json:"restart_lsn,omitempty"`
	// LagBytes is the WAL written since ConfirmedFlushLSN: how far the
	// relay is behind. RetainedBytes is the WAL written since RestartLSN:
	// what the slot keeps on the server's disk. SafeWALSize is how much more
	// may be written before the slot is invalidated (nil when
	// max_slot_wal_keep_size is unlimited).
	LagBytes      *int64 `json:"lag_bytes"`
	RetainedBytes *int64 `json:"retained_bytes"`
	SafeWALSize   *int64 `json:"safe_wal_size"`
}

// ReadStream reads what the streaming relay of table relies on; Setup
// carries CheckStream's verdict. It changes nothing.
func ReadStream(ctx context.Context, db Querier, table outbox.Table) (StreamSetup, error) {
	table = table.WithDefaults()
	st := StreamSetup{Table: table.String(), PublicationProblems: []string{}}
	if err := table.Validate(); err != nil {
		return st, err
	}
	st, err := readStream(ctx, db, table, st)
	if err != nil {
		return st, fmt.Errorf("admin: stream status of %s: %w", table, err)
	}
	return st, nil
}

func readStream(ctx context.Context, db Querier, table outbox.Table, st StreamSetup) (StreamSetup, error) {
	s, err := readServerSetup(ctx, db)
	if err != nil {
		return st, err
	}
	st.WALLevel, st.MaxReplicationSlots, st.MaxWALSenders, st.Role, st.Replication = s.walLevel, s.maxSlots, s.maxSender, s.role, s.replication
	st.Slot.Name = table.Slot(s.database)
	var keep *string
	rows, err := db.Query(ctx, "SELECT current_setting('max_slot_wal_keep_size', true), pg_size_bytes(nullif(current_setting('max_slot_wal_keep_size', true), ''))")
	if err != nil {
		return st, err
	}
	var keepBytes *int64
	if _, err := pgx.ForEachRow(rows, []any{&keep, &keepBytes}, func() error { return nil }); err != nil {
		return st, err
	}
	st.MaxSlotWALKeepSize, st.MaxSlotWALKeepSizeBytes = str(keep), -1
	if keepBytes != nil && *keepBytes >= 0 {
		st.MaxSlotWALKeepSizeBytes = *keepBytes
	}

	if err := checkTable(ctx, db, table); err != nil {
		return st, err
	}
	if st.Publication, err = migrations.ReadPublication(ctx, db, table); err != nil {
		return st, err
	}
	if st.Publication.Exists {
		st.PublicationProblems = append(st.PublicationProblems, st.Publication.Problems()...)
		st.PublicationOK = len(st.PublicationProblems) == 0
	}

	r, lag, retained, ok, err := readSlot(ctx, db, st.Slot.Name)
	if err != nil {
		return st, err
	}
	if ok {
		sl := &st.Slot
		sl.Exists, sl.Type, sl.Plugin, sl.Database, sl.Temporary = true, r.SlotType, str(r.Plugin), str(r.Database), r.Temporary
		sl.Active, sl.ActivePID, sl.WALStatus = r.Active, r.ActivePID, str(r.WALStatus)
		sl.ConfirmedFlushLSN, sl.RestartLSN = str(r.ConfirmedFlushLSN), str(r.RestartLSN)
		sl.LagBytes, sl.RetainedBytes, sl.SafeWALSize = lag, retained, r.SafeWALSize
	}

	cursor, err := InCursorMode(ctx, db, table)
	if err != nil {
		return st, err
	}
	if cursor {
		var cp StreamCheckpoint
		rows, err := db.Query(ctx, "SELECT min(updated_at), coalesce(extract(epoch FROM now() - min(updated_at))::float8, 0), count(*) FILTER (WHERE upto IS NOT NULL)::int FROM "+sqlname.Ident(sqlname.Cursor(table)))
		if err == nil {
			_, err = pgx.ForEachRow(rows, []any{&cp.Oldest, &cp.AgeSeconds, &cp.OpenWindows}, func() error { return nil })
		}
		if err != nil {
			return st, err
		}
		st.Checkpoint = &cp
	}

	if err := checkStream(ctx, db, table); err != nil {
		var se *outbox.StreamSetupError
		if !errors.As(err, &se) {
			return st, err
		}
		st.Setup, st.SetupCheck = se.Error(), se.Check
	}
	return st, nil
}

var (
	// ErrNoSlot is returned by DropSlot when the table has no replication
	// slot.
	ErrNoSlot = errors.New("no such replication slot")
	// ErrSlotActive is returned by DropSlot without force when a session
	// streams from the slot.
	ErrSlotActive = errors.New("replication slot is in use")
)

// DropSlot drops the table's replication slot (outbox.Table.Slot), which
// frees the WAL it keeps. A slot a session streams from (a running
// streaming relay) is refused with ErrSlotActive unless force is set: then
// that session is ended first (pg_terminate_backend of its active_pid),
// again if a standby relay takes the slot over meanwhile, until the slot is
// dropped, ctx ends or 30s have passed. An absent slot is ErrNoSlot.
//
// A streaming relay that still runs creates a new slot when it reconnects,
// which starts from the present: stop the streaming relays first (or switch
// them to polling) unless that is what you want. The role needs REPLICATION
// (or SUPERUSER), and, to end another role's session, membership of
// pg_signal_backend.
func DropSlot(ctx context.Context, db Querier, table outbox.Table, force bool) error {
	table = table.WithDefaults()
	if err := table.Validate(); err != nil {
		return err
	}
	var database string
	rows, err := db.Query(ctx, "SELECT current_database()")
	if err == nil {
		_, err = pgx.ForEachRow(rows, []any{&database}, func() error { return nil })
	}
	if err != nil {
		return fmt.Errorf("admin: drop slot of %s: %w", table, err)
	}
	slot := table.Slot(database)
	giveUp := time.Now().Add(30 * time.Second)
	for attempt := 0; ; attempt++ {
		r, _, _, ok, err := readSlot(ctx, db, slot)
		if err != nil {
			return fmt.Errorf("admin: drop slot %s of %s: %w", slot, table, err)
		}
		if !ok {
			if attempt > 0 {
				return nil // dropped by the session it ended (a temporary slot)
			}
			return fmt.Errorf("admin: drop slot %s of %s: %w (a streaming relay creates it when it starts)", slot, table, ErrNoSlot)
		}
		if r.Active && r.ActivePID != nil {
			if !force {
				return fmt.Errorf("admin: drop slot %s of %s: %w by the session with pid %d (a streaming relay): stop it first, or force to end that session",
					slot, table, ErrSlotActive, *r.ActivePID)
			}
			if _, err := db.Exec(ctx, "SELECT pg_terminate_backend($1)", *r.ActivePID); err != nil {
				return fmt.Errorf("admin: drop slot %s of %s: end the session with pid %d that streams from it: %w (connect as the relay's role, or as a member of pg_signal_backend)",
					slot, table, *r.ActivePID, err)
			}
		}
		_, err = db.Exec(ctx, "SELECT pg_drop_replication_slot($1)", slot)
		var pe *pgconn.PgError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &pe) && pe.Code == "42704": // undefined_object: gone meanwhile
			return nil
		case errors.As(err, &pe) && pe.Code == "55006" && force && time.Now().After(giveUp):
			return fmt.Errorf("admin: drop slot %s of %s: %w: %s, after ending its sessions for 30s: a relay keeps taking it over; stop the streaming relays first",
				slot, table, ErrSlotActive, pe.Message)
		case errors.As(err, &pe) && pe.Code == "55006" && force: // object_in_use: the ended session has not let go yet
			select {
			case <-ctx.Done():
				return fmt.Errorf("admin: drop slot %s of %s: %w", slot, table, ctx.Err())
			case <-time.After(100 * time.Millisecond):
			}
			continue
		case errors.As(err, &pe) && pe.Code == "55006":
			return fmt.Errorf("admin: drop slot %s of %s: %w: %s: stop the streaming relay first, or force to end its session", slot, table, ErrSlotActive, pe.Message)
		}
		return fmt.Errorf("admin: drop slot %s of %s: %w (dropping a slot takes REPLICATION or SUPERUSER)", slot, table, err)
	}
}
