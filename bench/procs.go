package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox/relay"
)

// appName is the application_name of every PostgreSQL session the
// benchmark opens (its own pool and its relay processes'), so that the
// CPU time of exactly those backends can be read (see pgBackendCPU).
const appName = "fxbench"

// childEnv is set in the environment of a relay process the benchmark
// starts (see relayProcs): main runs runChild instead of the benchmark.
const childEnv = "FXBENCH_CHILD"

// runChild is one relay in a process of its own, as a pod would run it:
// its own pool, producer and relay.Config (from FXBENCH_* variables). It
// connects, publishes one warm-up record, prints "ready", starts the relay
// when a line arrives on stdin, prints the number of events each publish
// got acknowledged, and stops the relay when stdin closes.
func runChild() error {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = appName
	if a := os.Getenv("FXBENCH_APP"); a != "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = a
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	brokers := strings.Split(os.Getenv("FXBENCH_BROKERS"), ",")
	sp, err := relay.NewSaramaPublisher(brokers, producerConfig("fxoutbox"))
	if err != nil {
		return err
	}
	defer sp.Close()
	if err := sp.Publish(ctx, []relay.Message{{Topic: os.Getenv("FXBENCH_WARM"), Key: []byte("k"), Value: []byte(`{}`)}}); err != nil {
		return fmt.Errorf("warm up producer: %w", err)
	}
	batch, _ := strconv.Atoi(os.Getenv("FXBENCH_BATCH"))
	out := bufio.NewWriter(os.Stdout)
	var mu sync.Mutex
	pub := relay.PublisherFunc(func(ctx context.Context, msgs []relay.Message) error {
		err := sp.Publish(ctx, msgs)
		mu.Lock()
		fmt.Fprintln(out, acked(len(msgs), err))
		_ = out.Flush()
		mu.Unlock()
		return err
	})
	rc := &relay.Config{
		Table:     tableNamed(os.Getenv("FXBENCH_TABLE")),
		BatchSize: batch, // 0: the default
		Listen:    os.Getenv("FXBENCH_LISTEN") == "1",
	}
	if os.Getenv("FXBENCH_MODE") == "stream" {
		rc.Mode = relay.Stream
	}
	switch s := os.Getenv("FXBENCH_PROGRESS"); s {
	case "", relay.ProgressMarks.String():
		rc.Progress = relay.ProgressMarks
	case relay.ProgressCursor.String():
		rc.Progress = relay.ProgressCursor
	default:
		return fmt.Errorf("FXBENCH_PROGRESS=%q: use marks or cursor", s)
	}
	if s := os.Getenv("FXBENCH_RETENTION"); s != "" {
		if rc.Retention, err = time.ParseDuration(s); err != nil {
			return fmt.Errorf("FXBENCH_RETENTION: %w", err)
		}
	}
	r, err := relay.New(pool, pub, rc)
	if err != nil {
		return err
	}
	fmt.Println("ready")
	in := bufio.NewReader(os.Stdin)
	if _, err := in.ReadString('\n'); err != nil {
		return nil // the benchmark went away before the start
	}
	if path := os.Getenv("FXBENCH_PROFILE"); path != "" {
		// A CPU profile of this relay process, from its start to its stop.
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	if err := r.Start(ctx); err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, in) // until stdin closes
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return r.Stop(sctx)
}

// relayProcs is a set of relay processes (see runChild).
type relayProcs struct {
	cmds  []*exec.Cmd
	ins   []io.WriteCloser
	wg    sync.WaitGroup
	errMu sync.Mutex
	err   error
}

// startRelayProcs starts n relay processes on the benchmark's table,
// publishing to the broker, and waits until each is connected and warmed
// up. acked receives each publish's acknowledged count (from any process).
// batch 0 means the default BatchSize. extra is added to the processes'
// environment (e.g. another DATABASE_URL, FXBENCH_MODE=stream).
func (e *env) startRelayProcs(ctx context.Context, n, batch int, listen bool, warm string, acked func(int), extra ...string) (*relayProcs, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	ps := &relayProcs{}
	for range n {
		cmd := exec.CommandContext(ctx, self)
		cmd.Env = append(os.Environ(), childEnv+"=relay",
			"FXBENCH_BROKERS="+strings.Join(e.brokers, ","), "FXBENCH_WARM="+warm,
			"FXBENCH_BATCH="+strconv.Itoa(batch), "FXBENCH_LISTEN="+map[bool]string{true: "1"}[listen])
		cmd.Env = append(cmd.Env, extra...)
		cmd.Stderr = os.Stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			ps.stop()
			return nil, err
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			ps.stop()
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			ps.stop()
			return nil, err
		}
		ps.cmds, ps.ins = append(ps.cmds, cmd), append(ps.ins, in)
		sc := bufio.NewScanner(out)
		if !sc.Scan() || sc.Text() != "ready" {
			ps.stop()
			return nil, fmt.Errorf("relay process did not start: %q %v", sc.Text(), sc.Err())
		}
		ps.wg.Add(1)
		go func() {
			defer ps.wg.Done()
			for sc.Scan() {
				k, err := strconv.Atoi(sc.Text())
				if err != nil {
					ps.fail(fmt.Errorf("relay process said %q", sc.Text()))
					continue
				}
				acked(k)
			}
		}()
	}
	return ps, nil
}

