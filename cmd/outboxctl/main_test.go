package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/locks"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/outboxconfig"
	"github.com/fxoutbox/outbox/relay"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type world struct {
	t     *testing.T
	ctx   context.Context
	pool  *pgxpool.Pool
	table outbox.Table
}

func newWorld(t *testing.T) *world {
	pool := testenv.Pool(t)
	return &world{t: t, ctx: context.Background(), pool: pool, table: testenv.Table(t, pool)}
}

func (w *world) exec(sql string, args ...any) {
	w.t.Helper()
	if _, err := w.pool.Exec(w.ctx, strings.ReplaceAll(sql, "$T", sqlname.Ident(w.table)), args...); err != nil {
		w.t.Fatal(err)
	}
}

func (w *world) count(where string) int {
	w.t.Helper()
	var n int
	if err := w.pool.QueryRow(w.ctx, "SELECT count(*) FROM "+sqlname.Ident(w.table)+" WHERE "+where).Scan(&n); err != nil {
		w.t.Fatal(err)
	}
	return n
}

// seed writes thousands of rows: 2000 published, 500 waiting, 3000 parked
// over two topics and two reasons.
func (w *world) seed() {
	w.exec("INSERT INTO $T (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, headers, created_at, published_at, parked_at, last_error, attempts)" +
		" SELECT gen_random_uuid(), 'Order', 'o-' || (g % 100), 'order.created.v1', jsonb_build_object('total', g), " +
		" CASE WHEN g % 3 = 0 THEN 'shop.payment.paid' ELSE 'shop.order.created' END, 'o-' || (g % 100)," +
		` '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}', now() - interval '1 hour' + g * interval '100 ms',` +
		" CASE WHEN g <= 2000 THEN now() - interval '30 min' END, CASE WHEN g > 2500 THEN now() - interval '5 min' END," +
		" CASE WHEN g > 2500 THEN CASE WHEN g % 2 = 0 THEN 'cannot be sent: message of ' || (1000000 + g) || ' bytes exceeds MaxMessageBytes 1000000'" +
		" ELSE 'kafka server: invalid topic' END END, CASE WHEN g > 2500 THEN 5 ELSE 0 END" +
		" FROM generate_series(1, 5500) g")
}

// run runs the command in-process against the world's table.
type result struct {
	code           int
	stdout, stderr string
}

func (w *world) run(stdin string, interactive bool, args ...string) result {
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
	})
	return result{code, out.String(), errb.String()}
}

func (w *world) want(r result, code int, in ...string) {
	w.t.Helper()
	if r.code != code {
		w.t.Fatalf("exit code %d, want %d\nstdout: %s\nstderr: %s", r.code, code, r.stdout, r.stderr)
	}
	for _, s := range in {
		if !strings.Contains(r.stdout+r.stderr, s) {
			w.t.Fatalf("output lacks %q\nstdout: %s\nstderr: %s", s, r.stdout, r.stderr)
		}
	}
}

func decode[T any](t *testing.T, s string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, s)
	}
	return v
}

// parked show always has a headers section: the headers, one a line, or
// "(none)" for an event stored without any (NULL or an empty object).
func TestParkedShowHeadersSection(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.exec("INSERT INTO $T (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, headers, parked_at, last_error, attempts)" +
		" VALUES ('00000000-0000-7000-8000-000000000001', 'Order', 'o-1', 'order.created.v1', '{}', 'shop.order.created', 'o-1', NULL, now(), 'x', 5)," +
		" ('00000000-0000-7000-8000-000000000002', 'Order', 'o-2', 'order.created.v1', '{}', 'shop.order.created', 'o-2', '{}', now(), 'x', 5)," +
		` ('00000000-0000-7000-8000-000000000003', 'Order', 'o-3', 'order.created.v1', '{}', 'shop.order.created', 'o-3', '{"tenant": "t-9", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}', now(), 'x', 5)`)
	for _, id := range []string{"00000000-0000-7000-8000-000000000001", "00000000-0000-7000-8000-000000000002"} {
		r := w.run("", false, "parked", "show", id)
		w.want(r, exitOK, "\nHeaders: (none)\nPayload (2 bytes):")
	}
	r := w.run("", false, "parked", "show", "00000000-0000-7000-8000-000000000003")
	w.want(r, exitOK, "\nHeaders:\n  tenant: t-9\n  traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\nPayload (2 bytes):")
	if strings.Contains(r.stdout, "(none)") {
		t.Fatalf("an event with headers shown as having none:\n%s", r.stdout)
	}
}

