package rolestest

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/admin"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/migrations"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

const scriptFile = "roles.example.sql"

// roles are a migrator, a writer and a relay role, created for one test.
type roles struct {
	admin                   *pgxpool.Pool
	url                     string
	migrator, writer, relay string
	password                string
}

func newRoles(t *testing.T) *roles {
	t.Helper()
	admin := testenv.Pool(t)
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	r := &roles{
		admin: admin, url: os.Getenv("DATABASE_URL"), password: hex.EncodeToString(b),
		migrator: testenv.Name("outbox_mig_"), writer: testenv.Name("outbox_app_"), relay: testenv.Name("outbox_relay_"),
	}
	ctx := context.Background()
	for _, name := range []string{r.migrator, r.writer, r.relay} {
		if _, err := admin.Exec(ctx, "CREATE ROLE "+ident(name)+" LOGIN PASSWORD "+literal(r.password)); err != nil {
			t.Fatalf("create role: %v", err)
		}
	}
	t.Cleanup(func() {
		ctx := context.Background()
		all := ident(r.migrator) + ", " + ident(r.writer) + ", " + ident(r.relay)
		if _, err := admin.Exec(ctx, "DROP OWNED BY "+all); err != nil {
			t.Errorf("drop owned: %v", err)
		}
		if _, err := admin.Exec(ctx, "DROP ROLE "+all); err != nil {
			t.Errorf("drop roles: %v", err)
		}
	})
	return r
}

