package faulttest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fxoutbox/outbox/internal/testenv"
)

// broker is the package's own Apache Kafka broker, run by scripts/kafka.sh
// in a state directory and on ports of its own.
type broker struct {
	root string   // the repository root, which holds scripts/kafka.sh
	env  []string // the script's environment: state dir and ports
	addr string   // host:port of the broker's listener
	dir  string   // KAFKA_STATE_DIR
}

var (
	brokerMu  sync.Mutex
	theBroker *broker
)

// Below the kernel's ephemeral port range (32768-60999 by default), so that no
// client connection of a running test can hold the port when the broker
// (re)starts.
const defaultPort = 29192

// faultBroker skips the test unless OUTBOX_TEST_REAL_KAFKA=1, and otherwise
// returns the package's broker, running.
func faultBroker(t *testing.T) *broker {
	t.Helper()
	needRealKafka(t)
	brokerMu.Lock()
	defer brokerMu.Unlock()
	if theBroker == nil {
		root, err := testenv.RepoRoot()
		if err != nil {
			t.Fatal(err)
		}
		port := defaultPort
		if v := os.Getenv("OUTBOX_FAULTTEST_KAFKA_PORT"); v != "" {
			if port, err = strconv.Atoi(v); err != nil || port < 1 || port > 65534 {
				t.Fatalf("OUTBOX_FAULTTEST_KAFKA_PORT=%q: want a port number", v)
			}
		}
		dir := filepath.Join(root, ".cache", "kafka-faulttest")
		theBroker = &broker{
			root: root,
			dir:  dir,
			addr: fmt.Sprintf("127.0.0.1:%d", port),
			env: append(os.Environ(),
				"KAFKA_STATE_DIR="+dir,
				"KAFKA_PORT="+strconv.Itoa(port),
				"KAFKA_CONTROLLER_PORT="+strconv.Itoa(port+1),
			),
		}
	}
	theBroker.up(t)
	return theBroker
}

// needRealKafka skips the test unless OUTBOX_TEST_REAL_KAFKA=1, and fails
// or skips it (OUTBOX_TEST_REQUIRE) when Java is missing.
func needRealKafka(t *testing.T) {
	t.Helper()
	if os.Getenv("OUTBOX_TEST_REAL_KAFKA") != "1" {
		t.Skip("fault tests SIGKILL and restart a real Apache Kafka broker (scripts/kafka.sh): " +
			"set OUTBOX_TEST_REAL_KAFKA=1 to run them (make test-kafka does)")
	}
	if _, err := exec.LookPath("java"); err != nil {
		msg := "fault tests run their own Apache Kafka broker through scripts/kafka.sh, which needs Java 17+ (apt-get install openjdk-17-jre-headless)"
		if os.Getenv("OUTBOX_TEST_REQUIRE") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
}

func (b *broker) brokers() []string { return []string{b.addr} }

// run runs scripts/kafka.sh with args and returns its stdout; its stderr
// (the script's log) comes back in the error.
func (b *broker) run(timeout time.Duration, args ...string) (string, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", append([]string{filepath.Join(b.root, "scripts", "kafka.sh")}, args...)...)
	cmd.Dir = b.root
	cmd.Env = b.env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		err = fmt.Errorf("scripts/kafka.sh %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), stderr.String(), err
}

// up starts the broker (or finds it running) and waits until it serves.
func (b *broker) up(t *testing.T) {
	t.Helper()
	start := time.Now()
	out, _, err := b.run(3*time.Minute, "up")
	if err != nil {
		t.Fatal(err)
	}
	if want := "KAFKA_BROKERS=" + b.addr; strings.TrimSpace(out) != want {
		t.Fatalf("scripts/kafka.sh up printed %q, want %q", out, want)
	}
	t.Logf("broker %s up in %v", b.addr, time.Since(start).Round(time.Millisecond))
}

// kill SIGKILLs the broker: no controlled shutdown, its data dir is kept.
func (b *broker) kill(t *testing.T) {
	t.Helper()
	if _, _, err := b.run(time.Minute, "kill"); err != nil {
		t.Fatal(err)
	}
	t.Logf("broker %s killed (SIGKILL)", b.addr)
}

// destroyBroker kills the package's broker, if one was started, and deletes
// its data directory.
func destroyBroker() error {
	brokerMu.Lock()
	defer brokerMu.Unlock()
	if theBroker == nil {
		return nil
	}
	if _, _, err := theBroker.run(time.Minute, "kill"); err != nil {
		return err
	}
	if keep := os.Getenv("OUTBOX_FAULTTEST_BROKER_LOG"); keep != "" {
		// The broker's own log (its transaction coordinator's decisions,
		// its recovery after each SIGKILL), kept for a failure's study.
		if b, err := os.ReadFile(filepath.Join(theBroker.dir, "broker.log")); err == nil {
			_ = os.WriteFile(keep, b, 0o644)
		}
	}
	_, _, err := theBroker.run(time.Minute, "destroy")
	return err
}
