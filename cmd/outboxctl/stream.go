package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/admin"
	"github.com/fxoutbox/outbox/internal/tablesql"
	"github.com/fxoutbox/outbox/internal/textcut"
)

func cmdStream(ctx context.Context, args []string, e env) int {
	if len(args) == 0 {
		fmt.Fprintln(e.stderr, "outboxctl stream: name a command: status, check or drop-slot (outboxctl help)")
		return exitUsage
	}
	switch args[0] {
	case "status":
		return cmdStreamStatus(ctx, args[1:], e)
	case "check":
		return cmdStreamCheck(ctx, args[1:], e)
	case "drop-slot":
		return cmdDropSlot(ctx, args[1:], e)
	case "-h", "--help", "help":
		fmt.Fprint(e.stdout, usage)
		return exitOK
	}
	fmt.Fprintf(e.stderr, "outboxctl stream: unknown command %s: use status, check or drop-slot\n", textcut.Quote(args[0], 40))
	return exitUsage
}

func cmdStreamStatus(ctx context.Context, args []string, e env) int {
	c := newCommand("stream status", e, "[--json]")
	c.about = "The streaming relay's replication slot (active, how far behind, the WAL it keeps), its publication,\nthe server's settings, and what `outboxctl stream check` says of them. Changes nothing."
	if ok, code := c.parseNone(args); !ok {
		return code
	}
	conn, table, _, code := c.connect(ctx)
	if code != 0 {
		return code
	}
	defer conn.Close(context.WithoutCancel(ctx))
	st, err := tablesql.ReadStream(ctx, conn, table)
	if err != nil {
		fmt.Fprintf(e.stderr, "outboxctl stream status: %s\n", explain(err, table, ""))
		return exitError
	}
	if c.json {
		if err := writeJSON(e.stdout, st); err != nil {
			return exitError
		}
		return exitOK
	}
	printStreamStatus(e, st)
	return exitOK
}

func printStreamStatus(e env, st tablesql.StreamSetup) {
	w := e.stdout
	fmt.Fprintf(w, "Table        %s\n", st.Table)
	if st.Setup == "" {
		fmt.Fprintln(w, "Setup        ok for streaming")
	} else {
		fmt.Fprintf(w, "Setup        NOT READY (%s): %s\n", st.SetupCheck, printable(st.Setup, 2000))
	}
	fmt.Fprintf(w, "WAL level    %s\n", st.WALLevel)
	p := st.Publication
	switch {
	case !p.Exists:
		fmt.Fprintf(w, "Publication  %s: missing (run migrations.Stream.Up or the migration in migrations/stream/)\n", p.Name)
	case st.PublicationOK:
		fmt.Fprintf(w, "Publication  %s: ok (inserts of %s only), owner %s\n", p.Name, st.Table, printable(p.Owner, 60))
	default:
		fmt.Fprintf(w, "Publication  %s: %s\n", p.Name, printable(strings.Join(st.PublicationProblems, "; "), 500))
	}
	repl := "REPLICATION"
	if !st.Replication {
		repl = "no REPLICATION (cannot stream)"
	}
	fmt.Fprintf(w, "Role         %s: %s\n", printable(st.Role, 60), repl)
	sl := st.Slot
	if !sl.Exists {
		fmt.Fprintf(w, "Slot         %s: none (a streaming relay creates it when it starts)\n", sl.Name)
	} else {
		state := "inactive (no relay streams from it now; it keeps WAL all the same)"
		if sl.Active && sl.ActivePID != nil {
			state = fmt.Sprintf("active (pid %d)", *sl.ActivePID)
		}
		kind := sl.Type
		if sl.Plugin != "" {
			kind += " " + printable(sl.Plugin, 40)
		}
		if sl.Temporary {
			kind += ", temporary"
		}
		fmt.Fprintf(w, "Slot         %s: %s, %s, database %s", sl.Name, state, kind, printable(sl.Database, 60))
		if sl.WALStatus != "" {
			fmt.Fprintf(w, ", wal_status %s", sl.WALStatus)
		}
		fmt.Fprintln(w)
		if sl.WALStatus == "lost" {
			fmt.Fprintln(w, "  LOST       the server removed WAL the slot needed: a streaming relay drops it and creates a new one,\n"+
				"             publishing from the table by polling meanwhile (from its last checkpoint); nothing is lost")
		}
		if sl.LagBytes != nil {
			fmt.Fprintf(w, "  behind     %s of WAL since the position the relay confirmed (%s)\n", bytesText(*sl.LagBytes), sl.ConfirmedFlushLSN)
		}
		if sl.RetainedBytes != nil {
			fmt.Fprintf(w, "  retains    %s of WAL on the server's disk (from %s)\n", bytesText(*sl.RetainedBytes), sl.RestartLSN)
		}
		if sl.SafeWALSize != nil {
			fmt.Fprintf(w, "  headroom   %s more WAL before max_slot_wal_keep_size invalidates the slot\n", bytesText(*sl.SafeWALSize))
		}
	}
	if cp := st.Checkpoint; cp != nil {
		fmt.Fprintf(w, "Checkpoint   lanes' positions (cursor progress), oldest written %.1f s ago, %d open window(s): where a relay that cannot stream resumes by polling\n", cp.AgeSeconds, cp.OpenWindows)
	} else {
		fmt.Fprintln(w, "Checkpoint   the rows' marks (published_at): marks progress")
	}
	keep := st.MaxSlotWALKeepSize
	switch {
	case keep == "":
		keep = "(not in this PostgreSQL version)"
	case st.MaxSlotWALKeepSizeBytes < 0:
		keep += " (unlimited: a stalled slot can fill the disk)"
	}
	fmt.Fprintf(w, "Settings     max_slot_wal_keep_size %s, max_replication_slots %d, max_wal_senders %d\n", keep, st.MaxReplicationSlots, st.MaxWALSenders)
}

