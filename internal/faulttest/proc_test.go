package faulttest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
)

// The re-exec fault tests run a relay in a child process: the test binary
// runs itself with -test.run=^TestHelperRelayProcess$ and these variables.
const (
	envHelperMode   = "FAULTTEST_HELPER_MODE"    // "kill" or "freeze"
	envHelperSchema = "FAULTTEST_HELPER_SCHEMA"  // the outbox table's schema
	envHelperKafka  = "FAULTTEST_HELPER_BROKERS" // comma-separated
	envHelperAfter  = "FAULTTEST_HELPER_AFTER"   // kill: SIGKILL after this many acknowledged batches
	envHelperApp    = "FAULTTEST_HELPER_APP"     // the child's PostgreSQL application_name
	envHelperHold   = "FAULTTEST_HELPER_HOLD"    // freeze: how long the first batch is held
	// envHelperDelivery is the child relay's delivery ("exactly-once" or
	// "at-least-once"; startHelper passes the world's).
	envHelperDelivery = "FAULTTEST_HELPER_DELIVERY"
	// envHelperProgress is the child relay's progress ("cursor" or
	// "marks"; startHelper passes the world's).
	envHelperProgress = "FAULTTEST_HELPER_PROGRESS"
	// envHelperBatchTimeout and envHelperTxnTimeout set the child relay's
	// BatchTimeout and TransactionTimeout (mode "run"; default: the
	// relay's defaults).
	envHelperBatchTimeout = "FAULTTEST_HELPER_BATCH_TIMEOUT"
	envHelperTxnTimeout   = "FAULTTEST_HELPER_TXN_TIMEOUT"
	// helperBatchTimeout is the exactly-once frozen child's BatchTimeout
	// (mode "run"): PostgreSQL ends its transaction BatchTimeout + 5s after
	// its last statement.
	helperBatchTimeout = 2 * time.Second
	// helperFreezeBatchTimeout is the BatchTimeout of a child in mode
	// "freeze". The freeze tests check what happens while its lanes are
	// still held (other lanes flow), an order of events and not a duration,
	// but the hold ends by the clock: at BatchTimeout + 5s the server ends
	// the frozen transaction. 15s leaves a loaded machine 20s to show the
	// order (with 2s, a run at load 30 once took 7.06s for the other lanes).
	helperFreezeBatchTimeout = 15 * time.Second
	// helperLifetime ends a child whose parent vanished without killing it.
	helperLifetime = 3 * time.Minute
	// linePrefix marks the child's reports on its stdout (the test
	// framework writes there too).
	linePrefix = "FAULTTEST "
)

