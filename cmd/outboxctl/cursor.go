package main

import (
	"bufio"
	"context"
	"fmt"
	"strings"

	"github.com/fxoutbox/outbox/admin"
	"github.com/fxoutbox/outbox/internal/textcut"
)

func cmdCursor(ctx context.Context, args []string, e env) int {
	if len(args) == 0 {
		fmt.Fprintln(e.stderr, "outboxctl cursor: name a command: rebase (outboxctl help)")
		return exitUsage
	}
	switch args[0] {
	case "rebase":
		return cmdRebase(ctx, args[1:], e)
	case "-h", "--help", "help":
		fmt.Fprint(e.stdout, usage)
		return exitOK
	}
	fmt.Fprintf(e.stderr, "outboxctl cursor: unknown command %s: use rebase\n", textcut.Quote(args[0], 40))
	return exitUsage
}

func cmdRebase(ctx context.Context, args []string, e env) int {
	c := newCommand("cursor rebase", e, "[--yes] [--json]")
	c.about = "Carries a cursor table over to the cluster it was restored or moved into, when the relay stops with\n" +
		"\"the lanes' positions come from another PostgreSQL cluster\": marks what the old positions delivered,\n" +
		"gives the rest a transaction id of this cluster, and drops the positions for the relays to make anew.\n" +
		"It waits for running relays' batches. Nothing is lost and nothing delivered is sent again."
	c.fs.BoolVar(&c.yes, "yes", false, "do not ask for confirmation")
	if ok, code := c.parseNone(args); !ok {
		return code
	}
	conn, table, _, code := c.connect(ctx)
	if code != 0 {
		return code
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if !c.yes {
		if !e.interactive {
			fmt.Fprintln(e.stderr, "outboxctl cursor rebase: refusing without confirmation: there is no terminal to ask on; pass --yes")
			return exitNotConfirmed
		}
		fmt.Fprintf(e.stderr, "Rebase the lanes' positions of %s onto this cluster? Run it only after a restore or a move\n"+
			"into another cluster (the relays stop and say so). Type yes to go on: ", table)
		answer, _ := bufio.NewReader(e.stdin).ReadString('\n')
		if a := strings.ToLower(strings.TrimSpace(answer)); a != "yes" && a != "y" {
			fmt.Fprintln(e.stderr, "not confirmed: nothing changed")
			return exitNotConfirmed
		}
	}
	r, err := admin.RebaseCursor(ctx, conn, table)
	if err != nil {
		fmt.Fprintf(e.stderr, "outboxctl cursor rebase: %s\n", explain(err, table, ""))
		return exitError
	}
	if c.json {
		if err := writeJSON(e.stdout, r); err != nil {
			return exitError
		}
		return exitOK
	}
	fmt.Fprintf(e.stdout, "rebased %s: %d delivered rows marked published, %d rows to deliver given this cluster's transaction id; the relays make the positions anew\n", table, r.Marked, r.Rewritten)
	return exitOK
}
