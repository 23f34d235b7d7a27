package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/admin"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/tablesql"
	"github.com/fxoutbox/outbox/internal/textcut"
)

// retryNote says why outboxctl does not retry inbox records.
const retryNote = "Retrying applies the record through the application's handler, so it runs in the consuming service: inbox Consumer.Retry(ctx, id)."

func cmdInbox(ctx context.Context, args []string, e env) int {
	if len(args) == 0 {
		fmt.Fprintln(e.stderr, "outboxctl inbox: name a command: status or parked (outboxctl help)")
		return exitUsage
	}
	switch args[0] {
	case "status":
		return cmdInboxStatus(ctx, args[1:], e)
	case "parked":
		if len(args) < 2 {
			fmt.Fprintln(e.stderr, "outboxctl inbox parked: name a command: list, show or delete (outboxctl help)")
			return exitUsage
		}
		switch args[1] {
		case "list":
			return cmdInboxList(ctx, args[2:], e)
		case "show":
			return cmdInboxShow(ctx, args[2:], e)
		case "delete":
			return cmdInboxDelete(ctx, args[2:], e)
		case "retry", "requeue":
			fmt.Fprintf(e.stderr, "outboxctl inbox parked %s: not a command of outboxctl. %s\n", args[1], retryNote)
			return exitUsage
		case "-h", "--help", "help":
			fmt.Fprint(e.stdout, usage)
			return exitOK
		}
		fmt.Fprintf(e.stderr, "outboxctl inbox parked: unknown command %s: use list, show or delete\n", textcut.Quote(args[1], 40))
		return exitUsage
	case "-h", "--help", "help":
		fmt.Fprint(e.stdout, usage)
		return exitOK
	}
	fmt.Fprintf(e.stderr, "outboxctl inbox: unknown command %s: use status or parked\n", textcut.Quote(args[0], 40))
	return exitUsage
}

// inboxCommand is a command on an inbox's parked records.
type inboxCommand struct {
	*command
	consumer string
}

func newInboxCommand(name string, e env, synopsis string) *inboxCommand {
	c := &inboxCommand{command: newCommand(name, e, synopsis)}
	return c
}

func (c *inboxCommand) consumerFlag() {
	c.fs.StringVar(&c.consumer, "consumer", "", "only records of this consumer (its inbox Config.Name, OUTBOX_INBOX_NAME; default: every consumer)")
}

// connectInbox reads the inbox table from OUTBOX_INBOX_SCHEMA and
// OUTBOX_INBOX_TABLE and connects.
func (c *inboxCommand) connectInbox(ctx context.Context) (conn *pgx.Conn, table outbox.Table, code int) {
	if c.prefix != "" {
		fmt.Fprintf(c.e.stderr, "outboxctl %s: --prefix selects an outbox's variables; the inbox commands read OUTBOX_INBOX_SCHEMA and OUTBOX_INBOX_TABLE (outboxctl status --all lists every inbox table)\n", c.name)
		return nil, table, exitUsage
	}
	read := c.e.inboxConfig
	if read == nil {
		read = readInboxConfig
	}
	cfg, err := read()
	if err != nil {
		fmt.Fprintf(c.e.stderr, "outboxctl: configuration: %v\n", err)
		return nil, table, exitUsage
	}
	table = sqlname.Inbox(cfg.Consumer.Table)
	conn, code = c.dial(ctx, "inbox", func(err error) string { return explainInbox(err, table, "") })
	return conn, table, code
}

func parkedOf(table outbox.Table) outbox.Table {
	return outbox.Table{Schema: table.Schema, Name: table.Name + "_parked"}
}

// explainInbox is explain for the inbox's tables and role.
func explainInbox(err error, table outbox.Table, op string) string {
	var pg *pgconn.PgError
	switch {
	case errors.As(err, &pg) && (pg.Code == "42P01" || pg.Code == "3F000"):
		return fmt.Sprintf("the inbox table %s does not exist in this database (%s): run the inbox migrations (migrations.Inbox.Up, OUTBOX_INBOX_MIGRATE=true on the consuming service, or the SQL files in migrations/inbox/), or set OUTBOX_INBOX_SCHEMA and OUTBOX_INBOX_TABLE to the table your consumers use",
			parkedOf(table), printable(pg.Message, 200))
	case errors.As(err, &pg) && pg.Code == "42501":
		need := "SELECT"
		if op == "DELETE" {
			need = "SELECT and DELETE"
		}
		return fmt.Sprintf("permission denied (%s): the role in DATABASE_URL needs %s on %s; connect as the consumer's role, which has them (migrations/inbox/roles.example.sql)",
			printable(pg.Message, 200), need, parkedOf(table))
	}
	return explain(err, table, op)
}