func (ps *relayProcs) fail(err error) {
	ps.errMu.Lock()
	defer ps.errMu.Unlock()
	if ps.err == nil {
		ps.err = err
	}
}

// start starts every process's relay.
func (ps *relayProcs) start() error {
	for _, in := range ps.ins {
		if _, err := io.WriteString(in, "go\n"); err != nil {
			return err
		}
	}
	return nil
}

// stop stops the relays (each finishes its batch) and waits for the
// processes.
func (ps *relayProcs) stop() error {
	for _, in := range ps.ins {
		_ = in.Close()
	}
	var errs []error
	for _, c := range ps.cmds {
		if err := c.Wait(); err != nil {
			errs = append(errs, fmt.Errorf("relay process: %w", err))
		}
	}
	ps.wg.Wait()
	return errors.Join(append(errs, ps.err)...)
}

// drainProcs drains the backlog with relays in separate processes, each
// with its own pool and producer, all with BatchSize batch.
func (e *env) drainProcs(ctx context.Context, warm string, n, batch, procs int, extra ...string) (drainRun, error) {
	prog := newProgress(n)
	ps, err := e.startRelayProcs(ctx, procs, batch, false, warm, prog.add, extra...)
	if err != nil {
		return drainRun{}, err
	}
	pg0 := e.pgBackendCPU(ctx)
	t0 := time.Now()
	if err := ps.start(); err != nil {
		_ = ps.stop()
		return drainRun{}, err
	}
	elapsed, capped := prog.wait(ctx, t0, e.p.drainCap())
	pgUsed := pg0.until(e.pgBackendCPU(ctx)) // before the processes close their sessions
	if err := ps.stop(); err != nil {
		return drainRun{}, err
	}
	if err := e.checkDrained(ctx, capped); err != nil {
		return drainRun{}, err
	}
	res := result(min(prog.n.Load(), int64(n)), elapsed, capped)
	res.setPG(pgUsed)
	return res, nil
}

// checkDrained fails when a drain that was not cut short left events.
func (e *env) checkDrained(ctx context.Context, capped bool) error {
	if capped {
		return nil
	}
	var left int
	if err := e.pool.QueryRow(ctx, "SELECT count(*) FROM "+ident(e.table)+" WHERE published_at IS NULL").Scan(&left); err != nil {
		return err
	}
	if left != 0 {
		return fmt.Errorf("%d events left unpublished after the drain", left)
	}
	return nil
}

// pgCPU is the CPU time of the benchmark's PostgreSQL backends, by pid.
type pgCPU map[int]float64

// pgBackendCPU reads the CPU time (user + system, from /proc) of every
// PostgreSQL backend serving a session of the benchmark (application_name
// fxbench: its pool and its relay processes). It is nil when PostgreSQL
// does not run on this machine. Unlike the machine-wide figures it leaves
// out other sessions' load, and PostgreSQL's background processes (WAL
// writer, autovacuum, checkpointer).
func (e *env) pgBackendCPU(ctx context.Context) pgCPU {
	rows, err := e.pool.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE application_name = $1", appName)
	if err != nil {
		return nil
	}
	var pids []int
	for rows.Next() {
		var p int
		if rows.Scan(&p) == nil {
			pids = append(pids, p)
		}
	}
	rows.Close()
	out := pgCPU{}
	for _, p := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(p) + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) < 13 {
			continue
		}
		u, _ := strconv.ParseFloat(f[11], 64)
		k, _ := strconv.ParseFloat(f[12], 64)
		out[p] = (u + k) / clockTick
	}
	if len(out) == 0 {
		return nil // not on this machine
	}
	return out
}

// until returns the CPU seconds the backends used from a to b (a backend
// that started meanwhile counts from zero); -1 when unknown.
func (a pgCPU) until(b pgCPU) float64 {
	if a == nil || b == nil {
		return -1
	}
	used := 0.0
	for pid, t := range b {
		used += t - a[pid]
	}
	return used
}

// setPG records the PostgreSQL backend CPU of a run (seconds; -1 unknown).
func (r *drainRun) setPG(seconds float64) {
	if seconds < 0 || r.Published == 0 {
		return
	}
	r.PGCPUS = round3(seconds)
	r.PGUsPerEvent = round2(seconds / float64(r.Published) * 1e6)
}