// TestHelperRelayProcess is not a test: it is the relay process that the
// re-exec fault tests start (see startHelper). It runs a relay on the
// parent's table whose publisher wraps relay.SaramaPublisher:
//
//   - mode "kill": after FAULTTEST_HELPER_AFTER acknowledged batches it
//     reports the last batch's event ids ("KILL id,id,...") and SIGKILLs its
//     own process right after Publish returned, i.e. between the Kafka ack
//     and the database commit;
//   - mode "freeze": its first batch reports "HOLDING id,id,..." and then
//     holds the claimed rows (the parent SIGSTOPs the process meanwhile) for
//     FAULTTEST_HELPER_HOLD of wall time; then it sends that stale batch
//     anyway, reports "STALE <n> <err>", and relays normally;
//   - mode "run": no hook, the parent stops and kills it when it likes.
//
// With FAULTTEST_HELPER_DELIVERY=exactly-once the relay publishes through
// its own transactional producers and never calls the publisher, so the
// hooks of "kill" and "freeze" sit in the relay's database instead (see
// markHookDB): at the statement that marks a batch's rows published, which
// the relay sends after the batch's Kafka transaction committed. "KILL"
// then SIGKILLs the process between the Kafka commit and the database
// mark, "HOLDING" holds a committed batch, and "STALE <n> <err>" reports
// how its late mark went.
//
// With FAULTTEST_HELPER_PROGRESS=cursor (at-least-once) the relay writes no
// mark: a batch ends with the statement that saves its lanes' positions
// ("UPDATE <table>_cursor c SET done = ..."), sent after the batch's Kafka
// ack, in the batch's transaction, before its commit. The hooks of "kill"
// and "freeze" sit there (see markHookDB): the publisher only records the
// batch it got acknowledged, "KILL" SIGKILLs the process when the positions
// after that batch are about to be saved, "HOLDING" holds them, and
// "STALE <n> <err>" reports how the late save went.
func TestHelperRelayProcess(t *testing.T) {
	mode := os.Getenv(envHelperMode)
	if mode == "" {
		t.Skip("not a test: the relay process the re-exec fault tests start (FAULTTEST_HELPER_MODE is unset)")
	}
	fail := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "helper: "+format+"\n", args...)
		os.Exit(3)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, helperLifetime)
	defer cancel()

	pcfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		fail("DATABASE_URL: %v", err)
	}
	pcfg.ConnConfig.RuntimeParams["application_name"] = os.Getenv(envHelperApp)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		fail("connect: %v", err)
	}
	defer pool.Close()
	inner, err := relay.NewSaramaPublisher(strings.Split(os.Getenv(envHelperKafka), ","), nil)
	if err != nil {
		fail("publisher: %v", err)
	}
	defer inner.Close()
	pub := &faultPublisher{inner: inner, mode: mode}
	delivery, err := parseChoice(os.Getenv(envHelperDelivery), relay.AtLeastOnce, relay.ExactlyOnce)
	if err != nil {
		fail("%s: %v", envHelperDelivery, err)
	}
	progress, err := parseChoice(os.Getenv(envHelperProgress), relay.ProgressMarks, relay.ProgressCursor)
	if err != nil {
		fail("%s: %v", envHelperProgress, err)
	}
	table := outbox.Table{Schema: os.Getenv(envHelperSchema)}
	cfg := &relay.Config{
		Table: table, BatchSize: batchSize, MaxBatchSize: maxBatchSize,
		PollInterval: pollInterval, MaxBackoff: maxBackoff, Delivery: delivery, Progress: progress,
		// Debug: the tests read when an exactly-once worker was fenced.
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	switch mode {
	case "kill":
		if pub.killAfter, err = strconv.Atoi(os.Getenv(envHelperAfter)); err != nil || pub.killAfter < 1 {
			fail("%s=%q: want a positive number", envHelperAfter, os.Getenv(envHelperAfter))
		}
	case "freeze":
		if pub.hold, err = time.ParseDuration(os.Getenv(envHelperHold)); err != nil {
			fail("%s: %v", envHelperHold, err)
		}
		cfg.BatchTimeout = helperFreezeBatchTimeout
	case "run":
		for env, d := range map[string]*time.Duration{envHelperBatchTimeout: &cfg.BatchTimeout, envHelperTxnTimeout: &cfg.TransactionTimeout} {
			if v := os.Getenv(env); v != "" {
				if *d, err = time.ParseDuration(v); err != nil {
					fail("%s: %v", env, err)
				}
			}
		}
	default:
		fail("unknown mode %q", mode)
	}
	var db relay.DB = pool
	var use relay.Publisher = pub
	if delivery == relay.ExactlyOnce {
		// The relay publishes through inner's brokers and configuration
		// itself; the hooks sit at the batch's mark, or under cursor
		// progress at the positions' save, both after the Kafka commit.
		use = inner
		db = &markHookDB{pool: pool, mark: "UPDATE " + sqlname.Ident(table) + " SET published_at = now() WHERE id = ANY($1)",
			onMark: pub.onMark(pool, table)}
		if progress == relay.ProgressCursor {
			db = &markHookDB{pool: pool, save: cursorSave(table), onMark: pub.onMark(pool, table)}
		}
	} else if progress == relay.ProgressCursor && (mode == "kill" || mode == "freeze") {
		// The hooks sit at the positions' save, which follows the ack.
		pub.atSave = true
		db = &markHookDB{pool: pool, save: cursorSave(table), onMark: pub.onSave()}
	}
	r, err := relay.New(db, use, cfg)
	if err != nil {
		fail("relay: %v", err)
	}
	if err := r.Start(ctx); err != nil {
		fail("start: %v", err)
	}
	report("STARTED", strconv.Itoa(os.Getpid()))
	<-ctx.Done()
	sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer scancel()
	_ = r.Stop(sctx)
}