// pool connects as role with DATABASE_URL's host, port and database.
func (r *roles) pool(t *testing.T, role string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(r.url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User, cfg.ConnConfig.Password = role, r.password
	cfg.MaxConns = 4
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// schema creates a schema owned by the migrator, applies the migrations as
// the migrator (no superuser, no CREATE on the database), and then grants
// far too much on the outbox objects, as loose defaults or earlier grants
// might have: the script must take it all back.
func (r *roles) schema(t *testing.T, mig *pgxpool.Pool) outbox.Table {
	t.Helper()
	ctx := context.Background()
	tbl := outbox.Table{Schema: testenv.Name("roles_")}
	if _, err := r.admin.Exec(ctx, "CREATE SCHEMA "+ident(tbl.Schema)+" AUTHORIZATION "+ident(r.migrator)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = r.admin.Exec(context.Background(), "DROP SCHEMA "+ident(tbl.Schema)+" CASCADE") })
	if err := migrations.Outbox.Up(ctx, mig, tbl); err != nil {
		t.Fatalf("migrations.Outbox.Up as the migration role: %v", err)
	}
	everyone := "PUBLIC, " + ident(r.writer) + ", " + ident(r.relay)
	for _, sql := range []string{
		"GRANT ALL ON TABLE " + sqlname.Ident(tbl) + " TO " + everyone,
		"GRANT ALL ON SEQUENCE " + seqIdent(tbl) + " TO " + everyone,
		"GRANT ALL ON TABLE " + versionsIdent(tbl) + " TO " + everyone,
		"GRANT UPDATE (payload, topic, headers) ON TABLE " + sqlname.Ident(tbl) + " TO " + ident(r.relay),
		"GRANT ALL ON SCHEMA " + ident(tbl.Schema) + " TO " + everyone,
	} {
		if _, err := r.admin.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	return tbl
}

// apply runs the script as the migrator, the way psql would with
// -v schema=... -v table=... -v writer=... -v relay=...
func (r *roles) apply(t *testing.T, tbl outbox.Table, script string) error {
	t.Helper()
	return r.applyVars(t, tbl, script, nil)
}

// applyVars is apply with more psql variables (-v name=value).
func (r *roles) applyVars(t *testing.T, tbl outbox.Table, script string, more map[string]string) error {
	t.Helper()
	vars := map[string]string{"schema": tbl.Schema, "table": tbl.WithDefaults().Name, "writer": r.writer, "relay": r.relay}
	maps.Copy(vars, more)
	sql, err := render(script, vars)
	if err != nil {
		t.Fatalf("render %s: %v", scriptFile, err)
	}
	cfg, err := pgx.ParseConfig(r.url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.User, cfg.Password = r.migrator, r.password
	ctx := context.Background()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

func readScript(t *testing.T) string {
	t.Helper()
	b, err := fs.ReadFile(migrations.Outbox.FS(), scriptFile)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

var (
	identVar   = regexp.MustCompile(`:"(\w+)"`)
	literalVar = regexp.MustCompile(`:'(\w+)'`)
	bareVar    = regexp.MustCompile(`(^|[^:]):\w`)
)

// render interprets the part of psql the script uses: -- comment lines,
// \set NAME with :var and 'literal' arguments (concatenated, as psql does),
// and :"var" (an identifier) and :'var' (a literal) in SQL. Anything else
// psql would treat specially is an error, so the script stays runnable here.
func render(script string, vars map[string]string) (string, error) {
	vars = maps.Clone(vars)
	var out strings.Builder
	sc := bufio.NewScanner(strings.NewReader(script))
	for sc.Scan() {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case trimmed == "" || strings.HasPrefix(trimmed, "--"):
			continue
		case strings.HasPrefix(trimmed, `\set `):
			f := strings.Fields(trimmed)
			if len(f) < 3 {
				return "", fmt.Errorf("bad \\set: %s", line)
			}
			var v strings.Builder
			for _, a := range f[2:] {
				switch {
				case strings.HasPrefix(a, ":"):
					val, ok := vars[a[1:]]
					if !ok {
						return "", fmt.Errorf("\\set uses undefined :%s", a[1:])
					}
					v.WriteString(val)
				case len(a) >= 2 && a[0] == '\'' && a[len(a)-1] == '\'':
					v.WriteString(a[1 : len(a)-1])
				default:
					v.WriteString(a)
				}
			}
			vars[f[1]] = v.String()
			continue
		case strings.HasPrefix(trimmed, `\`):
			return "", fmt.Errorf("unsupported psql meta-command: %s", line)
		}
		var missing error
		sub := func(re *regexp.Regexp, quote func(string) string) {
			line = re.ReplaceAllStringFunc(line, func(m string) string {
				name := re.FindStringSubmatch(m)[1]
				v, ok := vars[name]
				if !ok {
					missing = fmt.Errorf("undefined variable %s", name)
				}
				return quote(v)
			})
		}
		sub(identVar, ident)
		sub(literalVar, literal)
		if missing != nil {
			return "", missing
		}
		if bareVar.MatchString(line) {
			return "", fmt.Errorf("unquoted psql variable (use :\"name\" or :'name'): %s", line)
		}
		out.WriteString(line + "\n")
	}
	return out.String(), sc.Err()
}

func ident(s string) string   { return pgx.Identifier{s}.Sanitize() }
func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func seqIdent(t outbox.Table) string {
	t = t.WithDefaults()
	return pgx.Identifier{t.Schema, t.Name + "_id_seq"}.Sanitize()
}

func versionsIdent(t outbox.Table) string {
	t = t.WithDefaults()
	return pgx.Identifier{t.Schema, t.Name + "_migrations"}.Sanitize()
}

// violations compares every privilege the writer, the relay and PUBLIC
// hold on the outbox objects (directly or through PUBLIC) with exactly what
// the script should grant, and lists the differences. The columns come from
// the catalog, so a column a later migration adds is checked too.
func (r *roles) violations(t *testing.T, tbl outbox.Table) []string {
	t.Helper()
	ctx := context.Background()
	tbl = tbl.WithDefaults()
	rows, err := r.admin.Query(ctx, "SELECT column_name FROM information_schema.columns WHERE table_schema = $1 AND table_name = $2 ORDER BY ordinal_position", tbl.Schema, tbl.Name)
	if err != nil {
		t.Fatal(err)
	}
	cols, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(cols) < 10 {
		t.Fatalf("columns of %s: %v, %v", tbl, cols, err)
	}
	relayUpdates := []string{"published_at", "attempts", "last_error", "parked_at"}
	// The columns the unit of work inserts; the writer may insert no other.
	writerInserts := []string{"event_id", "aggregate_type", "aggregate_id", "event_type", "payload", "topic", "partition_key", "headers"}
	type check struct {
		what, sql string
		args      []any
		want      bool
	}
	var checks []check
	for _, role := range []string{r.writer, r.relay, "public"} {
		name := role
		if role != "public" {
			name = map[string]string{r.writer: "writer", r.relay: "relay"}[role]
		}
		for _, p := range []string{"SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER"} {
			want := name == "relay" && (p == "SELECT" || p == "DELETE")
			checks = append(checks,
				check{name + " " + p + " on the table", "SELECT has_table_privilege($1, $2, $3)", []any{role, sqlname.Ident(tbl), p}, want},
				check{name + " " + p + " on the versions table", "SELECT has_table_privilege($1, $2, $3)", []any{role, versionsIdent(tbl), p}, false})
		}
		for _, c := range cols {
			for _, p := range []string{"SELECT", "INSERT", "UPDATE", "REFERENCES"} {
				want := (name == "writer" && p == "INSERT" && slices.Contains(writerInserts, c)) ||
					(name == "relay" && (p == "SELECT" || (p == "UPDATE" && slices.Contains(relayUpdates, c))))
				checks = append(checks, check{name + " " + p + " on column " + c, "SELECT has_column_privilege($1, $2, $3, $4)", []any{role, sqlname.Ident(tbl), c, p}, want})
			}
		}
		for _, p := range []string{"USAGE", "SELECT", "UPDATE"} {
			checks = append(checks, check{name + " " + p + " on the id sequence", "SELECT has_sequence_privilege($1, $2, $3)", []any{role, seqIdent(tbl), p}, false})
		}
		checks = append(checks, check{name + " CREATE on the schema", "SELECT has_schema_privilege($1, $2, 'CREATE')", []any{role, tbl.Schema}, false})
		if name != "public" {
			checks = append(checks, check{name + " USAGE on the schema", "SELECT has_schema_privilege($1, $2, 'USAGE')", []any{role, tbl.Schema}, true})
		}
	}
	// Row-level security: on, and exactly these policies, so that the relay
	// deletes only published or parked rows.
	checks = append(checks, check{"row-level security on the table", "SELECT relrowsecurity FROM pg_class WHERE oid = $1::regclass", []any{sqlname.Ident(tbl)}, true})
	wantPolicies := map[string]string{
		"INSERT " + r.writer: "",
		"SELECT " + r.relay:  "true",
		"UPDATE " + r.relay:  "true",
		"DELETE " + r.relay:  "((published_at IS NOT NULL) OR (parked_at IS NOT NULL))",
	}
	prows, err := r.admin.Query(ctx, "SELECT cmd || ' ' || array_to_string(roles, ','), coalesce(qual, '') FROM pg_policies WHERE schemaname = $1 AND tablename = $2", tbl.Schema, tbl.Name)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	var cmdRoles, qual string
	if _, err := pgx.ForEachRow(prows, []any{&cmdRoles, &qual}, func() error { got[cmdRoles] = qual; return nil }); err != nil {
		t.Fatal(err)
	}
	var out []string
	if !maps.Equal(got, wantPolicies) {
		out = append(out, fmt.Sprintf("row-level security policies: have %v, want %v", got, wantPolicies))
	}
	for _, c := range checks {
		var got bool
		if err := r.admin.QueryRow(ctx, c.sql, c.args...).Scan(&got); err != nil {
			t.Fatalf("%s: %v", c.what, err)
		}
		if got != c.want {
			out = append(out, fmt.Sprintf("%s: has %v, want %v", c.what, got, c.want))
		}
	}
	return out
}

// denied asserts that sql, run as the pool's role, fails with SQLSTATE
// 42501 (insufficient_privilege).
func denied(t *testing.T, who string, db interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, sql string, args ...any) {
	t.Helper()
	_, err := db.Exec(context.Background(), sql, args...)
	if code := pgCode(err); code != "42501" {
		t.Errorf("%s ran %q: err = %v, want SQLSTATE 42501", who, sql, err)
	}
}

func pgCode(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// okPublisher acknowledges everything and counts what it saw.
type okPublisher struct {
	mu  sync.Mutex
	ids map[uuid.UUID]int
}

func (p *okPublisher) Publish(_ context.Context, msgs []relay.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ids == nil {
		p.ids = map[uuid.UUID]int{}
	}
	for _, m := range msgs {
		p.ids[m.EventID]++
	}
	return nil
}

func (p *okPublisher) seen(id uuid.UUID) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ids[id] > 0
}

// warnings is a slog handler that keeps Warn and Error records.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	msg := r.Message
	r.Attrs(func(a slog.Attr) bool { msg += " " + a.String(); return true })
	w.msgs = append(w.msgs, msg)
	return nil
}
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *warnings) WithGroup(string) slog.Handler      { return w }
func (w *warnings) all() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.msgs)
}

// The writer and relay roles that roles.example.sql grants can do
// everything the unit of work and the relay do, and are refused (42501)
// everything else that matters.
func TestRolesDoTheirJobsAndNothingMore(t *testing.T) {
	t.Parallel()
	r := newRoles(t)
	ctx := context.Background()
	mig := r.pool(t, r.migrator)
	tbl := r.schema(t, mig)
	if err := r.apply(t, tbl, readScript(t)); err != nil {
		t.Fatalf("%s as the migration role: %v", scriptFile, err)
	}
	if v := r.violations(t, tbl); len(v) > 0 {
		t.Fatalf("privileges differ from the script's intent:\n%s", strings.Join(v, "\n"))
	}
	// The writer's own business table, granted the way the script's
	// comment suggests.
	orders := pgx.Identifier{tbl.Schema, "orders"}.Sanitize()
	if _, err := mig.Exec(ctx, "CREATE TABLE "+orders+" (id text PRIMARY KEY, total int NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	if _, err := mig.Exec(ctx, "GRANT INSERT ON TABLE "+orders+" TO "+ident(r.writer)); err != nil {
		t.Fatal(err)
	}

	writer := r.pool(t, r.writer)
	relayDB := r.pool(t, r.relay)
	notifier, err := unitofwork.NewNotifier(writer, tbl, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer notifier.Close()
	uow, err := unitofwork.New(writer, &unitofwork.Config{Service: "svc", Table: tbl, OnCommit: notifier.OnCommit})
	if err != nil {
		t.Fatal(err)
	}
	order := func(id string, events int) []uuid.UUID {
		t.Helper()
		var ids []uuid.UUID
		err := uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO "+orders+" (id, total) VALUES ($1, 10)", id); err != nil {
				return err
			}
			var evs []outbox.Event
			for i := range events {
				e := outbox.Event{ID: uuid.Must(uuid.NewV7()), AggregateType: "order", AggregateID: fmt.Sprintf("%s-%d", id, i),
					Type: "order.placed.v1", Topic: "orders", Payload: map[string]string{"id": id}, Headers: map[string]string{"tenant": "acme"}}
				ids = append(ids, e.ID)
				evs = append(evs, e)
			}
			return tx.Add(ctx, evs...)
		})
		if err != nil {
			t.Fatalf("writer: unitofwork.Do: %v", err)
		}
		return ids
	}
	state := func(id uuid.UUID) (published, parked bool, attempts int) {
		t.Helper()
		err := r.admin.QueryRow(ctx, "SELECT published_at IS NOT NULL, parked_at IS NOT NULL, attempts FROM "+sqlname.Ident(tbl)+" WHERE event_id = $1", id).
			Scan(&published, &parked, &attempts)
		if err != nil {
			t.Fatalf("event %s: %v", id, err)
		}
		return
	}

	t.Run("writer", func(t *testing.T) {
		order("o-1", 1) // one event: INSERT ... VALUES
		order("o-2", 3) // several: INSERT ... SELECT FROM unnest
		if err := migrations.Outbox.Check(ctx, writer, tbl); err != nil {
			t.Errorf("Outbox.Check (fxoutbox's start without Migrate): %v", err)
		}
		// AddTx in the writer's own transaction: the insert that returns the
		// transaction id and the commit watcher's query need no more rights.
		committed := make(chan int, 1)
		own, err := unitofwork.New(writer, &unitofwork.Config{Service: "svc", Table: tbl, OnCommit: func(n int) { committed <- n }})
		if err != nil {
			t.Fatal(err)
		}
		defer own.Close()
		err = pgx.BeginFunc(ctx, writer, func(tx pgx.Tx) error {
			return own.AddTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "o-3", Type: "order.placed.v1", Topic: "orders"})
		})
		if err != nil {
			t.Errorf("writer: AddTx: %v", err)
		}
		select {
		case <-committed:
		case <-time.After(20 * time.Second):
			t.Error("writer: the AddTx commit watcher never saw the commit")
		}
		if _, err := writer.Exec(ctx, "SELECT pg_notify($1, '')", sqlname.Channel(tbl)); err != nil {
			t.Errorf("NOTIFY: %v", err)
		}
		who := "writer"
		denied(t, who, writer, "SELECT count(*) FROM "+sqlname.Ident(tbl))
		denied(t, who, writer, "UPDATE "+sqlname.Ident(tbl)+" SET published_at = now()")
		denied(t, who, writer, "UPDATE "+sqlname.Ident(tbl)+" SET payload = '{}'")
		denied(t, who, writer, "DELETE FROM "+sqlname.Ident(tbl))
		denied(t, who, writer, "TRUNCATE "+sqlname.Ident(tbl))
		denied(t, who, writer, "INSERT INTO "+sqlname.Ident(tbl)+" (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key)"+
			" VALUES (gen_random_uuid(), 'a', 'b', 'c', '{}', 't', 'k') RETURNING id")
		// Only the event's own columns: no event that looks published,
		// parked, retried or old, and no id of the writer's choosing.
		cols := "event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key"
		vals := "gen_random_uuid(), 'a', 'b', 'c', '{}', 't', 'k'"
		for _, forged := range []struct{ col, val string }{
			{"published_at", "now()"}, {"parked_at", "now()"}, {"attempts", "3"}, {"last_error", "'x'"},
			{"created_at", "now() - interval '1 year'"},
		} {
			denied(t, who, writer, "INSERT INTO "+sqlname.Ident(tbl)+" ("+cols+", "+forged.col+") VALUES ("+vals+", "+forged.val+")")
		}
		denied(t, who, writer, "INSERT INTO "+sqlname.Ident(tbl)+" (id, "+cols+") OVERRIDING SYSTEM VALUE VALUES (1, "+vals+")")
		denied(t, who, writer, "SELECT nextval($1::regclass)", seqIdent(tbl))
		denied(t, who, writer, "SELECT setval($1::regclass, 1)", seqIdent(tbl))
		denied(t, who, writer, "SELECT * FROM "+versionsIdent(tbl))
		denied(t, who, writer, "CREATE TABLE "+pgx.Identifier{tbl.Schema, "evil"}.Sanitize()+" (i int)")
		if err := migrations.Outbox.Up(ctx, writer, tbl); pgCode(err) != "42501" {
			t.Errorf("writer ran migrations.Outbox.Up: err = %v, want SQLSTATE 42501", err)
		}
	})

	t.Run("relay", func(t *testing.T) {
		ok := &okPublisher{}
		for _, ordering := range []relay.Ordering{relay.PerKey, relay.Unordered} {
			ids := order("o-"+ordering.String(), 2)
			rl, err := relay.New(relayDB, ok, &relay.Config{Table: tbl, Ordering: ordering})
			if err != nil {
				t.Fatal(err)
			}
			for {
				n, err := rl.RunOnce(ctx)
				if err != nil {
					t.Fatalf("%v: relay RunOnce: %v", ordering, err)
				}
				if n == 0 {
					break
				}
			}
			for _, id := range ids {
				if pub, _, _ := state(id); !pub || !ok.seen(id) {
					t.Errorf("%v: event %s not published", ordering, id)
				}
			}
		}

		// Permanent failures: attempts counted, then parked; ListParked and
		// Requeue work as the relay role too.
		bad := order("o-bad", 2)
		failing := relay.PublisherFunc(func(_ context.Context, msgs []relay.Message) error {
			failed := map[int]error{}
			for i := range msgs {
				failed[i] = outbox.Permanent(errors.New("kafka server: Message was too large"))
			}
			return &relay.BatchError{Failed: failed}
		})
		// Charged events wait for a paced retry (PollInterval, doubling to
		// MaxBackoff): short here, so the second attempt comes at once.
		rl, err := relay.New(relayDB, failing, &relay.Config{Table: tbl, MaxAttempts: 2, PollInterval: time.Millisecond,
			MaxBackoff: 5 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		parkedBoth := func() bool {
			for _, id := range bad {
				if _, parked, _ := state(id); !parked {
					return false
				}
			}
			return true
		}
		testenv.Eventually(t, 10*time.Second, func() (bool, string) {
			if parkedBoth() {
				return true, ""
			}
			if _, err := rl.RunOnce(ctx); err != nil {
				t.Fatalf("RunOnce with permanent failures: %v", err)
			}
			return false, "the two failing events not yet parked"
		})
		for _, id := range bad {
			if pub, parked, attempts := state(id); pub || !parked || attempts != 2 {
				t.Errorf("failing event %s: published %v, parked %v, attempts %d; want parked after 2", id, pub, parked, attempts)
			}
		}
		parked, err := admin.ListParked(ctx, relayDB, tbl, admin.Filter{Limit: 10})
		if err != nil || len(parked) != 2 || !strings.Contains(parked[0].LastError, "too large") {
			t.Fatalf("ListParked as relay: %+v, %v", parked, err)
		}
		if n, err := admin.Requeue(ctx, relayDB, tbl, admin.Filter{EventIDs: bad}, nil); err != nil || n != 2 {
			t.Fatalf("Requeue as relay: %d, %v", n, err)
		}
		rl, err = relay.New(relayDB, ok, &relay.Config{Table: tbl, Retention: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if n, err := rl.RunOnce(ctx); err != nil || n != 2 {
			t.Fatalf("RunOnce after requeue: %d, %v", n, err)
		}

		// Retention: the relay deletes what it published.
		time.Sleep(20 * time.Millisecond)
		var published int
		if err := r.admin.QueryRow(ctx, "SELECT count(*) FROM "+sqlname.Ident(tbl)+" WHERE published_at IS NOT NULL").Scan(&published); err != nil {
			t.Fatal(err)
		}
		if n, err := rl.Cleanup(ctx); err != nil || n != published || n == 0 {
			t.Fatalf("Cleanup as relay: %d, %v; want %d", n, err, published)
		}

		// Row security: the relay cannot delete an event still waiting to
		// be sent (the statement deletes nothing), only published or parked ones.
		waiting := order("o-waiting", 1)
		if tag, err := relayDB.Exec(ctx, "DELETE FROM "+sqlname.Ident(tbl)+" WHERE published_at IS NULL AND parked_at IS NULL"); err != nil || tag.RowsAffected() != 0 {
			t.Errorf("relay deleted waiting events: %v rows, err %v; want none", tag.RowsAffected(), err)
		}
		if pub, parked, _ := state(waiting[0]); pub || parked {
			t.Errorf("waiting event %s: published %v, parked %v", waiting[0], pub, parked)
		}
		if _, err := relayDB.Exec(ctx, "UPDATE "+sqlname.Ident(tbl)+" SET parked_at = now() WHERE event_id = $1", waiting[0]); err != nil {
			t.Fatal(err)
		}
		if tag, err := relayDB.Exec(ctx, "DELETE FROM "+sqlname.Ident(tbl)+" WHERE event_id = $1", waiting[0]); err != nil || tag.RowsAffected() != 1 {
			t.Errorf("relay deleting a parked event: %v rows, err %v; want 1", tag.RowsAffected(), err)
		}

		who := "relay"
		denied(t, who, relayDB, "INSERT INTO "+sqlname.Ident(tbl)+" (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key)"+
			" VALUES (gen_random_uuid(), 'a', 'b', 'c', '{}', 't', 'k')")
		for _, col := range []string{"payload = '{\"forged\": true}'", "topic = 'elsewhere'", "partition_key = 'k'", "headers = '{}'",
			"event_id = gen_random_uuid()", "event_type = 'x'", "created_at = now()"} {
			denied(t, who, relayDB, "UPDATE "+sqlname.Ident(tbl)+" SET "+col)
		}
		denied(t, who, relayDB, "TRUNCATE "+sqlname.Ident(tbl))
		denied(t, who, relayDB, "SELECT setval($1::regclass, 1)", seqIdent(tbl))
		denied(t, who, relayDB, "SELECT * FROM "+versionsIdent(tbl))
		denied(t, who, relayDB, "SELECT * FROM "+orders)
		denied(t, who, relayDB, "CREATE TABLE "+pgx.Identifier{tbl.Schema, "evil"}.Sanitize()+" (i int)")
	})

	t.Run("listen", func(t *testing.T) {
		// The relay LISTENs as its role and wakes on the writer's NOTIFY:
		// with an hour-long poll interval, nothing else publishes in time.
		ok := &okPublisher{}
		logs := &warnings{}
		rl, err := relay.New(relayDB, ok, &relay.Config{Table: tbl, Listen: true, PollInterval: time.Hour, Retention: -1, Logger: slog.New(logs)})
		if err != nil {
			t.Fatal(err)
		}
		if err := rl.Start(ctx); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := rl.Stop(ctx); err != nil {
				t.Error(err)
			}
		}()
		testenv.Eventually(t, 10*time.Second, func() (bool, string) {
			var n int
			err := r.admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE usename = $1 AND state = 'idle' AND query LIKE 'LISTEN %'", r.relay).Scan(&n)
			return err == nil && n == 1, fmt.Sprintf("%d idle sessions of the relay role after LISTEN, want 1 (%v)", n, err)
		})
		time.Sleep(200 * time.Millisecond) // the wake-up after LISTEN has run
		ids := order("o-listen", 1)
		testenv.Eventually(t, 10*time.Second, testenv.Cond("the event published after NOTIFY", func() bool { return ok.seen(ids[0]) }))
		if w := logs.all(); len(w) > 0 {
			t.Errorf("relay warned: %q", w)
		}
	})
}

// Each REVOKE in the script is load-bearing, and no GRANT is wider than the
// checks allow: applied without one of its REVOKEs, or with a GRANT
// widened, the script leaves privileges that TestRolesDoTheirJobsAndNothingMore
// would find. (Against the loose starting grants of roles.schema.)
func TestRolesScriptGuardsAreLoadBearing(t *testing.T) {
	t.Parallel()
	r := newRoles(t)
	mig := r.pool(t, r.migrator)
	script := readScript(t)
	type mutation struct{ name, from, to string }
	var muts []mutation
	for _, line := range strings.Split(script, "\n") {
		if strings.HasPrefix(line, "REVOKE ") {
			muts = append(muts, mutation{"without " + line, line, ""})
		}
	}
	if len(muts) != 5 {
		t.Fatalf("found %d REVOKE statements, want 5: update this test with the script", len(muts))
	}
	muts = append(muts,
		mutation{"writer INSERT on every column", "GRANT INSERT (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, headers)\n    ON TABLE", `GRANT INSERT ON TABLE`},
		mutation{"writer INSERT of published_at", `GRANT INSERT (event_id,`, `GRANT INSERT (published_at, event_id,`},
		mutation{"writer also SELECT", "headers)\n    ON TABLE :\"schema\".:\"table\" TO :\"writer\";", "headers)\n    ON TABLE :\"schema\".:\"table\" TO :\"writer\"; GRANT SELECT ON TABLE :\"schema\".:\"table\" TO :\"writer\";"},
		mutation{"without row-level security", `ALTER TABLE :"schema".:"table" ENABLE ROW LEVEL SECURITY;`, ""},
		mutation{"relay deletes any row", `USING (published_at IS NOT NULL OR parked_at IS NOT NULL)`, `USING (true)`},
		mutation{"relay UPDATE on the whole table", `GRANT UPDATE (published_at, attempts, last_error, parked_at) ON TABLE`, `GRANT UPDATE ON TABLE`},
		mutation{"relay UPDATE of payload", `GRANT UPDATE (published_at,`, `GRANT UPDATE (payload, published_at,`},
		mutation{"relay also INSERT", `GRANT SELECT, DELETE ON TABLE`, `GRANT SELECT, INSERT, DELETE ON TABLE`},
		mutation{"relay TRUNCATE", `GRANT SELECT, DELETE ON TABLE`, `GRANT SELECT, DELETE, TRUNCATE ON TABLE`},
		mutation{"CREATE on the schema", `GRANT USAGE ON SCHEMA`, `GRANT USAGE, CREATE ON SCHEMA`},
	)
	for _, m := range muts {
		mutated := strings.Replace(script, m.from, m.to, 1)
		if mutated == script {
			t.Fatalf("%s: %q not found in the script", m.name, m.from)
		}
		tbl := r.schema(t, mig)
		if err := r.apply(t, tbl, mutated); err != nil {
			t.Fatalf("%s: apply: %v", m.name, err)
		}
		if v := r.violations(t, tbl); len(v) == 0 {
			t.Errorf("%s: no check noticed", m.name)
		} else {
			t.Logf("%s: caught: %s", m.name, v[0])
		}
	}
}
