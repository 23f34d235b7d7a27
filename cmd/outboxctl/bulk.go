package main

import (
	"bufio"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/admin"
	"github.com/fxoutbox/outbox/internal/textcut"
)

// bulkOp is a command that changes many rows: requeue, delete, replay.
type bulkOp struct {
	verb, done, noun string // "requeue", "requeued", "parked events"
	privilege        string // what the role needs, for explain
	what             string // what it does, shown before the question
	ids              bool   // takes event ids as arguments
	count            func(context.Context, admin.Querier, outbox.Table, admin.Filter) (int, error)
	run              func(context.Context, admin.Querier, outbox.Table, admin.Filter, *admin.BulkOptions) (int, error)
}

var (
	requeueOp = bulkOp{
		verb: "requeue", done: "requeued", noun: "parked events", privilege: "UPDATE", ids: true,
		what:  "The relay publishes them again with its next batches, each after the events of its key that were published while it was parked.",
		count: admin.CountParked, run: admin.Requeue,
	}
	deleteOp = bulkOp{
		verb: "delete", done: "deleted", noun: "parked events", privilege: "DELETE", ids: true,
		what:  "They are removed from the table and never published.",
		count: admin.CountParked, run: admin.Delete,
	}
	replayOp = bulkOp{
		verb: "replay", done: "replayed", noun: "published events", privilege: "UPDATE",
		what: "The relay publishes them again, with the same x-event-id: consumers that drop ids they have seen (the inbox) skip them,\n" +
			"every other consumer receives them twice. Per key they go out in their original order, but after the newer events of\n" +
			"the key already delivered, interleaved with new writes by id. Only events still in the table (retention, default 72h)\n" +
			"can be replayed; a large replay delays new events until it has drained.",
		count: admin.CountPublished, run: admin.Replay,
	}
)

func cmdBulk(ctx context.Context, name string, args []string, e env, op bulkOp) int {
	synopsis := "[filters] [--all] [--yes] [--json]"
	if op.ids {
		synopsis = "<event-id>... | " + synopsis
	}
	c := newCommand(name, e, synopsis)
	c.about = fmt.Sprintf("%s the %s that match (counted first, and asked about unless --yes), in statements of --chunk rows;\neach statement committed on its own: an interrupted run keeps what it did; run it again to go on.\n%s",
		strings.ToUpper(op.verb[:1])+op.verb[1:], op.noun, op.what)
	c.filterFlags("default: no limit")
	c.bulkFlags()
	pos, ok, code := c.parse(args)
	if !ok {
		return code
	}
	if len(pos) > 0 && !op.ids {
		return c.usageErr("takes no arguments, got %s: select events with filters", textcut.Quote(pos[0], 40))
	}
	f, code := c.filter(pos, time.Now())
	if code != 0 {
		return code
	}
	if c.chunk < 1 || c.chunk > 100000 {
		return c.usageErr("--chunk %d: use 1 to 100000", c.chunk)
	}
	f.All = c.all
	if f.Empty() && !f.All {
		what := "filters (--topic, --key, --since, ...)"
		if op.ids {
			what = "event ids or " + what
		}
		return c.usageErr("name %s, or pass --all to %s every one of the %s", what, op.verb, op.noun)
	}
	conn, table, _, code := c.connect(ctx)
	if code != 0 {
		return code
	}
	defer conn.Close(context.WithoutCancel(ctx))
	n, err := op.count(ctx, conn, table, f)
	if err != nil {
		fmt.Fprintf(e.stderr, "outboxctl %s: %s\n", name, explain(err, table, ""))
		return exitError
	}
	if n == 0 {
		fmt.Fprintf(e.stderr, "no %s match: nothing to %s\n", op.noun, op.verb)
		if c.json {
			_ = writeJSON(e.stdout, map[string]int{"matched": 0, op.done: 0})
		}
		return exitNoMatch
	}
	if !c.yes {
		if !e.interactive {
			fmt.Fprintf(e.stderr, "outboxctl %s: refusing to %s %s %s without confirmation: there is no terminal to ask on; pass --yes\n", name, op.verb, thousands(n), op.noun)
			return exitNotConfirmed
		}
		fmt.Fprintf(e.stderr, "%s %s %s of %s%s?\n%s\nType yes to go on: ", strings.ToUpper(op.verb[:1])+op.verb[1:], thousands(n), plural(op.noun, n), table, describe(f), op.what)
		answer, _ := bufio.NewReader(e.stdin).ReadString('\n')
		if a := strings.ToLower(strings.TrimSpace(answer)); a != "yes" && a != "y" {
			fmt.Fprintln(e.stderr, "not confirmed: nothing changed")
			return exitNotConfirmed
		}
	}
	opts := &admin.BulkOptions{ChunkSize: c.chunk}
	var bar *progress
	if e.progress || c.progress {
		bar = newProgress(e.stderr, op.done, n, e.progress)
		opts.Progress = bar.update
	}
	done, err := op.run(ctx, conn, table, f, opts)
	if bar != nil {
		bar.finish()
	}
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintf(e.stderr, "outboxctl %s: interrupted after %s of %s %s were %s (those stay %s); run the same command again to go on\n",
				name, thousands(done), thousands(n), op.noun, op.done, op.done)
		} else if done == 0 {
			fmt.Fprintf(e.stderr, "outboxctl %s: %s\n", name, explain(err, table, op.privilege))
		} else {
			fmt.Fprintf(e.stderr, "outboxctl %s: %s of %s %s were %s, then: %s\n", name, thousands(done), thousands(n), op.noun, op.done, explain(err, table, op.privilege))
		}
		if c.json {
			_ = writeJSON(e.stdout, map[string]int{"matched": n, op.done: done})
		}
		return exitError
	}
	if c.json {
		if err := writeJSON(e.stdout, map[string]int{"matched": n, op.done: done}); err != nil {
			return exitError
		}
		return exitOK
	}
	fmt.Fprintf(e.stdout, "%s %s %s\n", op.done, thousands(done), plural(op.noun, done))
	return exitOK
}

// describe writes the filter for the question.
func describe(f admin.Filter) string {
	var parts []string
	add := func(k, v string) { parts = append(parts, k+"="+printable(v, 60)) }
	if len(f.EventIDs) == 1 {
		add("event", f.EventIDs[0].String())
	} else if len(f.EventIDs) > 1 {
		add("events", fmt.Sprint(len(f.EventIDs), " ids"))
	}
	for _, kv := range [][2]string{{"topic", f.Topic}, {"type", f.Type}, {"key", f.Key}, {"error", f.Error}} {
		if kv[1] != "" {
			add(kv[0], kv[1])
		}
	}
	if !f.Since.IsZero() {
		add("since", f.Since.UTC().Format(time.RFC3339))
	}
	if !f.Until.IsZero() {
		add("until", f.Until.UTC().Format(time.RFC3339))
	}
	if f.FromID != 0 || f.ToID != 0 {
		add("ids", fmt.Sprintf("%d-%d", f.FromID, f.ToID))
	}
	if f.Limit > 0 {
		add("limit", fmt.Sprint(f.Limit))
	}
	if len(parts) == 0 {
		return " (all)"
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

// plural returns noun ("parked events") for n events, singular for one.
func plural(noun string, n int) string {
	if n == 1 {
		return strings.TrimSuffix(noun, "s")
	}
	return noun
}