// inboxRecord is a parked record as --json prints it: the key as text when
// it is UTF-8 (else key_base64), the value as JSON when it is JSON (else
// value_base64), and no record time when it had none.
type inboxRecord struct {
	tablesql.InboxParked
	Key         *string           `json:"key"`
	KeyBase64   []byte            `json:"key_base64,omitempty"`
	Value       json.RawMessage   `json:"value,omitempty"`
	ValueBase64 []byte            `json:"value_base64,omitempty"`
	Headers     map[string]string `json:"headers,omitempty"`
	Timestamp   *time.Time        `json:"timestamp,omitempty"`
}

// recordJSON returns p for --json; full adds its value and headers.
func recordJSON(p tablesql.InboxParked, full bool) inboxRecord {
	r := inboxRecord{InboxParked: p}
	switch {
	case p.Key == nil:
	case utf8.Valid(p.Key):
		k := string(p.Key)
		r.Key = &k
	default:
		r.KeyBase64 = p.Key
	}
	if !p.Timestamp.IsZero() {
		r.Timestamp = &p.Timestamp
	}
	if full {
		r.Headers = p.Headers
		if json.Valid(p.Value) {
			r.Value = p.Value
		} else {
			r.ValueBase64 = p.Value
		}
	}
	return r
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func cmdInboxList(ctx context.Context, args []string, e env) int {
	c := newInboxCommand("inbox parked list", e, "[--consumer NAME] [--limit N] [--after ID] [--json]")
	c.about = "The inbox's parked records, oldest (lowest id) first, without their values and headers\n(outboxctl inbox parked show <id> prints them). " + retryNote
	c.consumerFlag()
	c.fs.IntVar(&c.limit, "limit", 0, fmt.Sprintf("at most this many records (default %d)", admin.DefaultLimit))
	c.fs.Int64Var(&c.after, "after", 0, "only records with id above this: the next page after the last id shown")
	if ok, code := c.parseNone(args); !ok {
		return code
	}
	if c.limit < 0 || c.after < 0 {
		return c.usageErr("--limit and --after must not be negative")
	}
	if c.limit == 0 {
		c.limit = admin.DefaultLimit
	}
	conn, table, code := c.connectInbox(ctx)
	if code != 0 {
		return code
	}
	defer conn.Close(context.WithoutCancel(ctx))
	recs, err := tablesql.ListInboxParked(ctx, conn, table, c.consumer, c.after, c.limit)
	if err != nil {
		fmt.Fprintf(e.stderr, "outboxctl inbox parked list: %s\n", explainInbox(err, table, ""))
		return exitError
	}
	var next int64
	if len(recs) == c.limit {
		next = recs[len(recs)-1].ID
	}
	if c.json {
		out := make([]inboxRecord, 0, len(recs))
		for _, p := range recs {
			out = append(out, recordJSON(p, false))
		}
		if err := writeJSON(e.stdout, struct {
			Records   []inboxRecord `json:"records"`
			NextAfter int64         `json:"next_after,omitempty"`
		}{out, next}); err != nil {
			return exitError
		}
	} else if len(recs) > 0 {
		tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tCONSUMER\tTOPIC\tPARTITION/OFFSET\tEVENT ID\tTYPE\tATTEMPTS\tERROR TYPE\tPARKED\tLAST ERROR")
		for _, p := range recs {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%d/%d\t%s\t%s\t%d\t%s\t%s\t%s\n", p.ID, printable(p.Consumer, 30), printable(p.Topic, 40), p.Partition, p.Offset,
				orDash(printable(p.EventID, 40)), orDash(printable(p.Type, 40)), p.Attempts, printable(p.ErrorType, 30), stamp(p.ParkedAt), printable(p.LastError, 60))
		}
		_ = tw.Flush()
	}
	switch {
	case len(recs) == 0:
		fmt.Fprintf(e.stderr, "no parked records in %s%s\n", parkedOf(table), ofConsumer(c.consumer))
		return exitNoMatch
	case next != 0 && !c.json:
		fmt.Fprintf(e.stderr, "%d shown; more may follow: add --after %d\n", len(recs), next)
	}
	return exitOK
}

// ofConsumer names the --consumer filter in messages.
func ofConsumer(consumer string) string {
	if consumer == "" {
		return ""
	}
	return " of consumer " + textcut.Quote(consumer, 60)
}