// report writes one line for the parent on stdout.
func report(what, detail string) {
	fmt.Fprintf(os.Stdout, "%s%s %s\n", linePrefix, what, detail)
}

// faultPublisher is the child relay's Publisher (the relay calls it from
// one goroutine).
type faultPublisher struct {
	inner     relay.Publisher
	mode      string
	killAfter int
	acked     int
	hold      time.Duration
	held      bool
	// atSave: the hooks sit at the positions' save (cursor progress);
	// Publish records the acknowledged batch in pending for onSave.
	atSave  bool
	pending []relay.Message
}

func (p *faultPublisher) Publish(ctx context.Context, msgs []relay.Message) error {
	switch {
	case p.atSave:
		p.pending = nil
		err := p.inner.Publish(ctx, msgs)
		if err == nil {
			p.pending = msgs
		}
		return err
	case p.mode == "kill":
		if err := p.inner.Publish(ctx, msgs); err != nil {
			return err
		}
		if p.acked++; p.acked == p.killAfter {
			report("KILL", eventIDs(msgs))
			// Acknowledged by Kafka; the relay has not marked the rows
			// nor committed. A crash here must lose nothing.
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			time.Sleep(time.Hour)
		}
		return nil
	case p.mode == "freeze" && !p.held:
		p.held = true
		report("HOLDING", eventIDs(msgs))
		// Wall time: after a SIGSTOP longer than hold, this returns at once
		// on SIGCONT, with the batch's context long expired.
		time.Sleep(p.hold)
		err := p.inner.Publish(context.WithoutCancel(ctx), msgs)
		report("STALE", fmt.Sprintf("%d %v", len(msgs), err))
		return err
	}
	return p.inner.Publish(ctx, msgs)
}

// onMark is faultPublisher's hook at an exactly-once batch's mark (see
// markHookDB): the batch's Kafka transaction committed, the rows are not
// marked yet.
func (p *faultPublisher) onMark(pool *pgxpool.Pool, table outbox.Table) func(ctx context.Context, ids []int64) func(error) {
	eventIDs := func(ctx context.Context, ids []int64) string {
		var eids []string
		if err := pool.QueryRow(ctx, "SELECT array_agg(event_id::text ORDER BY id) FROM "+sqlname.Ident(table)+" WHERE id = ANY($1)", ids).Scan(&eids); err != nil {
			fmt.Fprintf(os.Stderr, "helper: event ids of the batch: %v\n", err)
			os.Exit(3)
		}
		return strings.Join(eids, ",")
	}
	return func(ctx context.Context, ids []int64) func(error) {
		switch {
		case p.mode == "kill":
			if p.acked++; p.acked == p.killAfter {
				report("KILL", eventIDs(ctx, ids))
				// Committed to Kafka; the relay has not marked the rows.
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				time.Sleep(time.Hour)
			}
		case p.mode == "freeze" && !p.held:
			p.held = true
			report("HOLDING", eventIDs(ctx, ids))
			time.Sleep(p.hold) // wall time, as in Publish
			return func(err error) { report("STALE", fmt.Sprintf("%d %v", len(ids), err)) }
		}
		return nil
	}
}

// onSave is faultPublisher's hook at the save of a cursor batch's
// positions (see markHookDB): the batch's events were acknowledged by
// Kafka, the lanes' positions are not saved nor the batch committed. A save
// that follows no acknowledged batch (lanes whose windows were empty, idle
// lanes taken along) is no batch of the hook's.
func (p *faultPublisher) onSave() func(ctx context.Context, ids []int64) func(error) {
	return func(context.Context, []int64) func(error) {
		msgs := p.pending
		p.pending = nil
		if len(msgs) == 0 {
			return nil
		}
		switch {
		case p.mode == "kill":
			if p.acked++; p.acked == p.killAfter {
				report("KILL", eventIDs(msgs))
				// Acknowledged by Kafka; the positions are not saved.
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				time.Sleep(time.Hour)
			}
		case p.mode == "freeze" && !p.held:
			p.held = true
			report("HOLDING", eventIDs(msgs))
			time.Sleep(p.hold) // wall time, as in Publish
			return func(err error) { report("STALE", fmt.Sprintf("%d %v", len(msgs), err)) }
		}
		return nil
	}
}