// bytesText formats a byte count for people: 512 B, 12.3 MB, 1.5 GB.
func bytesText(n int64) string {
	if n < 0 {
		return fmt.Sprintf("%d B", n)
	}
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, i := float64(n)/unit, 0
	for v >= unit && i < 4 {
		v /= unit
		i++
	}
	return fmt.Sprintf("%.1f %cB", v, "kMGTP"[i])
}

func cmdStreamCheck(ctx context.Context, args []string, e env) int {
	c := newCommand("stream check", e, "[--json]")
	c.about = "Checks what the streaming relay needs of the server, as the relay does when it starts: wal_level, the\n" +
		"publication, the role's REPLICATION attribute, replication slots and WAL senders, and the slot if it exists.\n" +
		"Connect as the role the relay uses. Exits 1 with what to change when something is wrong."
	if ok, code := c.parseNone(args); !ok {
		return code
	}
	conn, table, _, code := c.connect(ctx)
	if code != 0 {
		return code
	}
	defer conn.Close(context.WithoutCancel(ctx))
	err := admin.CheckStream(ctx, conn, table)
	var se *outbox.StreamSetupError
	switch {
	case err == nil:
		if c.json {
			_ = writeJSON(e.stdout, map[string]any{"table": table.String(), "ok": true})
		} else {
			fmt.Fprintf(e.stdout, "streaming setup of %s: ok\n", table)
		}
		return exitOK
	case errors.As(err, &se):
		if c.json {
			_ = writeJSON(e.stdout, map[string]any{"table": table.String(), "ok": false, "check": se.Check, "reason": se.Reason, "fix": se.Fix})
		}
		fmt.Fprintf(e.stderr, "outboxctl stream check: %s\n", printable(se.Error(), 2000))
		return exitError
	}
	fmt.Fprintf(e.stderr, "outboxctl stream check: %s\n", explain(err, table, ""))
	return exitError
}

