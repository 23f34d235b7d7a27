package admin_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// cluster is a PostgreSQL cluster of one test's own, for the settings the
// shared server must keep (wal_level, max_replication_slots, ...): changing
// them takes a restart.
type cluster struct {
	bin, dir string
	port     int
	asPG     bool // run the server binaries as the postgres user (we are root)
}

// newCluster runs initdb in a fresh directory, removed when the test ends.
// It skips the test when the server binaries are missing, unless
// OUTBOX_TEST_REQUIRE=1.
func newCluster(t *testing.T) *cluster {
	t.Helper()
	if os.Getenv("DATABASE_URL") == "" && os.Getenv("OUTBOX_TEST_REQUIRE") != "1" {
		t.Skip("DATABASE_URL is not set: the PostgreSQL tests are off")
	}
	bin := os.Getenv("OUTBOX_PG_BINDIR")
	if bin == "" {
		if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
			bin = strings.TrimSpace(string(out))
		}
	}
	if _, err := os.Stat(filepath.Join(bin, "initdb")); err != nil {
		matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
		if len(matches) == 0 {
			msg := "this test starts a PostgreSQL cluster of its own and needs the server binaries (initdb, pg_ctl; set OUTBOX_PG_BINDIR)"
			if os.Getenv("OUTBOX_TEST_REQUIRE") == "1" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
		bin = filepath.Dir(matches[len(matches)-1])
	}
	dir, err := os.MkdirTemp("", "fxoutbox-admin-pg-")
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{bin: bin, dir: dir, asPG: os.Geteuid() == 0}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if c.asPG {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root, the server must run as the postgres user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	c.run(t, "initdb", "-D", c.data(), "-A", "trust", "-U", "postgres", "--no-sync")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c.port = l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	t.Cleanup(func() {
		if _, err := os.Stat(filepath.Join(c.data(), "postmaster.pid")); err == nil {
			c.run(t, "pg_ctl", "stop", "-D", c.data(), "-m", "immediate", "-w")
		}
	})
	return c
}

func (c *cluster) data() string { return filepath.Join(c.dir, "data") }

func (c *cluster) run(t *testing.T, prog string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, prog), args...)
	if c.asPG {
		quoted := []string{filepath.Join(c.bin, prog)}
		for _, a := range args {
			quoted = append(quoted, "'"+strings.ReplaceAll(a, "'", `'\''`)+"'")
		}
		cmd = exec.CommandContext(ctx, "su", "postgres", "-s", "/bin/sh", "-c", strings.Join(quoted, " "))
	}
	cmd.Dir = "/"
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", prog, strings.Join(args, " "), err, out.String())
	}
}

// start (re)starts the server with settings (name=value) and returns a
// pool on its postgres database, closed when the test ends.
func (c *cluster) start(t *testing.T, settings ...string) *pgxpool.Pool {
	t.Helper()
	if _, err := os.Stat(filepath.Join(c.data(), "postmaster.pid")); err == nil {
		c.run(t, "pg_ctl", "stop", "-D", c.data(), "-m", "fast", "-w")
	}
	opts := fmt.Sprintf("-c listen_addresses=127.0.0.1 -c port=%d -c unix_socket_directories=%s -c fsync=off", c.port, c.dir)
	for _, s := range settings {
		opts += " -c " + s
	}
	c.run(t, "pg_ctl", "start", "-D", c.data(), "-w", "-t", "60", "-l", filepath.Join(c.dir, "log"), "-o", opts)
	pool, err := pgxpool.New(context.Background(), fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}
