package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/admin"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/tablesql"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/migrations"
)

// wantSetupError fails unless err is a *outbox.StreamSetupError of check
// whose message contains every part.
func wantSetupError(t *testing.T, err error, check string, parts ...string) *outbox.StreamSetupError {
	t.Helper()
	var se *outbox.StreamSetupError
	if !errors.As(err, &se) || se.Check != check {
		t.Fatalf("CheckStream = %v, want a StreamSetupError of check %s", err, check)
	}
	for _, p := range parts {
		if !strings.Contains(se.Error(), p) {
			t.Fatalf("CheckStream's error lacks %q:\n%s", p, se.Error())
		}
	}
	return se
}

// dropSlotAtEnd drops the named slot when the test ends, if it is left:
// a forgotten slot keeps WAL on the shared server.
func dropSlotAtEnd(t *testing.T, pool *pgxpool.Pool, slot string) {
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", slot)
	})
}

func dropPublicationAtEnd(t *testing.T, pool *pgxpool.Pool, tbl outbox.Table) {
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP PUBLICATION IF EXISTS "+pgx.Identifier{tbl.Publication()}.Sanitize())
	})
}

// On the shared server (wal_level=logical): each check about the
// publication, the role and the slot fails with its own Check and a message
// that names the fix, and passes once the fix is applied.
func TestCheckStream(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	ctx, pool, tbl := s.ctx, s.pool, s.table
	dropPublicationAtEnd(t, pool, tbl)
	slot := testenv.Slot(t, pool, tbl)
	dropSlotAtEnd(t, pool, slot)
	pub := pgx.Identifier{tbl.Publication()}.Sanitize()

	// The publication: missing, then publishing updates and deletes.
	wantSetupError(t, admin.CheckStream(ctx, pool, tbl), outbox.StreamCheckPublication,
		"the publication "+tbl.Publication()+" does not exist", "migrations.Stream.Up", "CREATE PUBLICATION "+pub+" FOR TABLE "+sqlname.Ident(tbl)+" WITH (publish = 'insert')")
	if _, err := pool.Exec(ctx, "CREATE PUBLICATION "+pub+" FOR TABLE "+sqlname.Ident(tbl)+" WITH (publish = 'insert, update, delete')"); err != nil {
		t.Fatal(err)
	}
	wantSetupError(t, admin.CheckStream(ctx, pool, tbl), outbox.StreamCheckPublication, "also publishes update, delete", "ALTER PUBLICATION "+pub+" SET (publish = 'insert')")
	if _, err := pool.Exec(ctx, "ALTER PUBLICATION "+pub+" SET (publish = 'insert')"); err != nil {
		t.Fatal(err)
	}
	if err := admin.CheckStream(ctx, pool, tbl); err != nil {
		t.Fatalf("after the publication's fix: %v", err)
	}

	// The role: without REPLICATION (SET ROLE to a role without it), then
	// with it.
	role := testenv.Name("outbox_norepl_")
	if _, err := pool.Exec(ctx, "CREATE ROLE "+role+" NOLOGIN"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP OWNED BY "+role+"; DROP ROLE IF EXISTS "+role) })
	if _, err := pool.Exec(ctx, "GRANT USAGE ON SCHEMA "+tbl.Schema+" TO "+role); err != nil {
		t.Fatal(err)
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL ROLE "+role); err != nil {
			return err
		}
		wantSetupError(t, admin.CheckStream(ctx, tx, tbl), outbox.StreamCheckReplicationRole,
			`the role "`+role+`" has neither REPLICATION nor SUPERUSER`, `ALTER ROLE "`+role+`" REPLICATION`)
		if _, err := pool.Exec(ctx, "ALTER ROLE "+role+" REPLICATION"); err != nil {
			return err
		}
		if err := admin.CheckStream(ctx, tx, tbl); err != nil {
			t.Errorf("as a role with REPLICATION: %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// A slot of the table's slot name that the relay cannot use: physical,
	// another plugin, another database. DropSlot drops each.
	for _, c := range []struct {
		what, create, want string
	}{
		{"physical", "SELECT pg_create_physical_replication_slot($1)", "a physical replication slot named " + slot + " exists"},
		{"test_decoding", "SELECT pg_create_logical_replication_slot($1, 'test_decoding')", `uses the output plugin "test_decoding", not pgoutput`},
	} {
		if _, err := pool.Exec(ctx, c.create, slot); err != nil {
			t.Fatalf("%s: %v", c.what, err)
		}
		wantSetupError(t, admin.CheckStream(ctx, pool, tbl), outbox.StreamCheckSlot, c.want, "SELECT pg_drop_replication_slot('"+slot+"')", "outboxctl stream drop-slot")
		if err := admin.DropSlot(ctx, pool, tbl, false); err != nil {
			t.Fatalf("DropSlot of the %s slot: %v", c.what, err)
		}
	}
	other := otherDatabase(t)
	if _, err := other.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot); err != nil {
		t.Fatal(err)
	}
	dropSlotAtEnd(t, other, slot)
	var db string
	_ = other.QueryRow(ctx, "SELECT current_database()").Scan(&db)
	wantSetupError(t, admin.CheckStream(ctx, pool, tbl), outbox.StreamCheckSlot, `belongs to the database "`+db+`"`, "if nothing uses it, drop it")
	if _, err := other.Exec(ctx, "SELECT pg_drop_replication_slot($1)", slot); err != nil {
		t.Fatal(err)
	}

	// The slot the relay creates passes.
	if _, err := pool.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot); err != nil {
		t.Fatal(err)
	}
	if err := admin.CheckStream(ctx, pool, tbl); err != nil {
		t.Fatalf("with a pgoutput slot of this database: %v", err)
	}
	if err := admin.DropSlot(ctx, pool, tbl, false); err != nil {
		t.Fatal(err)
	}
	if err := admin.DropSlot(ctx, pool, tbl, false); !errors.Is(err, admin.ErrNoSlot) {
		t.Fatalf("DropSlot without a slot: %v, want ErrNoSlot", err)
	}
}

// otherDatabase connects to the server's postgres database (not the tests').
func otherDatabase(t *testing.T) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Database = "postgres"
	if cfg.ConnConfig.Database == testenv.Pool(t).Config().ConnConfig.Database {
		cfg.ConnConfig.Database = "template1"
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// replicationConn opens a logical replication connection (replication=
// database) to url, closed when the test ends.
func replicationConn(t *testing.T, url string) *pgconn.PgConn {
	t.Helper()
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["replication"] = "database"
	conn, err := pgconn.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// ReadStream shows a slot a session streams from (active, its pid, lag and
// retained WAL); DropSlot refuses it without force and, with force, ends
// that session and drops it.
func TestReadStreamAndDropSlot(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	ctx, pool, tbl := s.ctx, s.pool, s.table
	dropPublicationAtEnd(t, pool, tbl)
	slot := testenv.Slot(t, pool, tbl)
	dropSlotAtEnd(t, pool, slot)
	if err := migrations.Stream.Up(ctx, pool, tbl); err != nil {
		t.Fatal(err)
	}
	st, err := tablesql.ReadStream(ctx, pool, tbl)
	if err != nil || st.WALLevel != "logical" || !st.PublicationOK || st.Slot.Exists || st.Slot.Name != slot || st.Setup != "" || !st.Replication {
		t.Fatalf("before the slot: %+v, %v", st, err)
	}

	conn := replicationConn(t, os.Getenv("DATABASE_URL"))
	if _, err := pglogrepl.CreateReplicationSlot(ctx, conn, slot, "pgoutput", pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication}); err != nil {
		t.Fatal(err)
	}
	if err := pglogrepl.StartReplication(ctx, conn, slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + tbl.Publication() + "'"}}); err != nil {
		t.Fatal(err)
	}
	s.seed(t, rows{n: 100})
	st, err = tablesql.ReadStream(ctx, pool, tbl)
	if err != nil {
		t.Fatal(err)
	}
	sl := st.Slot
	if !sl.Exists || !sl.Active || sl.ActivePID == nil || sl.Plugin != "pgoutput" || sl.Type != "logical" || sl.WALStatus != "reserved" ||
		sl.LagBytes == nil || *sl.LagBytes <= 0 || sl.RetainedBytes == nil || *sl.RetainedBytes < *sl.LagBytes || sl.ConfirmedFlushLSN == "" {
		t.Fatalf("streaming slot: %+v", sl)
	}
	b, err := json.Marshal(st)
	if err != nil || !strings.Contains(string(b), `"lag_bytes":`) || !strings.Contains(string(b), `"active_pid":`) || !strings.Contains(string(b), `"max_slot_wal_keep_size_bytes":`) {
		t.Fatalf("JSON: %s, %v", b, err)
	}

	err = admin.DropSlot(ctx, pool, tbl, false)
	if !errors.Is(err, admin.ErrSlotActive) || !strings.Contains(err.Error(), "stop it first, or force") {
		t.Fatalf("DropSlot of an active slot without force: %v, want ErrSlotActive", err)
	}
	if err := admin.DropSlot(ctx, pool, tbl, true); err != nil {
		t.Fatalf("DropSlot with force: %v", err)
	}
	if st, err := tablesql.ReadStream(ctx, pool, tbl); err != nil || st.Slot.Exists {
		t.Fatalf("after DropSlot: %+v, %v", st.Slot, err)
	}
	// The streaming session was ended.
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		if _, err := conn.ReceiveMessage(rctx); err != nil {
			if rctx.Err() != nil {
				t.Fatal("the streaming session still runs after DropSlot with force")
			}
			break
		}
	}
	if err := admin.DropSlot(ctx, pool, tbl, true); !errors.Is(err, admin.ErrNoSlot) {
		t.Fatalf("DropSlot again: %v, want ErrNoSlot", err)
	}
}

