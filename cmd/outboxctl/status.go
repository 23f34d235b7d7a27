package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/admin"
	"github.com/fxoutbox/outbox/internal/tablesql"
)

func cmdStatus(ctx context.Context, args []string, e env) int {
	c := newCommand("status", e, "[--all] [--prefix P] [--json]")
	c.fs.BoolVar(&c.all, "all", false, "every outbox table of the database (found by its columns), and every inbox table with its consumers")
	if ok, code := c.parseNone(args); !ok {
		return code
	}
	conn, table, lanes, code := c.connect(ctx)
	if code != 0 {
		return code
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if c.all {
		return statusAll(ctx, c, conn, lanes)
	}
	st, err := admin.ReadStatus(ctx, conn, table, &admin.StatusOptions{Lanes: lanes})
	if err != nil {
		fmt.Fprintf(e.stderr, "outboxctl status: %s\n", explain(err, table, ""))
		return exitError
	}
	if c.json {
		if err := writeJSON(e.stdout, st); err != nil {
			return exitError
		}
		return exitOK
	}
	printStatus(e, st)
	return exitOK
}

func printStatus(e env, st admin.Status) {
	w := e.stdout
	fmt.Fprintf(w, "Table     %s\n", st.Table)
	backlog := thousands(st.Backlog)
	if st.BacklogCapped {
		backlog = "over " + backlog
	}
	if st.Backlog == 0 {
		fmt.Fprintf(w, "Backlog   0 events waiting\n")
	} else {
		fmt.Fprintf(w, "Backlog   %s events waiting, oldest %s old (written %s)\n", backlog, age(st.OldestAge), stamp(*st.OldestCreatedAt))
	}
	fmt.Fprintf(w, "Rates     %.1f/s written, %.1f/s published (last %s", st.WrittenPerSecond, st.PublishedPerSecond, strings.TrimSuffix(st.RateWindow.String(), "0s"))
	if st.Backlog > 0 {
		if drain := st.PublishedPerSecond - st.WrittenPerSecond; drain > 0 {
			fmt.Fprintf(w, "; backlog drained in about %s", age(time.Duration(float64(st.Backlog)/drain*float64(time.Second))))
		} else {
			fmt.Fprint(w, "; backlog not shrinking")
		}
	}
	fmt.Fprintln(w, ")")
	fmt.Fprintf(w, "Parked    %s events\n", thousands(st.Parked))
	if len(st.ParkedGroups) > 0 {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  COUNT\tTOPIC\tLAST PARKED\tREASON")
		for _, g := range st.ParkedGroups {
			// The reason last, whole (up to 200 bytes): it is one text per
			// cause, to copy into --error.
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", thousands(g.Count), printable(g.Topic, 40), stamp(g.LastParkedAt), printable(g.Reason, 200))
		}
		_ = tw.Flush()
		var shown int64
		for _, g := range st.ParkedGroups {
			shown += g.Count
		}
		if shown < st.Parked {
			fmt.Fprintf(w, "  (%s more in smaller groups)\n", thousands(st.Parked-shown))
		}
		fmt.Fprintln(w, "  see them: outboxctl parked list [--topic T] [--error TEXT]")
	}
	if len(st.PartitionsKept) > 0 {
		fmt.Fprintf(w, "Partitions  %d kept past their time (docs/partitions.md)\n", len(st.PartitionsKept))
		for _, p := range st.PartitionsKept {
			fmt.Fprintf(w, "  %s  %s\n", printable(p.Name, 63), printable(p.Reason, 300))
		}
	}
	fmt.Fprintf(w, "Lanes     %d of %d held now", len(st.LanesHeld), st.Lanes)
	if len(st.LanesHeld) == 0 {
		fmt.Fprint(w, " (a relay holds its lanes only while a batch is in flight)")
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "Sessions  %d relay sessions seen (holding lanes, listening for wake-ups, or reporting the gauges)\n", len(st.Sessions))
	if len(st.Sessions) > 0 {
		now := time.Now()
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  PID\tAPPLICATION\tCLIENT\tCONNECTED\tSTATE\tLISTENING\tLANES (HELD FOR)")
		for _, s := range st.Sessions {
			app, client, connected := printable(s.Application, 30), s.Client, "?"
			if app == "" {
				app = "-"
			}
			if client == "" {
				client = "local"
			}
			if s.Connected != nil {
				connected = age(now.Sub(*s.Connected)) + " ago"
			}
			lanes := "-"
			if len(s.Lanes) > 0 {
				lanes = laneList(s.Lanes)
				for _, h := range st.LanesHeld {
					if h.PID == s.PID && h.Since != nil {
						lanes += " (" + age(now.Sub(*h.Since)) + ")"
						break
					}
				}
			}
			listening := "no"
			if s.Listening {
				listening = "yes"
			}
			if s.StatsReporter {
				lanes += " [reports gauges]"
			}
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%s\t%s\n", s.PID, app, client, connected, printable(s.State, 30), listening, lanes)
		}
		_ = tw.Flush()
	}
}

// laneList writes lanes as ranges: 1-4,9,12-13.
func laneList(lanes []int) string {
	var parts []string
	for i := 0; i < len(lanes); {
		j := i
		for j+1 < len(lanes) && lanes[j+1] == lanes[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, fmt.Sprintf("%d-%d", lanes[i], lanes[j]))
		} else {
			parts = append(parts, fmt.Sprint(lanes[i]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

// inboxStatus is an inbox table in status --all: its consumers (those that
// applied records, and those with parked ones) and their parked records.
type inboxStatus struct {
	Table     string                      `json:"table"`
	Consumers []string                    `json:"consumers"`
	Parked    int64                       `json:"parked"`
	Groups    []tablesql.InboxParkedCount `json:"groups"`
}

// statusAll is status --all: every outbox table the database holds, found
// by its columns, then every inbox table with its consumers. A table
// dropped meanwhile is left out; one that cannot be read is reported on
// stderr and makes the exit code 1, after the others.
func statusAll(ctx context.Context, c *command, conn *pgx.Conn, lanes int) int {
	e := c.e
	tables, err := admin.FindTables(ctx, conn)
	if err == nil {
		var inboxes []outbox.Table
		if inboxes, err = tablesql.FindInboxTables(ctx, conn); err == nil {
			return statusOf(ctx, c, conn, lanes, tables, inboxes)
		}
	}
	fmt.Fprintf(e.stderr, "outboxctl status --all: %s\n", explain(err, outbox.Table{}, ""))
	return exitError
}

func statusOf(ctx context.Context, c *command, conn *pgx.Conn, lanes int, tables, inboxes []outbox.Table) int {
	e, code := c.e, exitOK
	failed := func(why string) {
		fmt.Fprintf(e.stderr, "outboxctl status --all: %s\n", why)
		code = exitError
	}
	outs, ins := []admin.Status{}, []inboxStatus{}
	for _, t := range tables {
		st, err := admin.ReadStatus(ctx, conn, t, &admin.StatusOptions{Lanes: lanes})
		switch {
		case dropped(err):
		case err != nil:
			failed(explain(err, t, ""))
		default:
			outs = append(outs, st)
		}
	}
	for _, t := range inboxes {
		consumers, err := tablesql.InboxConsumers(ctx, conn, t)
		switch {
		case dropped(err):
			continue
		case err != nil:
			failed(explainInbox(err, t, ""))
			continue
		}
		groups, err := tablesql.CountInboxParked(ctx, conn, t)
		if err != nil && !dropped(err) { // no <name>_parked table: nothing parked
			failed(explainInbox(err, t, ""))
		}
		in := inboxStatus{Table: t.String(), Consumers: consumers, Groups: groups}
		for _, g := range groups {
			in.Parked += g.Count
			if !slices.Contains(in.Consumers, g.Consumer) { // parked records only
				in.Consumers = append(in.Consumers, g.Consumer)
			}
		}
		slices.Sort(in.Consumers)
		ins = append(ins, in)
	}
	if len(outs) == 0 && len(ins) == 0 && code == exitOK {
		fmt.Fprintln(e.stderr, "no outbox or inbox table in this database (an outbox table has the columns event_id, topic, partition_key, published_at, ...; an inbox table consumer, event_id, processed_at, ...)")
		code = exitNoMatch
	}
	if c.json {
		if err := writeJSON(e.stdout, struct {
			Outboxes []admin.Status `json:"outboxes"`
			Inboxes  []inboxStatus  `json:"inboxes"`
		}{outs, ins}); err != nil {
			return exitError
		}
		return code
	}
	if code == exitNoMatch {
		return code
	}
	w := e.stdout
	fmt.Fprintf(w, "%d outbox table(s), %d inbox table(s) (found by their columns)\n", len(outs), len(ins))
	for _, st := range outs {
		fmt.Fprintln(w)
		printStatus(e, st)
	}
	for _, in := range ins {
		fmt.Fprintln(w)
		fmt.Fprintf(w, "Inbox     %s (parked records in %s_parked)\n", in.Table, in.Table)
		consumers := "none yet"
		if len(in.Consumers) > 0 {
			var names []string
			for _, n := range in.Consumers {
				names = append(names, printable(n, 60))
			}
			consumers = strings.Join(names, ", ")
		}
		fmt.Fprintf(w, "Consumers %s\n", consumers)
		fmt.Fprintf(w, "Parked    %s records\n", thousands(in.Parked))
		if len(in.Groups) > 0 {
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "  COUNT\tCONSUMER\tTOPIC\tERROR TYPE\tLAST PARKED")
			for _, g := range in.Groups {
				fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", thousands(g.Count), printable(g.Consumer, 30), printable(g.Topic, 40), printable(g.ErrorType, 30), stamp(g.LastParkedAt))
			}
			_ = tw.Flush()
		}
	}
	return code
}

// dropped reports whether err says a table (or its schema) does not exist:
// one status --all found and that was dropped since.
func dropped(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && (pg.Code == "42P01" || pg.Code == "3F000")
}
