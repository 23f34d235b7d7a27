package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox"
)

// relayApp is the application_name of the relay processes' pools in the
// wal section; the stream's walsender is named fxoutbox-relay by the relay.
const relayApp = "fxbench-relay"

// Wal is the "wal" section: the streaming relay (relay.Stream) against the
// polling relay at fxoutbox's defaults, measured side by side in one run
// on a PostgreSQL cluster of the section's own, and the cost of
// wal_level=logical against replica on two clusters that differ only in
// it.
type Wal struct {
	Command      string `json:"command"`
	StartedAt    string `json:"started_at"`
	LoadAvgStart string `json:"loadavg_start"`
	LoadAvgEnd   string `json:"loadavg_end"`
	Note         string `json:"note"`

	// Commit-to-consumer latency at LatRate events/s, one event per
	// transaction, writers in a process of their own (medians of rounds).
	LatRate         int     `json:"latency_rate_eps"`
	LatencyP50      float64 `json:"latency_p50_ms"`
	LatencyP99      float64 `json:"latency_p99_ms"`
	LatencyP999     float64 `json:"latency_p999_ms"`
	PollLatencyP50  float64 `json:"poll_latency_p50_ms"`
	PollLatencyP99  float64 `json:"poll_latency_p99_ms"`
	PollLatencyP999 float64 `json:"poll_latency_p999_ms"`

	// The highest write rate (events/s achieved by the writers) whose step
	// the relay followed with the oldest unpublished row never a second
	// old; WriterBound: the writers could not offer more, so the figure is
	// a lower bound of the relay's.
	MaxRateEPS         float64 `json:"max_rate_eps"`
	PollMaxRateEPS     float64 `json:"poll_max_rate_eps"`
	MaxRateVsPoll      float64 `json:"max_rate_vs_poll"`
	MaxRateWriterBound bool    `json:"max_rate_writer_bound,omitempty"`
	// KeptUp: the highest rate at which the events waiting unpublished
	// stayed under one second of writes (throughput, ignoring a few late
	// events), and the ratio.
	KeptUpEPS           float64 `json:"kept_up_rate_eps"`
	PollKeptUpEPS       float64 `json:"poll_kept_up_rate_eps"`
	KeptUpVsPoll        float64 `json:"kept_up_rate_vs_poll"`
	PollMaxRateWriterBd bool    `json:"poll_max_rate_writer_bound,omitempty"`

	// CPU of the PostgreSQL backends serving the relay (its pool and, when
	// streaming, its walsender) per published event at PGCPURate events/s
	// (the latency runs), and of the writers' backends, reported apart.
	PGCPURate          int     `json:"pg_cpu_rate_eps"`
	PGUsPerEvent       float64 `json:"pg_us_per_event"`
	PollPGUsPerEvent   float64 `json:"poll_pg_us_per_event"`
	PGCPUVsPoll        float64 `json:"pg_cpu_vs_poll"`
	WalsenderUsPerEvt  float64 `json:"walsender_us_per_event"`
	WriterPGUsPerEvent float64 `json:"writer_pg_us_per_event"`
	// The same at 8k events/s in transactions of 10 events (the max-rate
	// step), median over rounds.
	PGUsPerEvent8k     float64 `json:"pg_us_per_event_8k"`
	PollPGUsPerEvent8k float64 `json:"poll_pg_us_per_event_8k"`
	PGCPUVsPoll8k      float64 `json:"pg_cpu_vs_poll_8k"`
	PollWriterPGUs     float64 `json:"poll_writer_pg_us_per_event"`

	// WAL written per event (pg_current_wal_lsn before the writes and after
	// the relay marked the last event; the writers' inserts and commits,
	// the relay's marks), at PGCPURate events/s.
	WalBytesPerEvent     float64 `json:"wal_bytes_per_event"`
	PollWalBytesPerEvent float64 `json:"poll_wal_bytes_per_event"`

	// wal_level=logical against replica: the writers' throughput (16
	// writers, one event per transaction, as fast as they can) and the
	// polling relay's drain of a backlog (defaults), logical/replica,
	// median of the rounds' ratios.
	LevelCostWriteRatio float64 `json:"level_cost_write_ratio"`
	LevelCostDrainRatio float64 `json:"level_cost_drain_ratio"`
	LevelCostWalRatio   float64 `json:"level_cost_write_wal_bytes_ratio"`

	Latency []WalLatRun   `json:"latency_rounds"`
	MaxRate []WalMaxRun   `json:"max_rate_rounds"`
	Level   []WalLevelRun `json:"level_rounds"`
	Profile string        `json:"relay_profiles,omitempty"`
}

// WalLatRun is one latency round of one relay.
type WalLatRun struct {
	Mode             string  `json:"mode"`
	Rate             int     `json:"offered_eps"`
	Achieved         float64 `json:"achieved_eps"`
	Events           int     `json:"events"`
	Missing          int     `json:"missing"`
	P50              float64 `json:"p50_ms"`
	P99              float64 `json:"p99_ms"`
	P999             float64 `json:"p999_ms"`
	Max              float64 `json:"max_ms"`
	RelayPGUs        float64 `json:"relay_pg_us_per_event"`
	WalsenderPGUs    float64 `json:"walsender_pg_us_per_event,omitempty"`
	WriterPGUs       float64 `json:"writer_pg_us_per_event"`
	WalBytesPerEvent float64 `json:"wal_bytes_per_event"`
	// EventsPerBatch is the events the relay published per Publish call;
	// RelayPGUsPerBatch the relay's PostgreSQL CPU per call.
	EventsPerBatch    float64 `json:"events_per_batch"`
	RelayPGUsPerBatch float64 `json:"relay_pg_us_per_batch"`
	// Statements: with BENCH_WAL_STATEMENTS, the statements that took the
	// most time during the run (pg_stat_statements).
	Statements []WalStatement `json:"statements,omitempty"`
}

// WalStatement is one line of pg_stat_statements.
type WalStatement struct {
	Query   string  `json:"query"`
	Calls   int64   `json:"calls"`
	TotalMS float64 `json:"total_ms"`
	MeanUs  float64 `json:"mean_us"`
	Rows    int64   `json:"rows"`
	// WalBytes is the WAL the statement wrote (pg_stat_statements.wal_bytes).
	WalBytes int64 `json:"wal_bytes"`
	// Plans and MeanPlanUs: how often the statement was planned, and the
	// mean planning time (pg_stat_statements.track_planning): a prepared
	// statement that is planned at each call pays this each time.
	Plans      int64   `json:"plans"`
	MeanPlanUs float64 `json:"mean_plan_us"`
}