func cmdDropSlot(ctx context.Context, args []string, e env) int {
	c := newCommand("stream drop-slot", e, "[--force] [--yes] [--json]")
	c.about = "Drops the table's replication slot, which frees the WAL it keeps on the server's disk (asked about unless --yes).\n" +
		"A slot a relay streams from is refused unless --force, which ends that relay's session first.\n" +
		"Stop the streaming relays first: one that still runs creates a new slot when it reconnects.\n" +
		"Needs a role with REPLICATION (and, to end another role's session, pg_signal_backend)."
	var force bool
	c.fs.BoolVar(&force, "force", false, "end the session that streams from the slot, then drop it")
	c.fs.BoolVar(&c.yes, "yes", false, "do not ask for confirmation")
	if ok, code := c.parseNone(args); !ok {
		return code
	}
	conn, table, _, code := c.connect(ctx)
	if code != 0 {
		return code
	}
	defer conn.Close(context.WithoutCancel(ctx))
	st, err := tablesql.ReadStream(ctx, conn, table)
	if err != nil {
		fmt.Fprintf(e.stderr, "outboxctl stream drop-slot: %s\n", explain(err, table, ""))
		return exitError
	}
	result := func(dropped bool, pid *int) {
		if c.json {
			_ = writeJSON(e.stdout, map[string]any{"slot": st.Slot.Name, "dropped": dropped, "ended_pid": pid})
		}
	}
	sl := st.Slot
	if !sl.Exists {
		fmt.Fprintf(e.stderr, "no replication slot %s: nothing to drop (a streaming relay creates it when it starts)\n", sl.Name)
		result(false, nil)
		return exitNoMatch
	}
	if sl.Active && !force {
		fmt.Fprintf(e.stderr, "outboxctl stream drop-slot: the slot %s is in use by the session with pid %s (a streaming relay): stop that relay first, or pass --force to end its session\n",
			sl.Name, pidText(sl.ActivePID))
		result(false, nil)
		return exitError
	}
	if !c.yes {
		if !e.interactive {
			fmt.Fprintf(e.stderr, "outboxctl stream drop-slot: refusing to drop the slot %s without confirmation: there is no terminal to ask on; pass --yes\n", sl.Name)
			return exitNotConfirmed
		}
		retained := ""
		if sl.RetainedBytes != nil {
			retained = " (" + bytesText(*sl.RetainedBytes) + ")"
		}
		ending := ""
		if sl.Active {
			ending = fmt.Sprintf(" and end the session with pid %s that streams from it", pidText(sl.ActivePID))
		}
		fmt.Fprintf(e.stderr, "Drop the replication slot %s of %s%s? It frees the WAL it keeps%s.\n"+
			"A streaming relay that still runs creates a new slot when it reconnects.\nType yes to go on: ", sl.Name, table, ending, retained)
		answer, _ := bufio.NewReader(e.stdin).ReadString('\n')
		if a := strings.ToLower(strings.TrimSpace(answer)); a != "yes" && a != "y" {
			fmt.Fprintln(e.stderr, "not confirmed: nothing changed")
			return exitNotConfirmed
		}
	}
	err = admin.DropSlot(ctx, conn, table, force)
	switch {
	case errors.Is(err, admin.ErrNoSlot):
		fmt.Fprintf(e.stderr, "no replication slot %s: it was dropped meanwhile\n", sl.Name)
		result(false, nil)
		return exitNoMatch
	case err != nil:
		fmt.Fprintf(e.stderr, "outboxctl stream drop-slot: %s\n", explain(err, table, ""))
		result(false, nil)
		return exitError
	}
	var ended *int
	if sl.Active {
		ended = sl.ActivePID
	}
	if c.json {
		result(true, ended)
		return exitOK
	}
	if ended != nil {
		fmt.Fprintf(e.stdout, "ended the session with pid %d that streamed from the slot\n", *ended)
	}
	fmt.Fprintf(e.stdout, "dropped the replication slot %s\n", sl.Name)
	return exitOK
}

func pidText(pid *int) string {
	if pid == nil {
		return "?"
	}
	return fmt.Sprint(*pid)
}
