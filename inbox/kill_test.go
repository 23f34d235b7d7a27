package inbox_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/inbox"
	"github.com/fxoutbox/outbox/unitofwork"
)

// The kill test runs consumers in child processes: the test binary runs
// itself with -test.run=^TestHelperInboxProcess$ and these variables.
const (
	envHelperSchema = "INBOX_HELPER_SCHEMA"
	envHelperTopic  = "INBOX_HELPER_TOPIC"
	envHelperGroup  = "INBOX_HELPER_GROUP"
	envHelperMember = "INBOX_HELPER_MEMBER"
	envHelperKill   = "INBOX_HELPER_KILL_AFTER" // SIGKILL itself right after this many commits; 0 never
	envHelperBatch  = "INBOX_HELPER_BATCH_SIZE"
)

// TestHelperInboxProcess is not a test: it is the consumer process that
// TestKilledBetweenCommitAndOffsetCommit starts. Its handler records an
// effect and adds an outbox event; the unit of work's OnCommit hook, which
// runs after the database commit and before the inbox marks the offset,
// SIGKILLs the process at the configured commit.
func TestHelperInboxProcess(t *testing.T) {
	schema := os.Getenv(envHelperSchema)
	if schema == "" {
		t.Skip("not a test: the consumer process TestKilledBetweenCommitAndOffsetCommit starts")
	}
	ctx, stopSignals := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stopSignals()
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute) // a child whose parent vanished
	defer cancel()
	killAfter, _ := strconv.Atoi(os.Getenv(envHelperKill))
	batch, _ := strconv.Atoi(os.Getenv(envHelperBatch))
	e := &env{t: t, pool: poolFromEnv(t), table: outbox.Table{Schema: schema}, inbox: outbox.Table{Schema: schema},
		brokers: strings.Split(os.Getenv("KAFKA_BROKERS"), ","), topic: os.Getenv(envHelperTopic), effects: `"` + schema + `".effects`, batch: batch}
	var commits atomic.Int64
	uow, err := unitofwork.New(e.pool, &unitofwork.Config{Table: e.table, OnCommit: func(int) {
		if n := commits.Add(1); killAfter > 0 && n == int64(killAfter) {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL) // after the commit, before the offset is marked
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	e.uow = uow
	effect := e.effect(os.Getenv(envHelperMember))
	c := e.start(e.config(os.Getenv(envHelperGroup), func(ctx context.Context, tx unitofwork.Tx, m *inbox.Message) error {
		if err := effect(ctx, tx, m); err != nil {
			return err
		}
		time.Sleep(time.Millisecond)
		return tx.Add(ctx, outbox.Event{Topic: "x", AggregateType: "a", AggregateID: string(m.Key), Type: "applied.v1", Payload: map[string]string{"id": m.ID}})
	}))
	<-ctx.Done()
	stop(t, c)
}

// Consumers SIGKILLed right after a database commit, before its offset is
// marked (twice, in real child processes), lose nothing and apply nothing
// twice: the records after the last committed offset come again to the
// next member and the inbox drops those already applied.
func TestKilledBetweenCommitAndOffsetCommit(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	t.Parallel()
	modes(t, 3, func(t *testing.T, e *env) {
		g := group()
		all := e.produce(events(400, 20)...)
		run := func(member string, killAfter int) *exec.Cmd {
			cmd := exec.Command(os.Args[0], "-test.run=^TestHelperInboxProcess$", "-test.v")
			cmd.Env = append(os.Environ(), envHelperSchema+"="+e.table.Schema, envHelperTopic+"="+e.topic, envHelperGroup+"="+g,
				envHelperMember+"="+member, envHelperKill+"="+strconv.Itoa(killAfter), envHelperBatch+"="+strconv.Itoa(e.batch))
			if testing.Verbose() {
				cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			return cmd
		}
		for i, member := range []string{"first", "second"} {
			cmd := run(member, 120)
			err := cmd.Wait()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("child %d ended with %v, want killed by SIGKILL", i, err)
			}
		}
		killed := e.count()
		if killed < 200 {
			t.Fatalf("%d effects after two children each killed at their 120th commit, want at least 200", killed)
		}
		last := run("last", 0)
		e.waitEffects(len(all))
		e.waitCommitted(g, 3, len(all), 90*time.Second)
		_ = last.Process.Signal(syscall.SIGTERM)
		if err := last.Wait(); err != nil {
			t.Errorf("last child: %v", err)
		}
		e.checkOnce(all)
		t.Logf("%d effects before the last child; %d events applied once each", killed, len(all))
	})
}
