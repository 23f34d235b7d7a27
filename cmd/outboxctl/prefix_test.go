package main

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/admin"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/migrations"
)

// runEnv runs the command reading the configuration from the process's
// environment, as the installed command does.
func (w *world) runEnv(args ...string) result {
	w.t.Helper()
	var out, errb bytes.Buffer
	code := run(w.ctx, args, env{
		stdin: strings.NewReader(""), stdout: &out, stderr: &errb,
		getenv: os.Getenv, config: readConfig, prefixConfig: readPrefixConfig, inboxConfig: readInboxConfig,
	})
	return result{code, out.String(), errb.String()}
}

// --prefix AUDIT_ reads the variables a service gives its audit outbox
// with fxoutbox.NamedFromEnv("audit", "AUDIT_"): AUDIT_OUTBOX_SCHEMA,
// AUDIT_OUTBOX_TABLE, AUDIT_OUTBOX_LANES; before or after the command. Not
// parallel: it sets the process's environment.
func TestPrefixReadsTheServiceVariables(t *testing.T) {
	w := newWorld(t)
	audit := outbox.Table{Schema: w.table.Schema, Name: "audit_outbox"}
	if err := migrations.Outbox.Up(w.ctx, w.pool, audit); err != nil {
		t.Fatal(err)
	}
	if _, err := w.pool.Exec(w.ctx, "INSERT INTO "+sqlname.Ident(audit)+" (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, parked_at, last_error, attempts)"+
		" VALUES ('00000000-0000-7000-8000-0000000000a1', 'entry', 'e-1', 'entry.recorded.v1', '{}', 'audit.entry', 'e-1', now(), '[kafka.unknown_topic_or_partition] topic \"audit.entry\" does not exist', 5)"); err != nil {
		t.Fatal(err)
	}
	t.Setenv("OUTBOX_SCHEMA", w.table.Schema)
	t.Setenv("OUTBOX_TABLE", w.table.WithDefaults().Name)
	t.Setenv("AUDIT_OUTBOX_SCHEMA", audit.Schema)
	t.Setenv("AUDIT_OUTBOX_TABLE", audit.Name)
	t.Setenv("AUDIT_OUTBOX_LANES", "16")

	r := w.runEnv("--prefix", "AUDIT_", "status")
	w.want(r, exitOK, "Table     "+audit.String(), "Parked    1 events", "audit.entry", "of 16 held")
	r = w.runEnv("parked", "list", "--prefix=AUDIT_", "--json")
	w.want(r, exitOK, "00000000-0000-7000-8000-0000000000a1")
	r = w.runEnv("parked", "requeue", "--all", "--yes", "--prefix", "AUDIT_")
	w.want(r, exitOK, "requeued 1")
	// Without the prefix, the unprefixed variables: the service's other outbox.
	r = w.runEnv("status")
	w.want(r, exitOK, "Table     "+w.table.WithDefaults().String(), "of 64 held")

	// Errors and hints name the variables as set.
	t.Setenv("AUDIT_OUTBOX_TABLE", "missing_outbox")
	r = w.runEnv("status", "--prefix", "AUDIT_")
	w.want(r, exitError, "missing_outbox does not exist", "set AUDIT_OUTBOX_SCHEMA and AUDIT_OUTBOX_TABLE", "AUDIT_OUTBOX_MIGRATE=true")
	t.Setenv("AUDIT_OUTBOX_LANES", "many")
	r = w.runEnv("status", "--prefix", "AUDIT_")
	w.want(r, exitUsage, "AUDIT_OUTBOX_LANES")
	r = w.runEnv("--prefix", "audit", "status")
	w.want(r, exitUsage, "prefix", "AUDIT_")
	r = w.runEnv("inbox", "status", "--prefix", "AUDIT_")
	w.want(r, exitUsage, "--prefix", "OUTBOX_INBOX_TABLE")
}