// cursorSave is how the statement saving a cursor relay's positions in
// table begins.
func cursorSave(table outbox.Table) string {
	return "UPDATE " + sqlname.Ident(sqlname.Cursor(table)) + " c SET done = "
}

// markHookDB is the relay's database in an exactly-once relay process: a
// pool whose transactions call onMark before they send the statement mark
// (the batch's mark, not the read-back's, which differs), with the ids
// marked. A function onMark returns is called with the outcome of the
// batch of statements holding the mark. With save set instead of mark (a
// cursor relay), onMark is called before a batch of statements holding one
// that starts with save, the positions' save, with no ids.
type markHookDB struct {
	pool   *pgxpool.Pool
	mark   string
	save   string
	onMark func(ctx context.Context, ids []int64) func(error)
}

func (d *markHookDB) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &markHookTx{Tx: tx, db: d}, nil
}

type markHookTx struct {
	pgx.Tx
	db *markHookDB
	// read: the transaction read events to publish (a cursor claim's
	// read). A save in a transaction that did not (the idle lanes' sweep,
	// the positions an exactly-once relay takes over) is no batch's.
	read bool
}

// cursorReadPrefix is how a cursor claim's read of events begins (not the
// sweep's read of ids).
const cursorReadPrefix = "SELECT e.id, e.event_id"

func (tx *markHookTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if strings.HasPrefix(sql, cursorReadPrefix) {
		tx.read = true
	}
	return tx.Tx.Query(ctx, sql, args...)
}

func (tx *markHookTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	for _, q := range b.QueuedQueries {
		if strings.HasPrefix(q.SQL, cursorReadPrefix) {
			tx.read = true
		}
	}
	for _, q := range b.QueuedQueries {
		var ids []int64
		switch {
		case tx.db.save != "" && strings.HasPrefix(q.SQL, tx.db.save) && tx.read:
		case tx.db.mark != "" && q.SQL == tx.db.mark && len(q.Arguments) == 1:
			ids, _ = q.Arguments[0].([]int64)
		default:
			continue
		}
		if after := tx.db.onMark(ctx, ids); after != nil {
			return &reportingResults{BatchResults: tx.Tx.SendBatch(ctx, b), after: after}
		}
		break
	}
	return tx.Tx.SendBatch(ctx, b)
}

// reportingResults hands the outcome of a batch of statements to after.
type reportingResults struct {
	pgx.BatchResults
	after func(error)
}

func (r *reportingResults) Close() error {
	err := r.BatchResults.Close()
	r.after(err)
	return err
}

func eventIDs(msgs []relay.Message) string {
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.EventID.String()
	}
	return strings.Join(ids, ",")
}

// proc is a child process started by a test, killed and reaped at cleanup.
type proc struct {
	t      *testing.T
	name   string
	cmd    *exec.Cmd
	lines  chan string // stdout lines (for the helper: only its reports, prefix cut)
	exited chan struct{}
	stderr *lockedBuffer
	state  *os.ProcessState
	// dumped: the process was sent SIGQUIT for its goroutines' stacks
	// (see next), and its whole stderr is worth printing.
	dumped atomic.Bool
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startProc starts cmd; filter, if not nil, selects and rewrites the stdout
// lines that reach p.lines. At cleanup a process still running is SIGKILLed
// (a stopped one too) and reaped; a failed test logs its stderr.
func startProc(t *testing.T, name string, cmd *exec.Cmd, filter func(string) (string, bool)) *proc {
	t.Helper()
	p := &proc{t: t, name: name, cmd: cmd, lines: make(chan string, 1000), exited: make(chan struct{}), stderr: &lockedBuffer{}}
	cmd.Stderr = p.stderr
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	cmd.Env = append(cmd.Env, "GOTRACEBACK=all") // a SIGQUIT prints every goroutine (see next)
	dieWithParent(cmd)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if filter != nil {
				var ok bool
				if line, ok = filter(line); !ok {
					continue
				}
			}
			select {
			case p.lines <- line:
			default: // nobody reads that many lines
			}
		}
		_ = cmd.Wait() // after the reads: the pipe is drained
		p.state = cmd.ProcessState
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			keep := 4 << 10
			if p.dumped.Load() {
				keep = 256 << 10
			}
			if s := p.stderr.String(); s != "" {
				t.Logf("%s (pid %d) stderr, last %d KiB:\n%s", name, cmd.Process.Pid, keep>>10, s[max(0, len(s)-keep):])
			}
		}
	})
	return p
}