// statements returns the statements that took the most time since the
// last reset, and resets.
func (c *walCluster) statements(ctx context.Context) []WalStatement {
	if !c.e.p.walStatements {
		return nil
	}
	rows, err := c.e.pool.Query(ctx, `SELECT left(regexp_replace(query, '\s+', ' ', 'g'), 160), calls, total_exec_time, mean_exec_time * 1000, rows, wal_bytes::bigint, plans, mean_plan_time * 1000
		FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT 14`)
	if err != nil {
		log.Printf("pg_stat_statements: %v", err)
		return nil
	}
	var out []WalStatement
	for rows.Next() {
		var s WalStatement
		if rows.Scan(&s.Query, &s.Calls, &s.TotalMS, &s.MeanUs, &s.Rows, &s.WalBytes, &s.Plans, &s.MeanPlanUs) == nil {
			s.TotalMS, s.MeanUs, s.MeanPlanUs = round1(s.TotalMS), round1(s.MeanUs), round1(s.MeanPlanUs)
			out = append(out, s)
		}
	}
	rows.Close()
	c.resetStatements(ctx)
	return out
}

// sampleWaits counts the states and wait events of the relay's backends.
func (c *walCluster) sampleWaits(ctx context.Context, into *sync.Map) {
	rows, err := c.e.pool.Query(ctx, `SELECT backend_type || ':' || state || ':' || coalesce(wait_event_type || '/' || wait_event, 'cpu') FROM pg_stat_activity
		WHERE application_name = $1 OR (backend_type = 'walsender' AND application_name = 'fxoutbox-relay')`, relayApp)
	if err != nil {
		return
	}
	defer rows.Close()
	for rows.Next() {
		var k string
		if rows.Scan(&k) == nil {
			v, _ := into.LoadOrStore(k, &atomic.Int64{})
			v.(*atomic.Int64).Add(1)
		}
	}
}

func (c *walCluster) resetStatements(ctx context.Context) {
	if c.e.p.walStatements {
		_, _ = c.e.pool.Exec(ctx, "SELECT pg_stat_statements_reset()")
	}
}

// WalStep is one offered rate of a max-rate run.
type WalStep struct {
	Rate     int     `json:"offered_eps"`
	Achieved float64 `json:"achieved_eps"`
	MaxLagS  float64 `json:"max_lag_s"`
	Followed bool    `json:"followed"`
	// MaxBacklog is the most events waiting unpublished during the step;
	// KeptUp: always under one second of the offered rate.
	MaxBacklog       int     `json:"max_backlog"`
	KeptUp           bool    `json:"kept_up"`
	WritersShort     bool    `json:"writers_short,omitempty"`
	RelayPGUs        float64 `json:"relay_pg_us_per_event"`
	WalBytesPerEvent float64 `json:"wal_bytes_per_event"`
	// Statements: with BENCH_WAL_STATEMENTS, as in WalLatRun.
	Statements []WalStatement `json:"statements,omitempty"`
}

// WalMaxRun is one relay's steps in one round.
type WalMaxRun struct {
	Mode        string    `json:"mode"`
	MaxRate     float64   `json:"max_rate_eps"`
	KeptUpRate  float64   `json:"kept_up_rate_eps"`
	WriterBound bool      `json:"writer_bound,omitempty"`
	Steps       []WalStep `json:"steps"`
}

// WalLevelRun is one cluster's figures in one round of the wal_level cost.
type WalLevelRun struct {
	Level             string  `json:"wal_level"`
	WriteEPS          float64 `json:"write_eps"`
	WriteWalBytes     float64 `json:"write_wal_bytes_per_event"`
	DrainEPS          float64 `json:"poll_drain_eps"`
	DrainWalBytes     float64 `json:"poll_drain_wal_bytes_per_event"`
	DrainPGUsPerEvent float64 `json:"poll_drain_pg_us_per_event"`
}

// walParams sizes the section.
type walParams struct {
	latRounds, maxRounds, levelRounds int
	latDur, stepDur, levelWrite       time.Duration
	steps                             []int
	perTx, writers, drainN            int
}

func (p params) wal() walParams {
	w := walParams{latRounds: 3, maxRounds: 2, levelRounds: 3, latDur: 10 * time.Second, stepDur: 4 * time.Second,
		levelWrite: 4 * time.Second, steps: []int{2000, 4000, 8000, 12000, 16000, 20000, 24000, 28000, 32000, 40000, 48000},
		perTx: 10, writers: 16, drainN: 50_000}
	if p.Quick {
		w = walParams{latRounds: 1, maxRounds: 1, levelRounds: 1, latDur: 3 * time.Second, stepDur: 2 * time.Second,
			levelWrite: 2 * time.Second, steps: []int{2000, 8000, 16000, 24000, 32000, 40000},
			perTx: 10, writers: 16, drainN: 30_000}
	}
	if n, err := strconv.Atoi(os.Getenv("BENCH_ROUNDS")); err == nil && n > 0 {
		w.latRounds, w.maxRounds, w.levelRounds = n, n, n
	}
	return w
}

// walCluster is a throwaway PostgreSQL cluster started by scripts/pg.sh
// for the section, with the benchmark schema and the publication.
type walCluster struct {
	name, level, dir, url string
	port                  int
	e                     *env
}

// explainMS is auto_explain.log_min_duration under BENCH_WAL_STATEMENTS:
// BENCH_EXPLAIN_MS, default 40.
func explainMS() string {
	if n, err := strconv.Atoi(os.Getenv("BENCH_EXPLAIN_MS")); err == nil && n >= 0 {
		return strconv.Itoa(n)
	}
	return "40"
}

func pgScriptEnv(level, dir string, port int) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DATABASE_URL=") {
			env = append(env, kv)
		}
	}
	return append(env, "OUTBOX_PG_WAL_LEVEL="+level, "OUTBOX_PG_DIR="+dir, "OUTBOX_PG_PORT="+strconv.Itoa(port))
}

func pgScript(ctx context.Context, env []string, arg string) (string, error) {
	path := filepath.Join("..", "scripts", "pg.sh")
	cmd := exec.CommandContext(ctx, path, arg)
	cmd.Env = env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s %s: %w\n%s", path, arg, err, stderr.String())
	}
	return string(out), nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startWalCluster starts a fresh cluster with wal_level level.
func (e *env) startWalCluster(ctx context.Context, level string) (*walCluster, error) {
	return e.startCluster(ctx, level, level)
}

