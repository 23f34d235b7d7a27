package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/inbox"
	"github.com/fxoutbox/outbox/migrations"
	"github.com/fxoutbox/outbox/outboxconfig"
)

// inboxWorld is a world with the inbox tables (default name, outbox_inbox)
// in its schema and parked records of two consumers: billing 30 (20 on
// shop.orders, handler; 10 on shop.payments without an event id,
// no_event_id), shipping 5 (shop.orders, handler.permanent).
type inboxWorld struct {
	*world
	inbox outbox.Table
}

func newInboxWorld(t *testing.T) *inboxWorld {
	w := &inboxWorld{world: newWorld(t)}
	w.inbox = outbox.Table{Schema: w.table.Schema}
	if err := migrations.Inbox.Up(w.ctx, w.pool, w.inbox); err != nil {
		t.Fatal(err)
	}
	w.sql(`INSERT INTO $P (consumer, event_id, event_type, topic, "partition", "offset", key, value, headers, "timestamp", attempts, error_type, last_error)
		SELECT 'billing', CASE WHEN g <= 20 THEN 'ev-' || g END, CASE WHEN g <= 20 THEN 'order.created.v1' END,
			CASE WHEN g <= 20 THEN 'shop.orders' ELSE 'shop.payments' END, g % 3, g, convert_to('k' || g, 'UTF8'),
			CASE WHEN g <= 20 THEN convert_to('{"n": ' || g || '}', 'UTF8') ELSE '\xff00'::bytea END,
			jsonb_build_object('x-event-id', 'ev-' || g, 'traceparent', '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01'),
			CASE WHEN g <= 20 THEN timestamptz '2026-12-03 09:00:00Z' END,
			CASE WHEN g <= 20 THEN 5 ELSE 0 END, CASE WHEN g <= 20 THEN 'handler' ELSE 'no_event_id' END, 'failure ' || g
		FROM generate_series(1, 30) g`)
	w.sql(`INSERT INTO $P (consumer, event_id, event_type, topic, "partition", "offset", attempts, error_type, last_error)
		SELECT 'shipping', 'ev-' || g, 'order.created.v1', 'shop.orders', 0, g, 1, 'handler.permanent', 'cannot decode'
		FROM generate_series(1, 5) g`)
	return w
}

func (w *inboxWorld) sql(sql string) {
	w.t.Helper()
	if _, err := w.pool.Exec(w.ctx, strings.ReplaceAll(sql, "$P", `"`+w.inbox.Schema+`".outbox_inbox_parked`)); err != nil {
		w.t.Fatal(err)
	}
}

func (w *inboxWorld) parked(where string) int {
	w.t.Helper()
	var n int
	if err := w.pool.QueryRow(w.ctx, `SELECT count(*) FROM "`+w.inbox.Schema+`".outbox_inbox_parked WHERE `+where).Scan(&n); err != nil {
		w.t.Fatal(err)
	}
	return n
}

// id returns the id of consumer's n-th (from 1) parked record.
func (w *inboxWorld) id(consumer string, n int) string {
	w.t.Helper()
	var id int64
	if err := w.pool.QueryRow(w.ctx, `SELECT id FROM "`+w.inbox.Schema+`".outbox_inbox_parked WHERE consumer = $1 ORDER BY id OFFSET $2 LIMIT 1`, consumer, n-1).Scan(&id); err != nil {
		w.t.Fatal(err)
	}
	return strconv.FormatInt(id, 10)
}

// runInbox runs the command with the inbox table of table.
func (w *inboxWorld) runInbox(table outbox.Table, stdin string, interactive bool, args ...string) result {
	w.t.Helper()
	var out, errb bytes.Buffer
	code := run(w.ctx, args, env{
		stdin: strings.NewReader(stdin), stdout: &out, stderr: &errb, interactive: interactive,
		getenv: func(k string) string {
			if k == "DATABASE_URL" {
				return os.Getenv("DATABASE_URL")
			}
			return ""
		},
		config: func() (outboxconfig.Config, error) { return outboxconfig.Config{Table: w.table}, nil },
		inboxConfig: func() (outboxconfig.InboxConfig, error) {
			return outboxconfig.InboxConfig{Consumer: inbox.Config{Table: table}}, nil
		},
	})
	return result{code, out.String(), errb.String()}
}

func (w *inboxWorld) run(stdin string, interactive bool, args ...string) result {
	w.t.Helper()
	return w.runInbox(w.inbox, stdin, interactive, args...)
}