// An operator's session on a table with thousands of published, waiting
// and parked events: status, list with filters and pages, show with the
// payload, requeue and delete with and without confirmation, --json parsed
// back, and the exit codes.
func TestOperateParkedEvents(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.seed()

	r := w.run("", false, "status")
	w.want(r, exitOK, "Backlog   500 events waiting", "Parked    3,000 events", "shop.order.created", "message of N bytes exceeds MaxMessageBytes N", "0 of 64 held")
	st := decode[map[string]any](t, w.run("", false, "status", "--json").stdout)
	if st["parked"] != 3000.0 || st["backlog"] != 500.0 || len(st["parked_groups"].([]any)) != 4 {
		t.Fatalf("status --json: %v", st)
	}

	// List, filtered and paged.
	type page struct {
		Events []struct {
			ID        int64  `json:"id"`
			EventID   string `json:"event_id"`
			Topic     string `json:"topic"`
			LastError string `json:"last_error"`
		} `json:"events"`
		NextAfter int64 `json:"next_after"`
	}
	seen := 0
	args := []string{"parked", "list", "--topic", "shop.payment.paid", "--error", "maxMESSAGEbytes", "--limit", "200", "--json"}
	for after := "0"; ; {
		r := w.run("", false, append(args, "--after", after)...)
		if r.code == exitNoMatch {
			break
		}
		w.want(r, exitOK)
		p := decode[page](t, r.stdout)
		for _, e := range p.Events {
			if e.Topic != "shop.payment.paid" || !strings.Contains(e.LastError, "MaxMessageBytes") {
				t.Fatalf("listed %+v", e)
			}
		}
		seen += len(p.Events)
		if p.NextAfter == 0 {
			break
		}
		after = jsonNumber(p.NextAfter)
	}
	// g > 2500, g % 3 = 0, g % 2 = 0: 500 events.
	if seen != 500 {
		t.Fatalf("paged through %d events, want 500", seen)
	}
	r = w.run("", false, "parked", "list", "--limit", "3")
	w.want(r, exitOK, "EVENT ID", "more may follow: add --after")
	w.want(w.run("", false, "parked", "list", "--key", "no-such-key"), exitNoMatch, "no parked events match")

	// Show one, with payload and headers.
	first := decode[page](t, w.run("", false, "parked", "list", "--limit", "1", "--json").stdout).Events[0]
	r = w.run("", false, "parked", "show", first.EventID)
	w.want(r, exitOK, "Payload (", `"total": 2501`, "traceparent: 00-0af7", "outboxctl parked requeue "+first.EventID)
	shown := decode[map[string]any](t, w.run("", false, "parked", "show", first.EventID, "--json").stdout)
	if shown["payload"].(map[string]any)["total"] != 2501.0 || shown["event_id"] != first.EventID {
		t.Fatalf("show --json: %v", shown)
	}

	// Requeue one: refused without a terminal or --yes, not done when the
	// answer is no, done when it is yes.
	w.want(w.run("", false, "parked", "requeue", first.EventID), exitNotConfirmed, "pass --yes")
	w.want(w.run("n\n", true, "parked", "requeue", first.EventID), exitNotConfirmed, "Requeue 1 parked event of", "nothing changed")
	w.want(w.run("", true, "parked", "requeue", first.EventID), exitNotConfirmed) // EOF is no
	if w.count("parked_at IS NOT NULL") != 3000 {
		t.Fatal("an unconfirmed requeue changed rows")
	}
	w.want(w.run("yes\n", true, "parked", "requeue", first.EventID), exitOK, "requeued 1 parked event\n")
	w.want(w.run("", false, "parked", "show", first.EventID), exitNoMatch, "waiting to be published")
	w.want(w.run("", false, "parked", "requeue", first.EventID, "--yes"), exitNoMatch, "no parked events match")

	// Requeue by filter, in chunks, with the progress line and JSON.
	r = w.run("", false, "parked", "requeue", "--topic", "shop.payment.paid", "--yes", "--json", "--progress", "--chunk", "100")
	w.want(r, exitOK, "requeued 1,000/1,000 100%")
	if res := decode[map[string]int](t, r.stdout); res["matched"] != 1000 || res["requeued"] != 1000 {
		t.Fatalf("requeue --json: %v", res)
	}
	if n := w.count("topic = 'shop.payment.paid' AND parked_at IS NULL AND published_at IS NULL AND attempts = 0 AND id > (SELECT min(id) + 2499 FROM " + sqlname.Ident(w.table) + ")"); n != 1000 {
		t.Fatalf("%d payment events requeued, want 1000", n)
	}

	// Delete: needs a filter or --all.
	w.want(w.run("", false, "parked", "delete", "--yes"), exitUsage, "pass --all")
	w.want(w.run("", false, "parked", "delete", "not-a-uuid", "--yes"), exitUsage, `"not-a-uuid" is not an event id`)
	r = w.run("", false, "parked", "delete", "--error", "invalid topic", "--yes")
	w.want(r, exitOK, "deleted 999 parked events") // odd g, not a payment, not the one requeued
	r = w.run("", false, "parked", "delete", "--all", "--yes", "--json")
	if res := decode[map[string]int](t, r.stdout); r.code != exitOK || res["deleted"] != 1000 {
		t.Fatalf("delete --all: %d %v %s", r.code, res, r.stderr)
	}
	// Waiting and published rows untouched: 500 + 1001 requeued, 2000.
	if wt, pub := w.count("published_at IS NULL AND parked_at IS NULL"), w.count("published_at IS NOT NULL"); wt != 1501 || pub != 2000 {
		t.Fatalf("%d waiting, %d published; want 1501, 2000", wt, pub)
	}

	// Usage errors.
	w.want(w.run("", false), exitUsage, "Usage:")
	w.want(w.run("", false, "parked"), exitUsage, "list, show, requeue or delete")
	w.want(w.run("", false, "parked", "show"), exitUsage, "name one event id")
	w.want(w.run("", false, "status", "extra"), exitUsage, "takes no arguments")
	w.want(w.run("", false, "replay", "--yes"), exitUsage, "pass --all")
	w.want(w.run("", false, "parked", "list", "--since", "last tuesday"), exitUsage, "--since")
	w.want(w.run("", false, "help"), exitOK, "Exit codes:")
	w.want(w.run("", false, "parked", "requeue", "--help"), exitOK, "-topic")
}