// startCluster starts a fresh cluster with wal_level level, on a free
// port, in a directory named after name and the port of the benchmark's
// own cluster (so that benchmarks of other checkouts, on other clusters,
// never share or destroy it).
func (e *env) startCluster(ctx context.Context, name, level string) (*walCluster, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("fxbench-pg-%s-%d", name, e.pool.Config().ConnConfig.Port))
	c := &walCluster{name: name, level: level, dir: dir, port: port}
	penv := pgScriptEnv(level, c.dir, port)
	_, _ = pgScript(ctx, penv, "destroy") // a cluster a killed run left behind
	out, err := pgScript(ctx, penv, "up")
	if err != nil {
		return nil, err
	}
	for _, l := range strings.Split(out, "\n") {
		if u, ok := strings.CutPrefix(l, "DATABASE_URL="); ok {
			c.url = strings.TrimSpace(u)
		}
	}
	if c.url == "" {
		c.stop()
		return nil, fmt.Errorf("scripts/pg.sh up printed no DATABASE_URL: %q", out)
	}
	if e.p.walStatements && level == "logical" {
		// BENCH_WAL_STATEMENTS: pg_stat_statements, for the diagnosis of
		// where the relays' statements spend their time.
		conn, err := pgx.Connect(ctx, c.url)
		if err == nil {
			for _, q := range []string{"LOAD 'auto_explain'", "ALTER SYSTEM SET shared_preload_libraries = pg_stat_statements, auto_explain",
				"ALTER SYSTEM SET auto_explain.log_min_duration = '" + explainMS() + "ms'", "ALTER SYSTEM SET auto_explain.log_analyze = on",
				"ALTER SYSTEM SET auto_explain.log_buffers = on"} {
				if _, err = conn.Exec(ctx, q); err != nil {
					break
				}
			}
			conn.Close(ctx)
		}
		if err == nil {
			_, err = pgScript(ctx, penv, "restart")
		}
		if err == nil {
			// Planning time too: a setting of the library, known once it
			// is loaded.
			if conn, err = pgx.Connect(ctx, c.url); err == nil {
				_, err = conn.Exec(ctx, "ALTER SYSTEM SET pg_stat_statements.track_planning = on")
				if err == nil {
					_, err = conn.Exec(ctx, "SELECT pg_reload_conf()")
				}
				conn.Close(ctx)
			}
		}
		if err != nil {
			c.stop()
			return nil, fmt.Errorf("BENCH_WAL_STATEMENTS: %w", err)
		}
	}
	cfg, err := pgxpool.ParseConfig(c.url)
	if err != nil {
		c.stop()
		return nil, err
	}
	cfg.MaxConns = 8
	cfg.ConnConfig.RuntimeParams["application_name"] = appName
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		c.stop()
		return nil, err
	}
	c.e = &env{p: e.p, pool: pool, brokers: e.brokers, brokerKind: e.brokerKind, admin: e.admin, client: e.client, table: e.table, ctable: e.ctable}
	var got string
	if err := pool.QueryRow(ctx, "SHOW wal_level").Scan(&got); err != nil || got != level {
		c.stop()
		return nil, fmt.Errorf("cluster %s: wal_level is %q (%v), want %s", c.dir, got, err, level)
	}
	if err := c.e.setupSchema(ctx); err != nil {
		c.stop()
		return nil, err
	}
	if err := c.settle(ctx); err != nil {
		c.stop()
		return nil, err
	}
	if e.p.walStatements && level == "logical" {
		if _, err := pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
			c.stop()
			return nil, err
		}
	}
	if level == "logical" {
		// The stream runs on the cursor table (it publishes what it
		// decodes under cursor progress); the marks table's publication
		// serves the levels' comparison.
		for _, t := range []outbox.Table{e.table, e.ctable} {
			if _, err := pool.Exec(ctx, "CREATE PUBLICATION "+pgx.Identifier{t.Publication()}.Sanitize()+
				" FOR TABLE "+ident(t)+" WITH (publish = 'insert')"); err != nil {
				c.stop()
				return nil, err
			}
		}
	}
	log.Printf("%s: started a wal_level=%s cluster on 127.0.0.1:%d (%s)", name, level, port, c.dir)
	return c, nil
}

// settle gives the table what a table in service has: published rows (a
// retention window's worth) and planner statistics. A freshly truncated
// table is planned as a tiny one, and the generic plan of the relays'
// mark (id = ANY($1)) then stays a sequential scan while the table grows,
// until autovacuum analyzes it: not what a service sees.
func (c *walCluster) settle(ctx context.Context) error {
	for _, t := range []outbox.Table{c.e.table, c.e.ctable} {
		if err := c.e.preloadInto(ctx, t, "fxbench.published", 100_000); err != nil {
			return err
		}
		if _, err := c.e.pool.Exec(ctx, "UPDATE "+ident(t)+" SET published_at = now()"); err != nil {
			return err
		}
		if _, err := c.e.pool.Exec(ctx, "VACUUM ANALYZE "+ident(t)); err != nil {
			return err
		}
	}
	return nil
}