// The server's settings, on a cluster of the test's own: wal_level (checked
// first, before anything else), max_replication_slots and max_wal_senders at
// 0, every slot taken, and a slot invalidated past max_slot_wal_keep_size.
func TestCheckStreamServerSettings(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	ctx := context.Background()
	tbl := outbox.Table{}

	pool := c.start(t, "wal_level=replica")
	slot := testenv.Slot(t, pool, tbl)
	if err := migrations.Outbox.Up(ctx, pool, tbl); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Stream.Up(ctx, pool, tbl); err != nil {
		t.Fatal(err)
	}
	wantSetupError(t, admin.CheckStream(ctx, pool, tbl), outbox.StreamCheckWALLevel,
		"wal_level is replica, not logical", "set wal_level = logical in postgresql.conf", "restart", "rds.logical_replication = 1", "cloudsql.logical_decoding = on")

	pool = c.start(t, "wal_level=logical", "max_replication_slots=0", "max_wal_senders=0")
	wantSetupError(t, admin.CheckStream(ctx, pool, tbl), outbox.StreamCheckReplicationCapacity, "max_replication_slots is 0", "set max_replication_slots")
	pool = c.start(t, "wal_level=logical", "max_replication_slots=1", "max_wal_senders=0")
	wantSetupError(t, admin.CheckStream(ctx, pool, tbl), outbox.StreamCheckReplicationCapacity, "max_wal_senders is 0", "set max_wal_senders")

	pool = c.start(t, "wal_level=logical", "max_replication_slots=1", "max_wal_senders=2", "max_slot_wal_keep_size=1MB")
	if _, err := pool.Exec(ctx, "SELECT pg_create_logical_replication_slot('someone_elses', 'pgoutput')"); err != nil {
		t.Fatal(err)
	}
	wantSetupError(t, admin.CheckStream(ctx, pool, tbl), outbox.StreamCheckReplicationCapacity, "all 1 replication slots (max_replication_slots) are taken (someone_elses)", "raise max_replication_slots")
	if _, err := pool.Exec(ctx, "SELECT pg_drop_replication_slot('someone_elses')"); err != nil {
		t.Fatal(err)
	}

	// The relay's slot, then WAL past max_slot_wal_keep_size: the next
	// checkpoint invalidates it.
	if _, err := pool.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot); err != nil {
		t.Fatal(err)
	}
	if err := admin.CheckStream(ctx, pool, tbl); err != nil {
		t.Fatalf("with the relay's slot: %v", err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE filler (x int)"); err != nil {
		t.Fatal(err)
	}
	var status string
	for i := 0; i < 20 && status != "lost"; i++ {
		if _, err := pool.Exec(ctx, "INSERT INTO filler VALUES (1)"); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, "SELECT pg_switch_wal()"); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
			t.Fatal(err)
		}
		if err := pool.QueryRow(ctx, "SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&status); err != nil {
			t.Fatal(err)
		}
	}
	if status != "lost" {
		t.Fatalf("the slot's wal_status is %q after 20 WAL segments, want lost", status)
	}
	err := admin.CheckStream(ctx, pool, tbl)
	wantSetupError(t, err, outbox.StreamCheckSlotLost, "was invalidated (wal_status lost)", "drops the lost slot and creates a new one",
		"SELECT pg_drop_replication_slot('"+slot+"')", "outboxctl stream drop-slot", "max_slot_wal_keep_size")
	if !errors.Is(err, outbox.ErrSlotInvalidated) {
		t.Fatalf("%v does not match ErrSlotInvalidated", err)
	}
	st, err := tablesql.ReadStream(ctx, pool, tbl)
	if err != nil || st.Slot.WALStatus != "lost" || st.SetupCheck != outbox.StreamCheckSlotLost || st.MaxSlotWALKeepSizeBytes != 1<<20 {
		t.Fatalf("ReadStream of the lost slot: %+v, %v", st, err)
	}
	if err := admin.DropSlot(ctx, pool, tbl, false); err != nil {
		t.Fatal(err)
	}
	if err := admin.CheckStream(ctx, pool, tbl); err != nil {
		t.Fatalf("after dropping the lost slot: %v", err)
	}
}