func TestHoistPrefix(t *testing.T) {
	for in, want := range map[string]string{
		"--prefix AUDIT_ status --json":    "status --json --prefix AUDIT_",
		"--prefix=AUDIT_ parked list":      "parked list --prefix=AUDIT_",
		"-prefix AUDIT_ parked show -- id": "parked show -prefix AUDIT_ -- id",
		"status --prefix AUDIT_":           "status --prefix AUDIT_",
		"--prefix":                         "--prefix",
		"--json status":                    "--json status",
	} {
		if got := strings.Join(hoistPrefix(strings.Fields(in)), " "); got != want {
			t.Errorf("hoistPrefix(%s) = %s, want %s", in, got, want)
		}
	}
}

// status --all covers every outbox table of the database, found by its
// columns whatever its name, and every inbox table with its consumers.
// Not parallel: the other tests' tables come and go.
func TestStatusAll(t *testing.T) {
	w := newWorld(t)
	w.seed()
	audit := outbox.Table{Schema: w.table.Schema, Name: "audit_outbox"}
	if err := migrations.Outbox.Up(w.ctx, w.pool, audit); err != nil {
		t.Fatal(err)
	}
	if _, err := w.pool.Exec(w.ctx, "INSERT INTO "+sqlname.Ident(audit)+" (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key)"+
		" VALUES (gen_random_uuid(), 'entry', 'e-1', 'entry.recorded.v1', '{}', 'audit.entry', 'e-1')"); err != nil {
		t.Fatal(err)
	}
	inboxTable := outbox.Table{Schema: w.table.Schema}
	if err := migrations.Inbox.Up(w.ctx, w.pool, inboxTable); err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		`INSERT INTO "` + w.table.Schema + `".outbox_inbox (consumer, event_id, topic, "partition", "offset") VALUES ('billing', 'ev-1', 'shop.orders', 0, 1), ('billing', 'ev-2', 'shop.orders', 0, 2), ('ledger', 'ev-1', 'shop.orders', 0, 1)`,
		`INSERT INTO "` + w.table.Schema + `".outbox_inbox_parked (consumer, event_id, topic, "partition", "offset", attempts, error_type, last_error) VALUES ('shipping', 'ev-3', 'shop.orders', 0, 3, 5, 'handler', 'no address')`,
	} {
		if _, err := w.pool.Exec(w.ctx, sql); err != nil {
			t.Fatal(err)
		}
	}

	r := w.run("", false, "status", "--all", "--json")
	w.want(r, exitOK)
	got := decode[struct {
		Outboxes []admin.Status `json:"outboxes"`
		Inboxes  []inboxStatus  `json:"inboxes"`
	}](t, r.stdout)
	found := map[string]admin.Status{}
	for _, st := range got.Outboxes {
		found[st.Table] = st
	}
	if st, ok := found[w.table.WithDefaults().String()]; !ok || st.Parked != 3000 || st.Backlog != 500 {
		t.Errorf("status --all: %s is %+v (found %v), want 3000 parked and 500 waiting", w.table.WithDefaults(), st, ok)
	}
	if st, ok := found[audit.String()]; !ok || st.Backlog != 1 {
		t.Errorf("status --all: %s is %+v (found %v), want 1 waiting", audit, st, ok)
	}
	var in *inboxStatus
	for i := range got.Inboxes {
		if got.Inboxes[i].Table == w.table.Schema+".outbox_inbox" {
			in = &got.Inboxes[i]
		}
	}
	if in == nil || strings.Join(in.Consumers, ",") != "billing,ledger,shipping" || in.Parked != 1 {
		t.Errorf("status --all: inbox %+v, want consumers billing, ledger, shipping and 1 parked", in)
	}
	for _, st := range got.Outboxes {
		if strings.HasSuffix(st.Table, "_parked") || strings.HasSuffix(st.Table, ".outbox_inbox") {
			t.Errorf("status --all took %s for an outbox table", st.Table)
		}
	}

	r = w.run("", false, "status", "--all")
	w.want(r, exitOK, "Table     "+w.table.WithDefaults().String(), "Table     "+audit.String(),
		"Inbox     "+w.table.Schema+".outbox_inbox", "Consumers billing, ledger, shipping", "Parked    1 records")
}