// An operator's session on an inbox with two consumers' parked records:
// status, list per consumer and in pages, show with value and headers,
// delete with and without confirmation, --json parsed back, exit codes.
func TestInboxParkedCommands(t *testing.T) {
	t.Parallel()
	w := newInboxWorld(t)

	// Status: counts by consumer, topic and error type.
	r := w.run("", false, "inbox", "status")
	w.want(r, exitOK, "Inbox     "+w.inbox.Schema+".outbox_inbox", "Parked    35 records", "handler.permanent", "Consumer.Retry")
	if !hasLine(r.stdout, "20", "billing", "shop.orders", "handler") || !hasLine(r.stdout, "10", "billing", "shop.payments", "no_event_id") {
		t.Fatalf("status lacks the billing/shop.orders/handler group of 20:\n%s", r.stdout)
	}
	type group struct {
		Consumer, Topic string
		ErrorType       string `json:"error_type"`
		Count           int
	}
	st := decode[struct {
		Table  string
		Parked int
		Groups []group
	}](t, w.run("", false, "inbox", "status", "--json").stdout)
	if st.Parked != 35 || len(st.Groups) != 3 || st.Groups[0] != (group{"billing", "shop.orders", "handler", 20}) ||
		st.Groups[2] != (group{"shipping", "shop.orders", "handler.permanent", 5}) {
		t.Fatalf("status --json: %+v", st)
	}

	// List: per consumer, in pages, without values.
	type page struct {
		Records   []map[string]any `json:"records"`
		NextAfter int64            `json:"next_after"`
	}
	seen := 0
	for after := "0"; ; {
		r := w.run("", false, "inbox", "parked", "list", "--consumer", "billing", "--limit", "7", "--after", after, "--json")
		if r.code == exitNoMatch {
			break
		}
		w.want(r, exitOK)
		p := decode[page](t, r.stdout)
		for _, rec := range p.Records {
			if rec["consumer"] != "billing" || rec["value"] != nil || rec["headers"] != nil {
				t.Fatalf("listed %v", rec)
			}
		}
		seen += len(p.Records)
		if p.NextAfter == 0 {
			break
		}
		after = jsonNumber(p.NextAfter)
	}
	if seen != 30 {
		t.Fatalf("paged through %d of billing's records, want 30", seen)
	}
	all := decode[page](t, w.run("", false, "inbox", "parked", "list", "--json").stdout)
	if len(all.Records) != 35 || all.Records[34]["consumer"] != "shipping" || all.Records[0]["key"] != "k1" || all.Records[0]["event_id"] != "ev-1" {
		t.Fatalf("list --json of every consumer: %d records, %v", len(all.Records), all.Records[0])
	}
	r = w.run("", false, "inbox", "parked", "list", "--limit", "3")
	w.want(r, exitOK, "PARTITION/OFFSET", "billing", "ev-1", "more may follow: add --after "+w.id("billing", 3))
	w.want(w.run("", false, "inbox", "parked", "list", "--consumer", "nobody"), exitNoMatch, `no parked records in `+w.inbox.Schema+`.outbox_inbox_parked of consumer "nobody"`)

	// Show: value and headers; a record of another consumer is not found.
	first := w.id("billing", 1)
	r = w.run("", false, "inbox", "parked", "show", first)
	w.want(r, exitOK, "Consumer:", "billing", "Value (8 bytes):", `"n": 1`, "traceparent: 00-0af7", "x-event-id: ev-1",
		"Consumer.Retry(ctx, "+first+")", "outboxctl inbox parked delete "+first+" --consumer billing")
	shown := decode[map[string]any](t, w.run("", false, "inbox", "parked", "show", first, "--consumer", "billing", "--json").stdout)
	if shown["value"].(map[string]any)["n"] != 1.0 || shown["key"] != "k1" || shown["headers"].(map[string]any)["x-event-id"] != "ev-1" ||
		shown["error_type"] != "handler" || shown["timestamp"] != "2026-12-03T09:00:00Z" {
		t.Fatalf("show --json: %v", shown)
	}
	noID := decode[map[string]any](t, w.run("", false, "inbox", "parked", "show", w.id("billing", 30), "--json").stdout)
	if noID["value_base64"] != "/wA=" || noID["value"] != nil || noID["timestamp"] != nil || noID["event_id"] != "" {
		t.Fatalf("show --json of a record without identity and a binary value: %v", noID)
	}
	w.want(r, exitOK, "\nHeaders:\n  traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\n  x-event-id: ev-1\nValue (8 bytes):")
	// A record stored without headers still has the section.
	w.want(w.run("", false, "inbox", "parked", "show", w.id("shipping", 1)), exitOK, "\nHeaders: (none)\nValue (0 bytes):")
	w.want(w.run("", false, "inbox", "parked", "show", first, "--consumer", "shipping"), exitNoMatch, "no parked record "+first, `of consumer "shipping"`)
	w.want(w.run("", false, "inbox", "parked", "show", "x1"), exitUsage, `"x1" is not a record id`)

	// Delete: refused without a terminal or --yes, not done on no.
	ship := w.id("shipping", 1)
	w.want(w.run("", false, "inbox", "parked", "delete", ship), exitNotConfirmed, "refusing to delete 1 parked record", "pass --yes")
	w.want(w.run("n\n", true, "inbox", "parked", "delete", ship), exitNotConfirmed, "Delete 1 parked record of", "redeliveries are skipped", "Consumer.Retry", "nothing changed")
	w.want(w.run("", true, "inbox", "parked", "delete", ship), exitNotConfirmed) // EOF is no
	if n := w.parked("true"); n != 35 {
		t.Fatalf("an unconfirmed delete changed rows: %d left", n)
	}
	// Another consumer's record is not deleted.
	w.want(w.run("", false, "inbox", "parked", "delete", ship, "--consumer", "billing", "--yes"), exitNoMatch, "no parked record "+ship, "nothing to delete")
	w.want(w.run("yes\n", true, "inbox", "parked", "delete", ship, "--consumer", "shipping"), exitOK, "deleted 1 parked record\n")
	if n, gone := w.parked("consumer = 'shipping'"), w.parked("id = "+ship); n != 4 || gone != 0 {
		t.Fatalf("after delete: shipping has %d, record %s there %d times", n, ship, gone)
	}
	// Several ids, one already gone: the others are deleted.
	r = w.run("", false, "inbox", "parked", "delete", ship, w.id("shipping", 1), w.id("billing", 2), "--yes", "--json")
	w.want(r, exitOK, "no parked record "+ship+" in "+w.inbox.Schema+".outbox_inbox_parked: skipped")
	if res := decode[map[string]int](t, r.stdout); res["matched"] != 2 || res["deleted"] != 2 {
		t.Fatalf("delete --json: %v", res)
	}
	if n := w.parked("true"); n != 32 {
		t.Fatalf("%d records left, want 32", n)
	}
	w.want(w.run("", false, "inbox", "parked", "delete", ship, "--yes"), exitNoMatch, "nothing to delete")

	// Retry is the consuming service's; usage errors.
	w.want(w.run("", false, "inbox", "parked", "retry", first), exitUsage, "Consumer.Retry", "application's handler")
	w.want(w.run("", false, "inbox", "parked", "delete", "--yes"), exitUsage, "name the ids")
	w.want(w.run("", false, "inbox", "parked", "delete", "-3", "--yes"), exitUsage)
	w.want(w.run("", false, "inbox"), exitUsage, "status or parked")
	w.want(w.run("", false, "inbox", "parked"), exitUsage, "list, show or delete")
	w.want(w.run("", false, "inbox", "parked", "list", "extra"), exitUsage, "takes no arguments")
	w.want(w.run("", false, "inbox", "parked", "list", "--limit", "-1"), exitUsage, "must not be negative")
	w.want(w.run("", false, "inbox", "parked", "delete", "--help"), exitOK, "-consumer", "-yes", "Consumer.Retry")
	if !strings.Contains(w.run("", false, "help").stdout, "outboxctl inbox parked delete") {
		t.Fatal("help does not list the inbox commands")
	}

	// Another inbox table that does not exist: what to do.
	w.want(w.runInbox(outbox.Table{Schema: w.inbox.Schema, Name: "no_inbox"}, "", false, "inbox", "status"), exitError,
		"no_inbox_parked does not exist", "migrations.Inbox.Up", "OUTBOX_INBOX_TABLE")
}