func cmdInboxShow(ctx context.Context, args []string, e env) int {
	c := newInboxCommand("inbox parked show", e, "<id> [--consumer NAME] [--json]")
	c.about = "One parked record with its value and headers. " + retryNote
	c.consumerFlag()
	pos, ok, code := c.parse(args)
	if !ok {
		return code
	}
	if len(pos) != 1 {
		return c.usageErr("name one record id, as printed by outboxctl inbox parked list")
	}
	ids, code := c.ids(pos)
	if code != 0 {
		return code
	}
	conn, table, code := c.connectInbox(ctx)
	if code != 0 {
		return code
	}
	defer conn.Close(context.WithoutCancel(ctx))
	p, err := tablesql.GetInboxParked(ctx, conn, table, c.consumer, ids[0])
	switch {
	case errors.Is(err, admin.ErrNotFound):
		fmt.Fprintf(e.stderr, "outboxctl inbox parked show: no parked record %d in %s%s (retried or deleted, or another consumer or table: check --consumer, OUTBOX_INBOX_SCHEMA and OUTBOX_INBOX_TABLE)\n",
			ids[0], parkedOf(table), ofConsumer(c.consumer))
		return exitNoMatch
	case err != nil:
		fmt.Fprintf(e.stderr, "outboxctl inbox parked show: %s\n", explainInbox(err, table, ""))
		return exitError
	}
	if c.json {
		if err := writeJSON(e.stdout, recordJSON(p, true)); err != nil {
			return exitError
		}
		return exitOK
	}
	w := e.stdout
	recorded := "none"
	if !p.Timestamp.IsZero() {
		recorded = stamp(p.Timestamp)
	}
	key := "none"
	if p.Key != nil {
		key = printable(string(p.Key), 300)
	}
	writeRecord(w, [][2]string{
		{"Row ID", fmt.Sprint(p.ID)},
		{"Consumer", printable(p.Consumer, 200)},
		{"Event ID", orDash(printable(p.EventID, 200))},
		{"Type", orDash(printable(p.Type, 200))},
		{"Topic", printable(p.Topic, 300)},
		{"Partition", fmt.Sprintf("%d, offset %d", p.Partition, p.Offset)},
		{"Key", key},
		{"Record time", recorded},
		{"Parked", stamp(p.ParkedAt) + " after " + fmt.Sprint(p.Attempts) + " attempts"},
		{"Error type", printable(p.ErrorType, 100)},
		{"Last error", printable(p.LastError, 2000)},
	}, p.Headers, "Value", p.Value)
	fmt.Fprintf(w, "\nTo apply it once the cause is fixed: in the consuming service, Consumer.Retry(ctx, %d): it runs the application's handler.\n", p.ID)
	fmt.Fprintf(w, "To drop it without applying it:      outboxctl inbox parked delete %d --consumer %s\n", p.ID, shellWord(p.Consumer))
	return exitOK
}

// shellWord returns s as one word a shell reads back as s.
func shellWord(s string) string {
	for _, r := range s {
		if !(r == '-' || r == '_' || r == '.' || r == '/' || r == ':' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return "'" + strings.ReplaceAll(printable(s, 200), "'", `'\''`) + "'"
		}
	}
	return s
}

// ids parses record ids: positive numbers.
func (c *inboxCommand) ids(pos []string) ([]int64, int) {
	var ids []int64
	for _, s := range pos {
		id, err := strconv.ParseInt(s, 10, 64)
		if err != nil || id <= 0 {
			return nil, c.usageErr("%s is not a record id (the ID column of outboxctl inbox parked list, a number such as 42)", textcut.Quote(s, 60))
		}
		ids = append(ids, id)
	}
	return ids, 0
}