func jsonNumber(n int64) string { b, _ := json.Marshal(n); return string(b) }

// recorder is a relay publisher that keeps what it is given.
type recorder struct {
	mu   sync.Mutex
	msgs []relay.Message
}

func (r *recorder) Publish(_ context.Context, msgs []relay.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, msgs...)
	return nil
}

func (r *recorder) take() []relay.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.msgs
	r.msgs = nil
	return m
}

// outboxctl replay resets published events of one key in a time range;
// the relay then publishes exactly those again, in their original order.
func TestReplayThenTheRelayPublishesAgain(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.exec("INSERT INTO $T (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, created_at)" +
		" SELECT gen_random_uuid(), 'Order', 'o-' || (g % 10), 'order.created.v1', jsonb_build_object('seq', g), 'shop.orders', 'o-' || (g % 10)," +
		" now() - interval '3 hours' + g * interval '1 s' FROM generate_series(1, 3000) g")
	rec := &recorder{}
	r, err := relay.New(w.pool, rec, &relay.Config{Table: w.table, Retention: -1})
	if err != nil {
		t.Fatal(err)
	}
	drain := func() {
		for {
			n, err := r.RunOnce(w.ctx)
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				return
			}
		}
	}
	drain()
	firsts := rec.take()
	if len(firsts) != 3000 {
		t.Fatalf("published %d, want 3000", len(firsts))
	}
	// Event seq g was written 3h - g seconds ago: the range selects seq
	// 1001 to 2000, the key o-3 those with seq % 10 = 3. "Ago" is from the
	// INSERT's now(), on the server's clock: the drain before this line
	// takes seconds on a loaded machine.
	var now time.Time
	if err := w.pool.QueryRow(w.ctx, "SELECT min(created_at) + interval '3 hours' - interval '1 s' FROM "+sqlname.Ident(w.table)).Scan(&now); err != nil {
		t.Fatal(err)
	}
	since := now.Add(-3*time.Hour + 1000*time.Second - 500*time.Millisecond).UTC().Format(time.RFC3339Nano)
	until := now.Add(-3*time.Hour + 2000*time.Second + 500*time.Millisecond).UTC().Format(time.RFC3339Nano)
	res := w.run("", false, "replay", "--key", "o-3", "--since", since, "--until", until, "--yes", "--json", "--chunk", "7")
	w.want(res, exitOK)
	if out := decode[map[string]int](t, res.stdout); out["matched"] != 100 || out["replayed"] != 100 {
		t.Fatalf("replay --json: %v", out)
	}
	drain()
	again := rec.take()
	var want []string
	for _, m := range firsts {
		var p struct{ Seq int }
		_ = json.Unmarshal(m.Value, &p)
		if string(m.Key) == "o-3" && p.Seq >= 1001 && p.Seq <= 2000 {
			want = append(want, m.EventID.String())
		}
	}
	var got []string
	for _, m := range again {
		got = append(got, m.EventID.String())
	}
	if len(want) != 100 || strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("published again %d events, want the %d replayed in their order", len(got), len(want))
	}
	// Nothing left to replay in a range with no published events.
	w.want(w.run("", false, "replay", "--key", "o-3", "--since", "1m", "--yes"), exitNoMatch, "no published events match")
}