// hasLine reports whether a line of s starts with the words.
func hasLine(s string, words ...string) bool {
	for _, line := range strings.Split(s, "\n") {
		f := strings.Fields(line)
		if len(f) >= len(words) && strings.Join(f[:len(words)], " ") == strings.Join(words, " ") {
			return true
		}
	}
	return false
}

// The built command reads the inbox table from OUTBOX_INBOX_SCHEMA and
// OUTBOX_INBOX_TABLE, as the consuming services do.
func TestBuiltInboxCommand(t *testing.T) {
	t.Parallel()
	w := newInboxWorld(t)
	bin := filepath.Join(t.TempDir(), "outboxctl")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := func(env ...string) result {
		t.Helper()
		c := exec.Command(bin, "inbox", "status")
		c.Env = append([]string{"PATH=" + os.Getenv("PATH"), "DATABASE_URL=" + os.Getenv("DATABASE_URL")}, env...)
		var out, errb bytes.Buffer
		c.Stdout, c.Stderr = &out, &errb
		err := c.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return result{code, out.String(), errb.String()}
	}
	w.want(cmd("OUTBOX_INBOX_SCHEMA="+w.inbox.Schema), exitOK, w.inbox.Schema+".outbox_inbox", "Parked    35 records")
	w.want(cmd("OUTBOX_INBOX_SCHEMA="+w.inbox.Schema, "OUTBOX_INBOX_TABLE=other_inbox"), exitError, "other_inbox_parked does not exist")
	w.want(cmd("OUTBOX_INBOX_SCHEMA="+w.inbox.Schema, "OUTBOX_INBOX_TABLE=bad name"), exitUsage, "OUTBOX_INBOX_TABLE")
}