// next waits for the next line starting with prefix and returns the rest.
func (p *proc) next(prefix string, timeout time.Duration) string {
	p.t.Helper()
	deadline := time.After(timeout)
	exited := p.exited
	for {
		select {
		case l := <-p.lines:
			if rest, ok := strings.CutPrefix(l, prefix); ok {
				return strings.TrimSpace(rest)
			}
		case <-exited:
			// Lines written before the exit may still be queued: look at
			// them, then give up.
			exited = nil
			deadline = time.After(100 * time.Millisecond)
		case <-deadline:
			if exited == nil {
				p.t.Fatalf("%s exited (%v) before reporting %q", p.name, p.state, prefix)
			}
			// Still running, and silent: its goroutines' stacks say where
			// it waits (printed with its stderr by the cleanup).
			p.dumped.Store(true)
			_ = p.cmd.Process.Signal(syscall.SIGQUIT)
			select {
			case <-p.exited:
			case <-time.After(10 * time.Second):
			}
			p.t.Fatalf("%s did not report %q within %v (sent SIGQUIT: its goroutines are in its stderr below)", p.name, prefix, timeout)
		}
	}
}

// wait waits for the process to exit and returns its state.
func (p *proc) wait(timeout time.Duration) *os.ProcessState {
	p.t.Helper()
	select {
	case <-p.exited:
		return p.state
	case <-time.After(timeout):
		p.t.Fatalf("%s (pid %d) still running after %v", p.name, p.cmd.Process.Pid, timeout)
		return nil
	}
}

func (p *proc) signal(sig syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("%v to %s: %v", sig, p.name, err)
	}
}

// startHelper re-executes the test binary as a relay process on w's table
// (see TestHelperRelayProcess).
func startHelper(t *testing.T, w *world, mode string, env ...string) *proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperRelayProcess$", "-test.count=1", "-test.timeout=5m")
	cmd.Env = append(os.Environ(),
		envHelperMode+"="+mode,
		envHelperSchema+"="+w.table.Schema,
		envHelperKafka+"="+strings.Join(w.brokers, ","),
		envHelperDelivery+"="+w.delivery.String(),
		envHelperProgress+"="+w.progress.String(),
	)
	cmd.Env = append(cmd.Env, env...)
	p := startProc(t, "relay process ("+mode+")", cmd, func(l string) (string, bool) {
		return strings.CutPrefix(l, linePrefix)
	})
	p.next("STARTED", 60*time.Second)
	return p
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func portOpen(port int) bool {
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// skipOrFail skips the test with msg, or fails it under OUTBOX_TEST_REQUIRE=1.
func skipOrFail(t *testing.T, msg string) {
	t.Helper()
	if os.Getenv("OUTBOX_TEST_REQUIRE") == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// buildExamples builds the example module's commands into a temporary
// directory and returns it.
func buildExamples(t *testing.T, cmds ...string) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("go"); err != nil {
		skipOrFail(t, "this test builds examples/cmd binaries and needs the go command in PATH")
	}
	dir := t.TempDir()
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	for _, c := range cmds {
		args = append(args, "./cmd/"+c)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = filepath.Join(root, "examples")
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s (in examples/): %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("built %v in %v", cmds, time.Since(start).Round(time.Millisecond))
	return dir
}

// startDevKafka runs the development broker binary (built by
// buildExamples) on a free port of its own and returns its address.
func startDevKafka(t *testing.T, bin string) string {
	t.Helper()
	cmd := exec.Command(bin, "-port", "0", "-partitions", "6")
	p := startProc(t, "devkafka", cmd, nil)
	t.Cleanup(func() { // before startProc's cleanup: stop it politely
		select {
		case <-p.exited:
		default:
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.exited:
			case <-time.After(10 * time.Second):
			}
		}
	})
	addr := p.next("KAFKA_BROKERS=", 30*time.Second)
	t.Logf("devkafka (pid %d) on %s", cmd.Process.Pid, addr)
	return addr
}
