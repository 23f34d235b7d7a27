package faulttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// pgCluster is a PostgreSQL cluster of the test's own, run by scripts/pg.sh
// in <repo>/.cache/pg-faulttest, so that restarting it disturbs no other
// test.
type pgCluster struct {
	root string
	env  []string
	url  string
}

const defaultPGPort = 55433

// ownPG starts (or reuses) the fault tests' PostgreSQL cluster and stops it
// at cleanup (its directory is kept for the next run). The port is
// OUTBOX_FAULTTEST_PG_PORT, else 55433, else, when something else holds
// 55433, a free one.
func ownPG(t *testing.T) *pgCluster {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, ".cache", "pg-faulttest")
	var env []string
	for _, kv := range os.Environ() {
		// pg.sh up would use DATABASE_URL instead of starting a cluster.
		if !strings.HasPrefix(kv, "DATABASE_URL=") && !strings.HasPrefix(kv, "OUTBOX_PG_") {
			env = append(env, kv)
		}
	}
	c := &pgCluster{root: root, env: append(env, "OUTBOX_PG_DIR="+dir)}
	port := defaultPGPort
	if v := os.Getenv("OUTBOX_FAULTTEST_PG_PORT"); v != "" {
		if port, err = strconv.Atoi(v); err != nil {
			t.Fatalf("OUTBOX_FAULTTEST_PG_PORT=%q: want a port number", v)
		}
	} else if _, _, err := c.run(30*time.Second, "status"); err != nil && portOpen(port) {
		port = freePort(t)
		t.Logf("port %d is taken by another server; the fault tests' cluster uses %d", defaultPGPort, port)
	}
	c.env = append(c.env, "OUTBOX_PG_PORT="+strconv.Itoa(port))
	start := time.Now()
	out, stderr, err := c.run(2*time.Minute, "up")
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 2 { // pg.sh: server binaries not found
		skipOrFail(t, "this test restarts a PostgreSQL cluster of its own through scripts/pg.sh, "+
			"which needs the server binaries (apt-get install postgresql): "+strings.TrimSpace(stderr))
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, _, err := c.run(2*time.Minute, "down"); err != nil {
			t.Errorf("stop the test's PostgreSQL cluster: %v", err)
		}
	})
	url, ok := strings.CutPrefix(strings.TrimSpace(out), "DATABASE_URL=")
	if !ok {
		t.Fatalf("scripts/pg.sh up printed %q, want DATABASE_URL=...", out)
	}
	c.url = url
	t.Logf("own PostgreSQL cluster %s up in %v", dir, time.Since(start).Round(time.Millisecond))
	return c
}

func (c *pgCluster) run(timeout time.Duration, args ...string) (string, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", append([]string{filepath.Join(c.root, "scripts", "pg.sh")}, args...)...)
	cmd.Dir, cmd.Env = c.root, c.env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		err = fmt.Errorf("scripts/pg.sh %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), stderr.String(), err
}

func (c *pgCluster) pool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), c.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// TestRelaySurvivesPostgresRestart restarts PostgreSQL (pg_ctl restart -m
// fast: every session is terminated) while writers commit and a relay with
// Listen publishes. Writers fail during the restart and go on; the relay,
// never restarted, reconnects by itself (pool and LISTEN connection) and
// publishes every committed event, first deliveries in per-key order, with
// at most one batch of duplicates. After the restart the relay LISTENs
// again (its session is on the restarted server) and the probe events it
// is notified of are published.
//
// It needs the PostgreSQL server binaries (for a cluster of its own, on
// port 55433 or OUTBOX_FAULTTEST_PG_PORT) and KAFKA_BROKERS.
func TestRelaySurvivesPostgresRestart(t *testing.T) {
	brokers := testenv.Brokers(t)
	pg := ownPG(t)
	pool := pg.pool(t)
	w := newWorldOn(t, pool, brokers, 30)

	// Writers notify the relay after each commit, as fxoutbox's do.
	notifier, err := unitofwork.NewNotifier(pool, w.table, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(notifier.Close)
	if w.uow, err = unitofwork.New(pool, &unitofwork.Config{Table: w.table, OnCommit: notifier.OnCommit}); err != nil {
		t.Fatal(err)
	}

	// A long poll interval, so that the relay runs mostly on wake-ups.
	const poll = 3 * time.Second
	stopRelay := w.startRelayWith(t, func(c *relay.Config) {
		c.Listen, c.PollInterval, c.MaxBackoff = true, poll, poll
	})
	ws := w.startWriters(t, 4)
	waitFor(t, 30*time.Second, "the relay to publish 300 events", func() bool { return w.published(t) >= 300 })

	before := ws.commits.Load()
	start := time.Now()
	if _, _, err := pg.run(2*time.Minute, "restart"); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	t.Logf("PostgreSQL restarted in %v", restarted.Sub(start).Round(time.Millisecond))

	waitFor(t, 30*time.Second, "writers to commit again after the restart", func() bool {
		return ws.commits.Load() > before+200
	})
	time.Sleep(time.Second)
	errs := ws.halt()
	t.Logf("writers: %d commits, %d failed (expected around the restart), first failure: %v", ws.commits.Load(), len(errs), firstErr(errs))

	took := waitFor(t, 60*time.Second, "the relay to publish every row after the restart", func() bool {
		n, err := countRows(w, w.waiting())
		return err == nil && n == 0
	})
	t.Logf("backlog drained %v after the writers stopped (%v after the restart)", took.Round(time.Millisecond), time.Since(restarted).Round(time.Millisecond))

	// The relay's LISTEN connection came back: every session was ended by
	// the restart, so a session LISTENing on the table's channel is a new
	// one. (Asserted as a state, not as a wake-up latency, which the
	// machine's load stretches.)
	listen := "LISTEN " + pgx.Identifier{sqlname.Channel(w.table)}.Sanitize()
	waitFor(t, 30*time.Second, "the relay's LISTEN session on the restarted server", func() bool {
		var n int
		err := pool.QueryRow(w.ctx, "SELECT count(*) FROM pg_stat_activity WHERE query = $1 AND state = 'idle'", listen).Scan(&n)
		return err == nil && n == 1
	})
	for i := range 3 {
		key := w.key(i)
		if err := w.commit(w.ctx, key); err != nil {
			t.Fatal(err)
		}
		sent := time.Now()
		notifier.Notify()
		waitFor(t, 30*time.Second, "the probe event to be published", func() bool { return w.unpublished(t) == 0 })
		t.Logf("probe %d published %v after its commit", i, time.Since(sent).Round(time.Millisecond))
	}
	if n := w.count(t, "attempts > 0 OR parked_at IS NOT NULL"); n != 0 {
		t.Errorf("%d rows charged with attempts or parked: a database restart is not the events' fault", n)
	}
	stopRelay()
	w.verify(t, 1)
}

func countRows(w *world, where string) (int, error) {
	var n int
	err := w.pool.QueryRow(w.ctx, "SELECT count(*) FROM "+sqlname.Ident(w.table)+" WHERE "+where).Scan(&n)
	return n, err
}

func firstErr(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	return errs[0]
}
