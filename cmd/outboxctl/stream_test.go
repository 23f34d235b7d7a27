package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/migrations"
)

// An operator sets up streaming for a table: check says what is missing
// (exit 1) until the publication exists; status shows the slot a relay
// streams from; drop-slot refuses it while in use, asks, and with --force
// ends the relay's session and drops it.
func TestStreamCommands(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	slot := testenv.Slot(t, w.pool, w.table)
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = w.pool.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", slot)
		_, _ = w.pool.Exec(ctx, "DROP PUBLICATION IF EXISTS "+pgx.Identifier{w.table.Publication()}.Sanitize())
	})

	r := w.run("", false, "stream", "check")
	w.want(r, exitError, "the publication "+w.table.Publication()+" does not exist", "CREATE PUBLICATION")
	if check := decode[map[string]any](t, w.run("", false, "stream", "check", "--json").stdout); check["ok"] != false || check["check"] != "publication" {
		t.Fatalf("stream check --json: %v", check)
	}
	w.want(w.run("", false, "stream", "status"), exitOK, "NOT READY (publication)", "Publication  "+w.table.Publication()+": missing", "none (a streaming relay creates it")
	if err := migrations.Stream.Up(w.ctx, w.pool, w.table); err != nil {
		t.Fatal(err)
	}
	w.want(w.run("", false, "stream", "check"), exitOK, "streaming setup of "+w.table.String()+": ok")
	w.want(w.run("", false, "stream", "drop-slot", "--yes"), exitNoMatch, "no replication slot "+slot+": nothing to drop")

	// A relay's replication connection streams from the slot.
	cfg, err := pgconn.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["replication"] = "database"
	conn, err := pgconn.ConnectConfig(w.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := pglogrepl.CreateReplicationSlot(w.ctx, conn, slot, "pgoutput", pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication}); err != nil {
		t.Fatal(err)
	}
	if err := pglogrepl.StartReplication(w.ctx, conn, slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + w.table.Publication() + "'"}}); err != nil {
		t.Fatal(err)
	}
	var pid int
	if err := w.pool.QueryRow(w.ctx, "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	r = w.run("", false, "stream", "status")
	w.want(r, exitOK, "Setup        ok for streaming", ": ok (inserts of "+w.table.String()+" only)", "Slot         "+slot+": active (pid "+jsonNumber(int64(pid))+"), logical pgoutput", "behind", "retains", "max_slot_wal_keep_size")
	st := decode[map[string]any](t, w.run("", false, "stream", "status", "--json").stdout)
	if sl := st["slot"].(map[string]any); sl["active"] != true || sl["active_pid"] != float64(pid) || st["publication_ok"] != true {
		t.Fatalf("stream status --json: %v", st)
	}

	w.want(w.run("", false, "stream", "drop-slot", "--yes"), exitError, "in use by the session with pid "+jsonNumber(int64(pid)), "--force")
	w.want(w.run("", false, "stream", "drop-slot", "--force"), exitNotConfirmed, "pass --yes")
	w.want(w.run("no\n", true, "stream", "drop-slot", "--force"), exitNotConfirmed, "end the session with pid", "nothing changed")
	if n := w.count("true"); n != 0 { // nothing written; the table is only the world's
		t.Fatalf("%d rows", n)
	}
	var active bool
	if err := w.pool.QueryRow(w.ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&active); err != nil || !active {
		t.Fatalf("an unconfirmed drop-slot changed the slot: active %v, %v", active, err)
	}
	w.want(w.run("yes\n", true, "stream", "drop-slot", "--force"), exitOK,
		"ended the session with pid "+jsonNumber(int64(pid)), "dropped the replication slot "+slot)
	ctx, cancel := context.WithTimeout(w.ctx, 30*time.Second)
	defer cancel()
	for {
		if _, err := conn.ReceiveMessage(ctx); err != nil {
			if ctx.Err() != nil {
				t.Fatal("the streaming session still runs after drop-slot --force")
			}
			break
		}
	}
	w.want(w.run("", false, "stream", "status"), exitOK, "none (a streaming relay creates it")

	// Usage.
	w.want(w.run("", false, "stream"), exitUsage, "status, check or drop-slot")
	w.want(w.run("", false, "stream", "bogus"), exitUsage, `unknown command "bogus"`)
	w.want(w.run("", false, "stream", "status", "extra"), exitUsage, "takes no arguments")
	w.want(w.run("", false, "stream", "drop-slot", "--help"), exitOK, "-force")
	if !strings.Contains(w.run("", false, "help").stdout, "outboxctl stream drop-slot") {
		t.Fatal("help does not list the stream commands")
	}
}