func cmdInboxDelete(ctx context.Context, args []string, e env) int {
	c := newInboxCommand("inbox parked delete", e, "<id>... [--consumer NAME] [--yes] [--json]")
	c.about = "Drop parked records without applying them (asked about unless --yes). The inbox rows of their events stay,\nso redeliveries of those events are skipped. " + retryNote
	c.consumerFlag()
	c.fs.BoolVar(&c.yes, "yes", false, "do not ask for confirmation")
	pos, ok, code := c.parse(args)
	if !ok {
		return code
	}
	if len(pos) == 0 {
		return c.usageErr("name the ids of the records to delete, as printed by outboxctl inbox parked list")
	}
	ids, code := c.ids(pos)
	if code != 0 {
		return code
	}
	conn, table, code := c.connectInbox(ctx)
	if code != 0 {
		return code
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var found []tablesql.InboxParked
	for _, id := range slices.Compact(slices.Sorted(slices.Values(ids))) {
		p, err := tablesql.GetInboxParked(ctx, conn, table, c.consumer, id)
		switch {
		case errors.Is(err, admin.ErrNotFound):
			fmt.Fprintf(e.stderr, "no parked record %d in %s%s: skipped\n", id, parkedOf(table), ofConsumer(c.consumer))
		case err != nil:
			fmt.Fprintf(e.stderr, "outboxctl inbox parked delete: %s\n", explainInbox(err, table, ""))
			return exitError
		default:
			found = append(found, p)
		}
	}
	n := len(found)
	if n == 0 {
		fmt.Fprintln(e.stderr, "no parked records match: nothing to delete")
		if c.json {
			_ = writeJSON(e.stdout, map[string]int{"matched": 0, "deleted": 0})
		}
		return exitNoMatch
	}
	if !c.yes {
		if !e.interactive {
			fmt.Fprintf(e.stderr, "outboxctl inbox parked delete: refusing to delete %s without confirmation: there is no terminal to ask on; pass --yes\n", records(n))
			return exitNotConfirmed
		}
		var list []string
		for _, p := range found {
			list = append(list, fmt.Sprintf("%d (%s, %s)", p.ID, printable(p.Consumer, 40), printable(p.Topic, 40)))
		}
		fmt.Fprintf(e.stderr, "Delete %s of %s: %s?\nThey are dropped without being applied; the inbox rows of their events stay, so redeliveries are skipped.\n%s\nType yes to go on: ",
			records(n), parkedOf(table), strings.Join(list, ", "), retryNote)
		answer, _ := bufio.NewReader(e.stdin).ReadString('\n')
		if a := strings.ToLower(strings.TrimSpace(answer)); a != "yes" && a != "y" {
			fmt.Fprintln(e.stderr, "not confirmed: nothing changed")
			return exitNotConfirmed
		}
	}
	done := 0
	for _, p := range found {
		err := tablesql.DeleteInboxParked(ctx, conn, table, p.Consumer, p.ID)
		switch {
		case errors.Is(err, admin.ErrNotFound):
			fmt.Fprintf(e.stderr, "parked record %d is gone already (retried or deleted meanwhile)\n", p.ID)
		case err != nil:
			fmt.Fprintf(e.stderr, "outboxctl inbox parked delete: %d of %s deleted, then: %s\n", done, records(n), explainInbox(err, table, "DELETE"))
			if c.json {
				_ = writeJSON(e.stdout, map[string]int{"matched": n, "deleted": done})
			}
			return exitError
		default:
			done++
		}
	}
	if c.json {
		if err := writeJSON(e.stdout, map[string]int{"matched": n, "deleted": done}); err != nil {
			return exitError
		}
		return exitOK
	}
	fmt.Fprintf(e.stdout, "deleted %s\n", records(done))
	return exitOK
}

// records returns "1 parked record", "3 parked records".
func records(n int) string {
	if n == 1 {
		return "1 parked record"
	}
	return thousands(n) + " parked records"
}

func cmdInboxStatus(ctx context.Context, args []string, e env) int {
	c := newInboxCommand("inbox status", e, "[--json]")
	c.about = "The inbox's parked records, counted by consumer, topic and error type. Changes nothing."
	if ok, code := c.parseNone(args); !ok {
		return code
	}
	conn, table, code := c.connectInbox(ctx)
	if code != 0 {
		return code
	}
	defer conn.Close(context.WithoutCancel(ctx))
	groups, err := tablesql.CountInboxParked(ctx, conn, table)
	if err != nil {
		fmt.Fprintf(e.stderr, "outboxctl inbox status: %s\n", explainInbox(err, table, ""))
		return exitError
	}
	var total int64
	for _, g := range groups {
		total += g.Count
	}
	if c.json {
		if err := writeJSON(e.stdout, struct {
			Table  string                      `json:"table"`
			Parked int64                       `json:"parked"`
			Groups []tablesql.InboxParkedCount `json:"groups"`
		}{table.String(), total, groups}); err != nil {
			return exitError
		}
		return exitOK
	}
	w := e.stdout
	fmt.Fprintf(w, "Inbox     %s (parked records in %s)\n", table, parkedOf(table))
	fmt.Fprintf(w, "Parked    %s records\n", thousands(total))
	if len(groups) > 0 {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  COUNT\tCONSUMER\tTOPIC\tERROR TYPE\tFIRST PARKED\tLAST PARKED")
		for _, g := range groups {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\n", thousands(g.Count), printable(g.Consumer, 30), printable(g.Topic, 40), printable(g.ErrorType, 30),
				stamp(g.FirstParkedAt), stamp(g.LastParkedAt))
		}
		_ = tw.Flush()
		fmt.Fprintln(w, "  see them: outboxctl inbox parked list [--consumer NAME]; drop one: outboxctl inbox parked delete <id>")
		fmt.Fprintf(w, "  %s\n", retryNote)
	}
	return exitOK
}
