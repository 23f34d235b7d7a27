package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"

	"github.com/fxoutbox/outbox/admin"
	"github.com/fxoutbox/outbox/internal/textcut"
)

func cmdList(ctx context.Context, args []string, e env) int {
	c := newCommand("parked list", e, "[filters] [--limit N] [--after ID] [--json]")
	c.filterFlags(fmt.Sprintf("default %d", admin.DefaultLimit))
	c.fs.Int64Var(&c.after, "after", 0, "only rows with id above this: the next page after the last id shown")
	pos, ok, code := c.parse(args)
	if !ok {
		return code
	}
	f, code := c.filter(pos, time.Now())
	if code != 0 {
		return code
	}
	if c.after < 0 {
		return c.usageErr("--after must not be negative")
	}
	f.After = c.after
	if f.Limit == 0 {
		f.Limit = admin.DefaultLimit
	}
	conn, table, _, code := c.connect(ctx)
	if code != 0 {
		return code
	}
	defer conn.Close(context.WithoutCancel(ctx))
	evs, err := admin.ListParked(ctx, conn, table, f)
	if err != nil {
		fmt.Fprintf(e.stderr, "outboxctl parked list: %s\n", explain(err, table, ""))
		return exitError
	}
	var next int64
	if len(evs) == f.Limit {
		next = evs[len(evs)-1].ID
	}
	if c.json {
		if evs == nil {
			evs = []admin.ParkedEvent{}
		}
		if err := writeJSON(e.stdout, struct {
			Events    []admin.ParkedEvent `json:"events"`
			NextAfter int64               `json:"next_after,omitempty"`
		}{evs, next}); err != nil {
			return exitError
		}
	} else if len(evs) > 0 {
		tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tEVENT ID\tTYPE\tTOPIC\tKEY\tATTEMPTS\tPARKED\tREASON")
		for _, p := range evs {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", p.ID, p.EventID, printable(p.EventType, 40), printable(p.Topic, 40),
				printable(p.Key, 30), p.Attempts, stamp(p.ParkedAt), printable(p.Reason, 60))
		}
		_ = tw.Flush()
	}
	switch {
	case len(evs) == 0:
		fmt.Fprintln(e.stderr, "no parked events match")
		return exitNoMatch
	case next != 0 && !c.json:
		fmt.Fprintf(e.stderr, "%d shown; more may follow: add --after %d\n", len(evs), next)
	}
	return exitOK
}

func cmdShow(ctx context.Context, args []string, e env) int {
	c := newCommand("parked show", e, "<event-id> [--json]")
	pos, ok, code := c.parse(args)
	if !ok {
		return code
	}
	if len(pos) != 1 {
		return c.usageErr("name one event id, as printed by outboxctl parked list or the relay's log")
	}
	id, err := uuid.Parse(pos[0])
	if err != nil {
		return c.usageErr("%s is not an event id (a UUID)", textcut.Quote(pos[0], 60))
	}
	conn, table, _, code := c.connect(ctx)
	if code != 0 {
		return code
	}
	defer conn.Close(context.WithoutCancel(ctx))
	p, err := admin.GetParked(ctx, conn, table, id)
	switch {
	case errors.Is(err, admin.ErrNotFound):
		fmt.Fprintf(e.stderr, "outboxctl parked show: no event %s in %s (deleted, or another table: check OUTBOX_SCHEMA and OUTBOX_TABLE)\n", id, table)
		return exitNoMatch
	case errors.Is(err, admin.ErrNotParked):
		fmt.Fprintf(e.stderr, "outboxctl parked show: %s\n", strings.TrimPrefix(cutErr(err), "admin: "))
		return exitNoMatch
	case err != nil:
		fmt.Fprintf(e.stderr, "outboxctl parked show: %s\n", explain(err, table, ""))
		return exitError
	}
	if c.json {
		if err := writeJSON(e.stdout, p); err != nil {
			return exitError
		}
		return exitOK
	}
	w := e.stdout
	fields := [][2]string{
		{"Event ID", p.EventID.String()},
		{"Row ID", fmt.Sprint(p.ID)},
		{"Type", printable(p.EventType, 200)},
		{"Aggregate", printable(p.AggregateType, 100) + " " + printable(p.AggregateID, 200)},
		{"Topic", printable(p.Topic, 300)},
		{"Key", printable(p.Key, 300)},
		{"Written", stamp(p.CreatedAt)},
	}
	if p.FirstTryAt != nil {
		fields = append(fields, [2]string{"First try", stamp(*p.FirstTryAt)})
	}
	fields = append(fields, [2]string{"Parked", stamp(p.ParkedAt) + " after " + fmt.Sprint(p.Attempts) + " attempts"})
	if p.Reason != p.LastError {
		// Cursor mode: the stable reason, and the last try's error in full.
		fields = append(fields, [2]string{"Reason", printable(p.Reason, 2000)})
	}
	fields = append(fields, [2]string{"Last error", printable(p.LastError, 2000)})
	writeRecord(w, fields, p.Headers, "Payload", p.Payload)
	fmt.Fprintf(w, "\nOnce the cause is fixed: outboxctl parked requeue %s\nTo drop it for good:     outboxctl parked delete %s\n", p.EventID, p.EventID)
	return exitOK
}