// The built command, as an operator runs it: configured by DATABASE_URL and
// OUTBOX_SCHEMA from the environment, no terminal, so changes need --yes;
// errors say what to do and exit with the documented codes.
func TestBuiltCommand(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.seed()
	bin := filepath.Join(t.TempDir(), "outboxctl")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := func(env []string, args ...string) result {
		t.Helper()
		c := exec.Command(bin, args...)
		c.Env = append([]string{"PATH=" + os.Getenv("PATH"), "DATABASE_URL=" + os.Getenv("DATABASE_URL"), "OUTBOX_SCHEMA=" + w.table.Schema}, env...)
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
	w.want(cmd(nil, "status"), exitOK, w.table.Schema+".outbox_event", "3,000 events")
	w.want(cmd([]string{"OUTBOX_LANES=16"}, "status"), exitOK, "0 of 16 held")
	w.want(cmd(nil, "parked", "requeue", "--all"), exitNotConfirmed, "refusing to requeue 3,000 parked events", "pass --yes")
	w.want(cmd(nil, "parked", "requeue", "--all", "--yes"), exitOK, "requeued 3,000 parked events")
	w.want(cmd(nil, "parked", "list"), exitNoMatch)
	w.want(cmd([]string{"OUTBOX_SCHEMA=no_such_schema"}, "status"), exitError, "does not exist", "run the migrations")
	w.want(cmd([]string{"OUTBOX_LANES=many"}, "status"), exitUsage, "OUTBOX_LANES")
	w.want(cmd([]string{"DATABASE_URL="}, "status"), exitUsage, "DATABASE_URL is not set")
	w.want(cmd([]string{"DATABASE_URL=postgres://u:hunter2@127.0.0.1:1/x?connect_timeout=5"}, "status"), exitError, "cannot connect")
	if r := cmd([]string{"DATABASE_URL=postgres://u:hunter2@127.0.0.1:1/x?connect_timeout=5"}, "status"); strings.Contains(r.stderr, "hunter2") {
		t.Errorf("the password shows in: %s", r.stderr)
	}
	w.want(cmd(nil, "version"), exitOK, "outboxctl")
}

// A lane held as a relay's batch holds it (a transaction-scoped advisory
// lock in the table's namespace), by a session with an application_name:
// status names the lanes, the session and how long it has held them.
func TestStatusShowsLaneHolders(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	cfg := w.pool.Config().Copy()
	cfg.ConnConfig.RuntimeParams["application_name"] = "orders-relay-1"
	pool, err := pgxpool.NewWithConfig(w.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	tx, err := pool.Begin(w.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(w.ctx)
	if _, err := tx.Exec(w.ctx, "SELECT pg_try_advisory_xact_lock($1, l) FROM unnest(array[7, 8, 9, 20]) l", locks.Namespace(w.table.String())); err != nil {
		t.Fatal(err)
	}
	r := w.run("", false, "status")
	w.want(r, exitOK, "4 of 64 held now", "orders-relay-1", "7-9,20 (", "idle in transaction")
	st := decode[map[string]any](t, w.run("", false, "status", "--json").stdout)
	if held := st["lanes_held"].([]any); len(held) != 4 || held[0].(map[string]any)["lane"] != 7.0 {
		t.Fatalf("lanes_held %v", held)
	}
}

func TestFormats(t *testing.T) {
	now := time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"2026-12-01T10:00:00Z":      time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC),
		"2026-12-01T10:00:00+01:00": time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC),
		"2026-12-01":                time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC),
		"90m":                       now.Add(-90 * time.Minute),
		"3d":                        now.Add(-72 * time.Hour),
		"":                          {},
	} {
		if got, err := parseTime(in, now); err != nil || !got.Equal(want) {
			t.Errorf("parseTime(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"yesterday", "-5m", "12/01/2026"} {
		if _, err := parseTime(bad, now); err == nil {
			t.Errorf("parseTime(%q) accepted", bad)
		}
	}
	if got := printable("a\x1b[31mred\nline", 100); got != `"a\x1b[31mred\nline"` {
		t.Errorf("control bytes: %s", got)
	}
	if got := printable(strings.Repeat("x", 50), 10); got != "xxxxxxxxx…" {
		t.Errorf("cut: %s", got)
	}
	if got := laneList([]int{1, 2, 3, 5, 7, 8}); got != "1-3,5,7-8" {
		t.Errorf("laneList: %s", got)
	}
	if got := thousands(1234567); got != "1,234,567" {
		t.Errorf("thousands: %s", got)
	}
	p := newProgress(io.Discard, "requeued", 1000, false)
	p.start = now
	if got := p.line(250, now.Add(time.Second)); got != "requeued 250/1,000  25%  250/s  ETA 3s" {
		t.Errorf("progress line: %q", got)
	}
}

// cancelOnWrite cancels a context on the first write (the progress line
// after the first chunk), as Ctrl-C would.
type cancelOnWrite struct {
	bytes.Buffer
	cancel context.CancelFunc
}

func (c *cancelOnWrite) Write(p []byte) (int, error) {
	c.cancel()
	return c.Buffer.Write(p)
}

// Interrupted after its first chunk, a requeue keeps that chunk, says so,
// and exits 1; run again, it does the rest.
func TestInterruptedRequeueKeepsWhatItDid(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.seed()
	ctx, cancel := context.WithCancel(w.ctx)
	defer cancel()
	var out bytes.Buffer
	errw := &cancelOnWrite{cancel: cancel}
	code := run(ctx, []string{"parked", "requeue", "--all", "--yes", "--chunk", "100"}, env{
		stdin: strings.NewReader(""), stdout: &out, stderr: errw, progress: true,
		getenv: os.Getenv, config: func() (outboxconfig.Config, error) { return outboxconfig.Config{Table: w.table}, nil },
	})
	if code != exitError || !strings.Contains(errw.String(), "interrupted after 100 of 3,000 parked events") || !strings.Contains(errw.String(), "run the same command again") {
		t.Fatalf("exit %d, stderr: %s", code, errw.String())
	}
	if n := w.count("parked_at IS NOT NULL"); n != 2900 {
		t.Fatalf("%d still parked, want 2900", n)
	}
	w.want(w.run("", false, "parked", "requeue", "--all", "--yes"), exitOK, "requeued 2,900 parked events")
}