// stop stops and removes the cluster.
func (c *walCluster) stop() {
	if c.e != nil {
		c.e.pool.Close()
		if c.e.p.walStatements {
			// Keep the server log (auto_explain's plans of slow statements).
			if b, err := os.ReadFile(filepath.Join(c.dir, "postgres.log")); err == nil {
				_ = os.WriteFile(filepath.Join("out", "wal-postgres-"+c.name+".log"), b, 0o644)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := pgScript(ctx, pgScriptEnv(c.level, c.dir, c.port), "destroy"); err != nil {
		log.Printf("wal: %v", err)
	}
}

// procCPU returns a process's CPU seconds (user + system) from /proc.
func procCPU(pid int) (float64, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, false
	}
	u, _ := strconv.ParseFloat(f[11], 64)
	k, _ := strconv.ParseFloat(f[12], 64)
	return (u + k) / clockTick, true
}

// walCPU is the CPU of the backends serving the relay (its pool), the
// stream's walsender, and the writers, by pid.
type walCPU struct{ relay, walsender, writers pgCPU }

func (c *walCluster) backendCPU(ctx context.Context) walCPU {
	out := walCPU{relay: pgCPU{}, walsender: pgCPU{}, writers: pgCPU{}}
	rows, err := c.e.pool.Query(ctx, `SELECT pid, CASE WHEN backend_type = 'walsender' THEN 's' WHEN application_name = $1 THEN 'r' ELSE 'w' END
		FROM pg_stat_activity WHERE application_name IN ($1, $2) OR (backend_type = 'walsender' AND application_name = 'fxoutbox-relay')`, relayApp, writerApp)
	if err != nil {
		return out
	}
	defer rows.Close()
	for rows.Next() {
		var pid int
		var kind string
		if rows.Scan(&pid, &kind) != nil {
			continue
		}
		t, ok := procCPU(pid)
		if !ok {
			continue
		}
		switch kind {
		case "s":
			out.walsender[pid] = t
		case "r":
			out.relay[pid] = t
		default:
			out.writers[pid] = t
		}
	}
	return out
}

func (c *walCluster) walLSN(ctx context.Context) int64 {
	var n int64
	_ = c.e.pool.QueryRow(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint").Scan(&n)
	return n
}

// lag returns the age of the oldest unpublished event, in seconds (0 when
// every event is published), and how many wait.
func (c *walCluster) lag(ctx context.Context) (float64, int, error) {
	var age float64
	var n int
	err := c.e.pool.QueryRow(ctx, `SELECT coalesce((SELECT extract(epoch FROM clock_timestamp() - created_at)::float8 FROM `+ident(c.e.table)+`
		WHERE published_at IS NULL ORDER BY id LIMIT 1), 0), (SELECT count(*) FROM `+ident(c.e.table)+` WHERE published_at IS NULL)`).Scan(&age, &n)
	return age, n, err
}

// waitPublished waits until every event is published (up to limit),
// returning the largest lag seen meanwhile.
func (c *walCluster) waitPublished(ctx context.Context, limit time.Duration) (float64, error) {
	deadline := time.Now().Add(limit)
	worst := 0.0
	for {
		age, n, err := c.lag(ctx)
		if err != nil {
			return worst, err
		}
		worst = max(worst, age)
		if n == 0 || time.Now().After(deadline) {
			return worst, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitDrained is waitPublished with the backlog read by lag.
func (c *walCluster) waitDrained(ctx context.Context, lag func(context.Context) (float64, int, error), limit time.Duration) (float64, error) {
	deadline := time.Now().Add(limit)
	worst := 0.0
	for {
		age, n, err := lag(ctx)
		if err != nil {
			return worst, err
		}
		worst = max(worst, age)
		if n == 0 || time.Now().After(deadline) {
			return worst, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// walRelay is one relay process of the section.
type walRelay struct {
	c       *walCluster
	ps      *relayProcs
	mode    string
	acked   atomic.Int64
	batches atomic.Int64 // publish calls
}

// startRelay starts a relay process of mode poll, stream or cursor (poll
// with relay.ProgressCursor, on the cursor table); more is added to its
// environment.
func (c *walCluster) startRelay(ctx context.Context, mode, warm, profile string, more ...string) (*walRelay, error) {
	r := &walRelay{c: c, mode: mode}
	extra := []string{"DATABASE_URL=" + c.url, "FXBENCH_APP=" + relayApp, "FXBENCH_TABLE=" + c.e.tableOf(mode).Name}
	switch mode {
	case "stream":
		extra = append(extra, "FXBENCH_MODE=stream", "FXBENCH_PROGRESS=cursor")
	case "cursor":
		extra = append(extra, "FXBENCH_PROGRESS=cursor")
	}
	extra = append(extra, more...)
	if profile != "" {
		extra = append(extra, "FXBENCH_PROFILE="+profile)
	}
	// Listen: what fxoutbox.Module wires (Stream mode does not listen).
	ps, err := c.e.startRelayProcs(ctx, 1, 0, true, warm, func(k int) { r.acked.Add(int64(k)); r.batches.Add(1) }, extra...)
	if err != nil {
		return nil, err
	}
	r.ps = ps
	if err := ps.start(); err != nil {
		_ = r.stop(ctx)
		return nil, err
	}
	if mode == "stream" {
		deadline := time.Now().Add(30 * time.Second)
		for {
			var active bool
			err := c.e.pool.QueryRow(ctx, "SELECT coalesce((SELECT active FROM pg_replication_slots WHERE slot_name = $1), false)", benchSlot(ctx, c.e.pool, c.e.tableOf("stream"))).Scan(&active)
			if err == nil && active {
				break
			}
			if time.Now().After(deadline) {
				_ = r.stop(ctx)
				return nil, fmt.Errorf("the streaming relay did not take its slot within 30s (%v)", err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		time.Sleep(time.Second) // past its start-up handover (the polling of the empty table)
	}
	return r, nil
}

// stop stops the relay process and, for the stream, drops its slot (a
// slot left behind pins WAL).
func (r *walRelay) stop(ctx context.Context) error {
	err := r.ps.stop()
	if r.mode == "stream" {
		err = errors.Join(err, r.c.e.dropSlot(context.WithoutCancel(ctx), benchSlot(ctx, r.c.e.pool, r.c.e.tableOf("stream"))))
	}
	return err
}

// consumer reads every partition of a topic and records when each event
// (by its id header) arrived.
type consumer struct {
	mu       sync.Mutex
	arrivals map[string]time.Time
	n        atomic.Int64
	c        sarama.Consumer
	pcs      []sarama.PartitionConsumer
	wg       sync.WaitGroup
}

func (e *env) startConsumer(topic string) (*consumer, error) {
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V2_8_0_0
	cfg.ClientID = "fxbench-consumer"
	sc, err := sarama.NewConsumer(e.brokers, cfg)
	if err != nil {
		return nil, err
	}
	k := &consumer{arrivals: map[string]time.Time{}, c: sc}
	parts, err := sc.Partitions(topic)
	if err != nil {
		k.close()
		return nil, err
	}
	for _, part := range parts {
		pc, err := sc.ConsumePartition(topic, part, sarama.OffsetOldest)
		if err != nil {
			k.close()
			return nil, err
		}
		k.pcs = append(k.pcs, pc)
		k.wg.Add(1)
		go func() {
			defer k.wg.Done()
			for m := range pc.Messages() {
				now := time.Now()
				for _, h := range m.Headers {
					if string(h.Key) == outbox.HeaderEventID {
						k.mu.Lock()
						if _, dup := k.arrivals[string(h.Value)]; !dup {
							k.arrivals[string(h.Value)] = now
						}
						k.mu.Unlock()
						break
					}
				}
				k.n.Add(1)
			}
		}()
	}
	return k, nil
}

func (k *consumer) close() {
	for _, pc := range k.pcs {
		pc.AsyncClose()
	}
	k.wg.Wait()
	_ = k.c.Close()
}

// latencyRound measures one relay's commit-to-consumer latency at rate
// events/s, one event per transaction, with the writers in a process of
// their own and the relay in another; it also takes the PostgreSQL CPU
// and the WAL of the run.
func (c *walCluster) latencyRound(ctx context.Context, mode, warm string, rate int, d time.Duration) (WalLatRun, error) {
	run, _, err := c.rateRound(ctx, rateSpec{mode: mode, warm: warm, rate: rate, d: d})
	return run, err
}

// rateSpec is one run of rateRound.
type rateSpec struct {
	// mode is the relay's: poll, stream, cursor (poll with cursor
	// progress, on the cursor table); "writers" and "writers-cursor" run
	// the writers alone, on the marks and the cursor table.
	mode, warm string
	rate       int
	d          time.Duration
	// deadTuples: stop the relay and the writers and read the growth of
	// the table's n_dead_tup over the run.
	deadTuples bool
}

// relayMode is the relay of a rateSpec mode, "" for the writers alone.
func relayMode(mode string) string {
	if strings.HasPrefix(mode, "writers") {
		return ""
	}
	return mode
}

// tableOf is the table a mode writes and relays: the cursor table for
// cursor progress, the marks table otherwise.
func (e *env) tableOf(mode string) outbox.Table {
	if mode == "cursor" || mode == "writers-cursor" || mode == "stream" {
		return e.ctable
	}
	return e.table
}

// rateRound runs the writers at spec.rate events/s, one event per
// transaction, for spec.d, in a process of their own, with one relay of
// spec.mode in another (or none), and measures the commit-to-consumer
// latency, the PostgreSQL CPU of the relay's and the writers' backends,
// the WAL of the run (pg_current_wal_lsn before the writes and after the
// relay's last batch) and, with spec.deadTuples, the growth of the
// table's n_dead_tup (returned per event).
func (c *walCluster) rateRound(ctx context.Context, spec rateSpec) (WalLatRun, float64, error) {
	e := c.e
	mode, table := spec.mode, e.tableOf(spec.mode)
	topic, err := e.newTopic("wallat")
	if err != nil {
		return WalLatRun{}, 0, err
	}
	defer e.dropTopic(topic)
	var r *walRelay
	var cons *consumer
	if relayMode(mode) != "" {
		if cons, err = e.startConsumer(topic); err != nil {
			return WalLatRun{}, 0, err
		}
		defer cons.close()
		if r, err = c.startRelay(ctx, mode, spec.warm, ""); err != nil {
			return WalLatRun{}, 0, err
		}
		defer func() {
			if r != nil {
				_ = r.stop(ctx)
			}
		}()
	}
	w, err := e.startWriterProc(ctx, c.url, topic, "FXBENCH_TABLE="+table.Name)
	if err != nil {
		return WalLatRun{}, 0, err
	}
	defer func() {
		if w != nil {
			_ = w.stop()
		}
	}()
	var dead0 int64
	if spec.deadTuples {
		if dead0, err = c.deadTuples(ctx, table); err != nil {
			return WalLatRun{}, 0, err
		}
	}
	e.checkpoint(ctx)
	c.resetStatements(ctx)
	var b0 int64
	if r != nil {
		b0 = r.batches.Load()
	}
	cpu0, lsn0 := c.backendCPU(ctx), c.walLSN(ctx)
	wr, err := w.run(spec.rate, spec.d, 1, e.p.LatWriters, r != nil)
	if err != nil {
		return WalLatRun{}, 0, err
	}
	batches := 1.0
	switch {
	case r == nil:
	case mode == "cursor":
		// The rows are never marked: wait for the consumer, then for
		// the relay's last batch to commit its positions.
		deadline := time.Now().Add(graceFor(e.p))
		for cons.n.Load() < wr.events && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if err := c.waitRelayIdle(ctx, 5*time.Second); err != nil {
			return WalLatRun{}, 0, err
		}
	default:
		deadline := time.Now().Add(graceFor(e.p))
		for cons.n.Load() < wr.events && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if _, err := c.waitPublished(ctx, 5*time.Second); err != nil { // the marks too
			return WalLatRun{}, 0, err
		}
	}
	cpu1, lsn1 := c.backendCPU(ctx), c.walLSN(ctx)
	if r != nil {
		batches = float64(max(1, r.batches.Load()-b0))
	}
	var lats []time.Duration
	missing := 0
	if cons != nil {
		cons.mu.Lock()
		lats = make([]time.Duration, 0, len(wr.commits))
		for id, at := range wr.commits {
			a, ok := cons.arrivals[id]
			if !ok {
				missing++
				continue
			}
			lats = append(lats, max(0, a.Sub(at)))
		}
		cons.mu.Unlock()
		slices.Sort(lats)
	}
	n := float64(max(1, wr.events))
	run := WalLatRun{
		Mode: mode, Rate: spec.rate, Achieved: round1(wr.achieved), Events: int(wr.events), Missing: missing,
		P50: percentileMS(lats, 0.5), P99: percentileMS(lats, 0.99), P999: percentileMS(lats, 0.999), Max: percentileMS(lats, 1),
		RelayPGUs:        round2((cpu0.relay.until(cpu1.relay) + cpu0.walsender.until(cpu1.walsender)) / n * 1e6),
		WalsenderPGUs:    round2(cpu0.walsender.until(cpu1.walsender) / n * 1e6),
		WriterPGUs:       round2(cpu0.writers.until(cpu1.writers) / n * 1e6),
		WalBytesPerEvent: round1(float64(lsn1-lsn0) / n),
	}
	if r != nil {
		run.EventsPerBatch = round2(n / batches)
		run.RelayPGUsPerBatch = round1(run.RelayPGUs * run.EventsPerBatch)
	}
	run.Statements = c.statements(ctx)
	for _, st := range run.Statements {
		log.Printf("%s:   %-6s %8d calls %9.1f ms %8.1f µs/call %8d rows %9d B WAL  %s", c.name, mode, st.Calls, st.TotalMS, st.MeanUs, st.Rows, st.WalBytes, st.Query)
	}
	dead := 0.0
	if spec.deadTuples {
		// The relay's and the writers' backends flush their table
		// statistics when they exit: stop both, then read.
		if r != nil {
			err := r.stop(ctx)
			r = nil
			if err != nil {
				return run, 0, err
			}
		}
		err := w.stop()
		w = nil
		if err != nil {
			return run, 0, err
		}
		dead1, err := c.deadTuples(ctx, table)
		if err != nil {
			return run, 0, err
		}
		dead = float64(dead1-dead0) / n
	}
	return run, dead, nil
}

// waitRelayIdle waits, once the consumer has every event, until the
// relay's backends are out of any transaction on two polls in a row: its
// last batch saved its lanes' positions and committed. (A cursor relay
// marks nothing, and a lane may keep a window open, read to its end,
// until its next row arrives, so neither is a sign of the end.)
func (c *walCluster) waitRelayIdle(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	quiet := 0
	for {
		var busy int
		if err := c.e.pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state <> 'idle'", relayApp).Scan(&busy); err != nil {
			return err
		}
		if busy == 0 {
			quiet++
		} else {
			quiet = 0
		}
		if quiet >= 2 {
			return nil
		}
		if time.Now().After(deadline) {
			log.Printf("%s: the relay's backends still busy after %v; measuring anyway", c.name, limit)
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// positionsOf is the positions table of a cursor table
// (migrations.Cursor.Up's <table>_cursor).
func positionsOf(t outbox.Table) outbox.Table {
	t = t.WithDefaults()
	return outbox.Table{Schema: t.Schema, Name: t.Name + "_cursor"}
}

// deadTuples reads n_dead_tup of table once the backends of the relay and
// of the writers are gone (a backend flushes its pending table statistics
// when it exits, before it leaves pg_stat_activity). Its own session's
// are flushed with pg_stat_force_next_flush().
func (c *walCluster) deadTuples(ctx context.Context, table outbox.Table) (int64, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := c.e.pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name IN ($1, $2)", relayApp, writerApp).Scan(&n); err != nil {
			return 0, err
		}
		if n == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	conn, err := c.e.pool.Acquire(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SELECT pg_stat_force_next_flush(), pg_stat_clear_snapshot()"); err != nil {
		return 0, err
	}
	var dead int64
	err = conn.QueryRow(ctx, "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = $1::regclass", ident(table)).Scan(&dead)
	return dead, err
}

// maxRateRound steps the offered rate up with one relay running, until a
// step it does not follow (the oldest unpublished event a second old or
// more, during the step or until the backlog is gone) or the writers fall
// short of the offered rate.
func (c *walCluster) maxRateRound(ctx context.Context, mode, warm string, wp walParams, profile string) (WalMaxRun, error) {
	e := c.e
	run := WalMaxRun{Mode: mode}
	topic, err := e.newTopic("walrate")
	if err != nil {
		return run, err
	}
	defer e.dropTopic(topic)
	e.checkpoint(ctx)
	r, err := c.startRelay(ctx, mode, warm, profile)
	if err != nil {
		return run, err
	}
	defer func() { _ = r.stop(ctx) }()
	w, err := e.startWriterProc(ctx, c.url, topic, "FXBENCH_TABLE="+e.tableOf(mode).Name)
	if err != nil {
		return run, err
	}
	defer func() { _ = w.stop() }()
	strict := true // every step so far followed
	for _, rate := range wp.steps {
		c.resetStatements(ctx)
		cpu0, lsn0, acked0 := c.backendCPU(ctx), c.walLSN(ctx), r.acked.Load()
		lag := c.lag
		if mode == "stream" {
			// The stream writes no marks and its checkpoint trails by a
			// second or two: its backlog is what the writers committed
			// and the relay has not had acknowledged, its lag that backlog
			// at the offered rate.
			var id0 int64
			if err := e.pool.QueryRow(ctx, "SELECT coalesce(max(id), 0) FROM "+ident(e.tableOf(mode))).Scan(&id0); err != nil {
				return run, err
			}
			lag = func(ctx context.Context) (float64, int, error) {
				var top int64
				err := e.pool.QueryRow(ctx, "SELECT coalesce(max(id), 0) FROM "+ident(e.tableOf(mode))).Scan(&top)
				n := max(0, int(top-id0)-int(r.acked.Load()-acked0))
				return float64(n) / float64(rate), n, err
			}
		}
		// Sample the lag while the writers run.
		var worst atomic.Value
		worst.Store(0.0)
		var backlog atomic.Int64
		waits := &sync.Map{}
		sctx, stopSampling := context.WithCancel(ctx)
		var swg sync.WaitGroup
		swg.Add(1)
		go func() {
			defer swg.Done()
			t := time.NewTicker(100 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-sctx.Done():
					return
				case <-t.C:
				}
				if e.p.walStatements {
					c.sampleWaits(sctx, waits)
				}
				age, n, err := lag(sctx)
				if err != nil {
					continue
				}
				if age > worst.Load().(float64) {
					worst.Store(age)
				}
				if int64(n) > backlog.Load() {
					backlog.Store(int64(n))
				}
			}
		}()
		wr, err := w.run(rate, wp.stepDur, wp.perTx, wp.writers, false)
		stopSampling()
		swg.Wait()
		if err != nil {
			return run, err
		}
		tail, err := c.waitDrained(ctx, lag, 20*time.Second)
		if err != nil {
			return run, err
		}
		cpu1, lsn1 := c.backendCPU(ctx), c.walLSN(ctx)
		published := float64(max(1, r.acked.Load()-acked0))
		st := WalStep{
			Rate: rate, Achieved: round1(wr.achieved), MaxLagS: round3(max(worst.Load().(float64), tail)),
			WritersShort:     wr.achieved < 0.9*float64(rate),
			RelayPGUs:        round2((cpu0.relay.until(cpu1.relay) + cpu0.walsender.until(cpu1.walsender)) / published * 1e6),
			WalBytesPerEvent: round1(float64(lsn1-lsn0) / float64(max(1, wr.events))),
		}
		st.Followed = st.MaxLagS < 1
		st.MaxBacklog = int(backlog.Load())
		st.KeptUp = st.MaxBacklog < rate
		st.Statements = c.statements(ctx)
		if e.p.walStatements {
			var ws []string
			waits.Range(func(k, v any) bool { ws = append(ws, fmt.Sprintf("%s=%d", k, v.(*atomic.Int64).Load())); return true })
			slices.Sort(ws)
			log.Printf("wal:   %-6s @%d/s relay backends' state, sampled every 100 ms: %s", mode, rate, strings.Join(ws, " "))
		}
		for i, x := range st.Statements {
			if i < 6 {
				log.Printf("wal:   %-6s @%d/s %8d calls %9.1f ms %8.1f µs/call %8d rows  %s", mode, rate, x.Calls, x.TotalMS, x.MeanUs, x.Rows, x.Query)
			}
		}
		run.Steps = append(run.Steps, st)
		log.Printf("wal: max rate  %-6s offered %6d/s  writers %8.0f/s  max lag %6.3f s  max backlog %6d  relay PostgreSQL %6.1f µs/event  %s",
			mode, rate, wr.achieved, st.MaxLagS, st.MaxBacklog, st.RelayPGUs, map[bool]string{true: "followed", false: "NOT FOLLOWED (lag)"}[st.Followed])
		if st.Followed && strict {
			run.MaxRate = max(run.MaxRate, st.Achieved)
		} else {
			strict = false
		}
		if !st.KeptUp {
			break
		}
		run.KeptUpRate = max(run.KeptUpRate, st.Achieved)
		if st.WritersShort {
			run.WriterBound = true
			break
		}
	}
	return run, nil
}

// levelRound measures, on one cluster, the writers' throughput and the
// polling relay's drain.
func (c *walCluster) levelRound(ctx context.Context, warm string, wp walParams) (WalLevelRun, error) {
	e := c.e
	out := WalLevelRun{Level: c.level}
	topic, err := e.newTopic("wallevel")
	if err != nil {
		return out, err
	}
	defer e.dropTopic(topic)
	if _, err := e.pool.Exec(ctx, "TRUNCATE "+ident(e.table)+" RESTART IDENTITY"); err != nil {
		return out, err
	}
	w, err := e.startWriterProc(ctx, c.url, topic)
	if err != nil {
		return out, err
	}
	e.checkpoint(ctx)
	lsn0 := c.walLSN(ctx)
	wr, err := w.run(0, wp.levelWrite, 1, wp.writers, false)
	_ = w.stop()
	if err != nil {
		return out, err
	}
	out.WriteEPS = round1(wr.achieved)
	out.WriteWalBytes = round1(float64(c.walLSN(ctx)-lsn0) / float64(max(1, wr.events)))

	if err := e.preloadOutbox(ctx, topic, wp.drainN); err != nil {
		return out, err
	}
	e.checkpoint(ctx)
	lsn0 = c.walLSN(ctx)
	d, err := e.drainProcs(ctx, warm, wp.drainN, 0, 1, "DATABASE_URL="+c.url, "FXBENCH_LISTEN=1")
	if err != nil {
		return out, err
	}
	out.DrainEPS = d.EPS
	out.DrainWalBytes = round1(float64(c.walLSN(ctx)-lsn0) / float64(max(1, d.Published)))
	out.DrainPGUsPerEvent = d.PGUsPerEvent
	return out, nil // preloadOutbox left the table analyzed, with the drained rows published
}

func runWal(ctx context.Context, e *env) (*Wal, error) {
	wp := e.p.wal()
	res := &Wal{StartedAt: time.Now().UTC().Format(time.RFC3339), LoadAvgStart: loadavg(), LatRate: 1000, PGCPURate: 1000,
		Command: "cd bench && BENCH_ONLY=wal go run ."}
	if e.p.Quick {
		res.Command = "cd bench && BENCH_QUICK=1 BENCH_ONLY=wal go run ."
	}
	warm, err := e.newTopic("walwarm")
	if err != nil {
		return nil, err
	}
	defer e.dropTopic(warm)
	logical, err := e.startWalCluster(ctx, "logical")
	if err != nil {
		return nil, fmt.Errorf("start the wal_level=logical cluster: %w", err)
	}
	defer logical.stop()

	// 1 and 3, 4: latency, PostgreSQL CPU and WAL at 1k/s, modes alternating.
	modes := func(round int) []string {
		if round%2 == 0 {
			return []string{"poll", "stream"}
		}
		return []string{"stream", "poll"}
	}
	for round := range wp.latRounds {
		for _, mode := range modes(round) {
			run, err := logical.latencyRound(ctx, mode, warm, res.LatRate, wp.latDur)
			if err != nil {
				return nil, fmt.Errorf("latency %s: %w", mode, err)
			}
			res.Latency = append(res.Latency, run)
			log.Printf("wal: latency round %d/%d  %-6s @%d/s  p50 %6.2f ms  p99 %6.2f ms  p99.9 %6.2f ms  (n=%d, missing %d)  relay PostgreSQL %.1f µs/event (walsender %.1f; %.1f events and %.0f µs per batch), writers %.1f; WAL %.0f B/event",
				round+1, wp.latRounds, mode, run.Rate, run.P50, run.P99, run.P999, run.Events, run.Missing, run.RelayPGUs, run.WalsenderPGUs, run.EventsPerBatch, run.RelayPGUsPerBatch, run.WriterPGUs, run.WalBytesPerEvent)
		}
	}
	pick := func(mode string, f func(WalLatRun) float64) float64 {
		var xs []float64
		for _, r := range res.Latency {
			if r.Mode == mode {
				xs = append(xs, f(r))
			}
		}
		return median(xs)
	}
	res.LatencyP50 = round2(pick("stream", func(r WalLatRun) float64 { return r.P50 }))
	res.LatencyP99 = round2(pick("stream", func(r WalLatRun) float64 { return r.P99 }))
	res.LatencyP999 = round2(pick("stream", func(r WalLatRun) float64 { return r.P999 }))
	res.PollLatencyP50 = round2(pick("poll", func(r WalLatRun) float64 { return r.P50 }))
	res.PollLatencyP99 = round2(pick("poll", func(r WalLatRun) float64 { return r.P99 }))
	res.PollLatencyP999 = round2(pick("poll", func(r WalLatRun) float64 { return r.P999 }))
	res.PGUsPerEvent = round2(pick("stream", func(r WalLatRun) float64 { return r.RelayPGUs }))
	res.PollPGUsPerEvent = round2(pick("poll", func(r WalLatRun) float64 { return r.RelayPGUs }))
	res.WalsenderUsPerEvt = round2(pick("stream", func(r WalLatRun) float64 { return r.WalsenderPGUs }))
	res.PGCPUVsPoll = ratio(res.PGUsPerEvent, res.PollPGUsPerEvent)
	res.WriterPGUsPerEvent = round2(pick("stream", func(r WalLatRun) float64 { return r.WriterPGUs }))
	res.PollWriterPGUs = round2(pick("poll", func(r WalLatRun) float64 { return r.WriterPGUs }))
	res.WalBytesPerEvent = round1(pick("stream", func(r WalLatRun) float64 { return r.WalBytesPerEvent }))
	res.PollWalBytesPerEvent = round1(pick("poll", func(r WalLatRun) float64 { return r.WalBytesPerEvent }))

	// 2: the highest rate each follows, modes alternating; the relay
	// processes of the first round are profiled.
	if err := os.MkdirAll("out", 0o755); err != nil {
		return nil, err
	}
	var profiles []string
	for round := range wp.maxRounds {
		for _, mode := range modes(round) {
			prof := ""
			if round == 0 {
				prof = filepath.Join("out", "wal-"+mode+"-relay.pprof")
				profiles = append(profiles, "bench/"+prof)
			}
			run, err := logical.maxRateRound(ctx, mode, warm, wp, prof)
			if err != nil {
				return nil, fmt.Errorf("max rate %s: %w", mode, err)
			}
			res.MaxRate = append(res.MaxRate, run)
		}
	}
	var sm, pm, sk, pk []float64
	for _, r := range res.MaxRate {
		if r.Mode == "stream" {
			sm, sk = append(sm, r.MaxRate), append(sk, r.KeptUpRate)
			res.MaxRateWriterBound = res.MaxRateWriterBound || r.WriterBound
		} else {
			pm, pk = append(pm, r.MaxRate), append(pk, r.KeptUpRate)
			res.PollMaxRateWriterBd = res.PollMaxRateWriterBd || r.WriterBound
		}
	}
	res.MaxRateEPS, res.PollMaxRateEPS = round1(median(sm)), round1(median(pm))
	res.MaxRateVsPoll = medianRatio(sm, pm)
	res.KeptUpEPS, res.PollKeptUpEPS = round1(median(sk)), round1(median(pk))
	res.KeptUpVsPoll = medianRatio(sk, pk)
	var s8, p8 []float64
	for _, r := range res.MaxRate {
		for _, st := range r.Steps {
			if st.Rate == 8000 && r.Mode == "stream" {
				s8 = append(s8, st.RelayPGUs)
			} else if st.Rate == 8000 {
				p8 = append(p8, st.RelayPGUs)
			}
		}
	}
	res.PGUsPerEvent8k, res.PollPGUsPerEvent8k = round2(median(s8)), round2(median(p8))
	res.PGCPUVsPoll8k = ratio(res.PGUsPerEvent8k, res.PollPGUsPerEvent8k)
	res.Profile = strings.Join(profiles, " ")

	// 5: wal_level=logical against replica, clusters alternating.
	replica, err := e.startWalCluster(ctx, "replica")
	if err != nil {
		return nil, fmt.Errorf("start the wal_level=replica cluster: %w", err)
	}
	defer replica.stop()
	var wr, dr, br []float64
	for round := range wp.levelRounds {
		cs := []*walCluster{logical, replica}
		if round%2 == 1 {
			cs = []*walCluster{replica, logical}
		}
		got := map[string]WalLevelRun{}
		for _, c := range cs {
			run, err := c.levelRound(ctx, warm, wp)
			if err != nil {
				return nil, fmt.Errorf("wal_level %s: %w", c.level, err)
			}
			got[c.level] = run
			res.Level = append(res.Level, run)
			log.Printf("wal: wal_level=%-7s round %d/%d  writes %8.0f/s (%.0f B WAL/event)  polling drain %8.0f/s (%.0f B WAL/event, PostgreSQL %.1f µs/event)",
				c.level, round+1, wp.levelRounds, run.WriteEPS, run.WriteWalBytes, run.DrainEPS, run.DrainWalBytes, run.DrainPGUsPerEvent)
		}
		l, r := got["logical"], got["replica"]
		if r.WriteEPS > 0 && r.DrainEPS > 0 && r.WriteWalBytes > 0 {
			wr, dr, br = append(wr, l.WriteEPS/r.WriteEPS), append(dr, l.DrainEPS/r.DrainEPS), append(br, l.WriteWalBytes/r.WriteWalBytes)
		}
	}
	res.LevelCostWriteRatio, res.LevelCostDrainRatio, res.LevelCostWalRatio = round3(median(wr)), round3(median(dr)), round3(median(br))
	res.LoadAvgEnd = loadavg()
	res.Note = fmt.Sprintf("Two throwaway clusters started by scripts/pg.sh (OUTBOX_PG_WAL_LEVEL=logical and =replica, same settings otherwise), so the WAL and backend figures hold only this section's traffic. "+
		"Relays run in a process of their own (fxoutbox defaults: PollInterval 500ms, BatchSize 50, MaxBatchSize 500, Listen; Stream: relay.Stream with StreamConfig defaults), writers in another (unitofwork with the coalesced NOTIFY after commit, as fxoutbox.Module wires), the consumer in the benchmark process. "+
		"Latency, PostgreSQL CPU and WAL: %d/s, one event per transaction, %d writers, %.0f s, median of %d rounds per relay, modes alternating. "+
		"Max rate: offered %v events/s in transactions of %d events by %d writers, %.0f s per step, one relay process running through the steps; a step is followed when the oldest unpublished event is never 1 s old (sampled every 100 ms during the step and until the backlog is gone), and max_rate is the highest rate of the steps followed from the first on; kept_up_rate is the highest rate whose backlog (events unpublished) stayed under one second of the offered rate; median of %d round(s). "+
		"PostgreSQL CPU: user+system from /proc of the backends of the relay's pool and of the stream's walsender (backend_type walsender, application_name fxoutbox-relay), per event; the writers' backends apart. "+
		"wal_level cost: 16 writers, one event per transaction, as fast as they can for %.0f s; the polling relay (defaults, one process) draining %d events; logical/replica, median of %d paired rounds.",
		res.LatRate, e.p.LatWriters, wp.latDur.Seconds(), wp.latRounds, wp.steps, wp.perTx, wp.writers, wp.stepDur.Seconds(), wp.maxRounds,
		wp.levelWrite.Seconds(), wp.drainN, wp.levelRounds)
	return res, nil
}

// printWal prints the section's report.
func printWal(w io.Writer, x *Wal, line string) {
	if x == nil {
		return
	}
	fmt.Fprintf(w, "%s\nWAL STREAMING  (relay.Stream vs the polling relay at fxoutbox defaults; load %s -> %s)\n", line, x.LoadAvgStart, x.LoadAvgEnd)
	fmt.Fprintf(w, "   latency @%d/s, writers in another process: stream p50 %.2f p99 %.2f p99.9 %.2f ms; poll p50 %.2f p99 %.2f p99.9 %.2f ms\n",
		x.LatRate, x.LatencyP50, x.LatencyP99, x.LatencyP999, x.PollLatencyP50, x.PollLatencyP99, x.PollLatencyP999)
	fmt.Fprintf(w, "   max rate followed (lag < 1 s): stream %.0f/s%s, poll %.0f/s%s, ratio %.2f; backlog under 1 s of writes: stream %.0f/s, poll %.0f/s, ratio %.2f\n",
		x.MaxRateEPS, bound(x.MaxRateWriterBound), x.PollMaxRateEPS, bound(x.PollMaxRateWriterBd), x.MaxRateVsPoll, x.KeptUpEPS, x.PollKeptUpEPS, x.KeptUpVsPoll)
	fmt.Fprintf(w, "   PostgreSQL CPU per event @%d/s: stream %.1f µs (walsender %.1f), poll %.1f µs, ratio %.2f; writers' backends %.1f / %.1f µs\n",
		x.PGCPURate, x.PGUsPerEvent, x.WalsenderUsPerEvt, x.PollPGUsPerEvent, x.PGCPUVsPoll, x.WriterPGUsPerEvent, x.PollWriterPGUs)
	fmt.Fprintf(w, "   PostgreSQL CPU per event @8k/s (10 events per transaction): stream %.1f µs, poll %.1f µs, ratio %.2f\n", x.PGUsPerEvent8k, x.PollPGUsPerEvent8k, x.PGCPUVsPoll8k)
	fmt.Fprintf(w, "   WAL per event @%d/s: stream %.0f B, poll %.0f B\n", x.PGCPURate, x.WalBytesPerEvent, x.PollWalBytesPerEvent)
	fmt.Fprintf(w, "   wal_level logical/replica: writes %.3f, polling drain %.3f, WAL bytes of writes %.3f\n", x.LevelCostWriteRatio, x.LevelCostDrainRatio, x.LevelCostWalRatio)
}

func bound(b bool) string {
	if b {
		return " (writer-bound: a lower bound)"
	}
	return ""
}

// benchSlot is the name of table's replication slot in pool's database.
func benchSlot(ctx context.Context, pool *pgxpool.Pool, table outbox.Table) string {
	var db string
	_ = pool.QueryRow(context.WithoutCancel(ctx), "SELECT current_database()").Scan(&db)
	return table.Slot(db)
}
