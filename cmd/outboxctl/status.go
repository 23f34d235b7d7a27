package main

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fxoutbox/outbox/admin"
)

func cmdStatus(ctx context.Context, args []string, e env) int {
	c := newCommand("status", e, "[--json]")
	if ok, code := c.parseNone(args); !ok {
		return code
	}
	conn, table, lanes, code := c.connect(ctx)
	if code != 0 {
		return code
	}
	defer conn.Close(context.WithoutCancel(ctx))
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
