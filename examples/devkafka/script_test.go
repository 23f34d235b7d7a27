package devkafka_test

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
)

// script runs scripts/devkafka.sh in the repository, as a developer would,
// with one DEVKAFKA_PORT.
type script struct {
	t    *testing.T
	path string // scripts/devkafka.sh
	repo string
}

func newScript(t *testing.T) *script {
	t.Helper()
	for _, tool := range []string{"bash", "go"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("OUTBOX_TEST_REQUIRE") == "1" {
				t.Fatalf("scripts/devkafka.sh needs %s in PATH: %v", tool, err)
			}
			t.Skipf("scripts/devkafka.sh needs %s in PATH", tool)
		}
	}
	repo, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return &script{t: t, path: filepath.Join(repo, "scripts", "devkafka.sh"), repo: repo}
}

type scriptResult struct {
	stdout, stderr string
	code           int
}

// run runs the script with DEVKAFKA_PORT=port and env, without the
// caller's KAFKA_BROKERS and DEVKAFKA_ variables (with KAFKA_BROKERS set,
// up starts nothing).
func (s *script) run(port int, env []string, args ...string) scriptResult {
	s.t.Helper()
	cmd := exec.Command("bash", append([]string{s.path}, args...)...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KAFKA_BROKERS=") && !strings.HasPrefix(kv, "DEVKAFKA_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, fmt.Sprintf("DEVKAFKA_PORT=%d", port))
	cmd.Env = append(cmd.Env, env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := scriptResult{stdout: out.String(), stderr: errb.String()}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		r.code = exit.ExitCode()
	case err != nil:
		s.t.Fatalf("devkafka.sh %s: %v", strings.Join(args, " "), err)
	}
	return r
}

// up starts (or reuses) the broker on port and returns its address, having
// checked that stdout is the KAFKA_BROKERS line alone.
func (s *script) up(port int, env ...string) string {
	s.t.Helper()
	r := s.run(port, env, "up")
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	if r.code != 0 || r.stdout != "KAFKA_BROKERS="+addr+"\n" {
		s.t.Fatalf("DEVKAFKA_PORT=%d %s devkafka.sh up: exit %d, stdout %q, want only KAFKA_BROKERS=%s\nstderr: %s",
			port, strings.Join(env, " "), r.code, r.stdout, addr, r.stderr)
	}
	return addr
}

// status returns the exit code of status on port: 0 running, 3 not.
func (s *script) status(port int) int {
	s.t.Helper()
	return s.run(port, nil, "status").code
}

// freePorts returns n distinct TCP ports free on 127.0.0.1 a moment ago.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	for range n {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

func listening(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		_ = c.Close()
	}
	return err == nil
}

// sendToMissing sends one record to a topic that does not exist.
func sendToMissing(addr, topic string) error {
	cfg := producerConfig(sarama.V2_8_0_0)
	cfg.Producer.Retry.Max = 1
	cfg.Metadata.Retry.Max = 1
	p, err := sarama.NewSyncProducer([]string{addr}, cfg)
	if err != nil {
		return fmt.Errorf("new producer: %w", err)
	}
	defer p.Close()
	_, _, err = p.SendMessage(&sarama.ProducerMessage{Topic: topic, Value: sarama.StringEncoder("x")})
	return err
}

// Two brokers from scripts/devkafka.sh side by side: each port has its own
// broker and state, DEVKAFKA_AUTO_CREATE=off starts one on which a produce
// to a missing topic fails, and down on one port leaves the other running.
func TestScriptBrokerPerPort(t *testing.T) {
	s := newScript(t)
	ports := freePorts(t, 2)
	first, second := ports[0], ports[1]
	t.Cleanup(func() {
		for _, p := range ports {
			if r := s.run(p, nil, "down"); r.code != 0 {
				t.Errorf("devkafka.sh down on port %d: exit %d: %s", p, r.code, r.stderr)
			}
			for _, ext := range []string{"log", "lock"} {
				_ = os.Remove(filepath.Join(s.repo, ".cache", fmt.Sprintf("devkafka-%d.%s", p, ext)))
			}
		}
	})

	a1 := s.up(first)
	a2 := s.up(second, "DEVKAFKA_AUTO_CREATE=off")
	for _, p := range ports {
		if code := s.status(p); code != 0 {
			t.Fatalf("status on port %d: exit %d, want 0 (running)", p, code)
		}
		if r := s.run(p, nil, "url"); r.stdout != fmt.Sprintf("KAFKA_BROKERS=127.0.0.1:%d\n", p) {
			t.Fatalf("url on port %d: %q", p, r.stdout)
		}
	}
	if _, err := os.Stat(filepath.Join(s.repo, ".cache", fmt.Sprintf("devkafka-%d.pid", second))); err != nil {
		t.Errorf("the second broker has no pid file of its own: %v", err)
	}

	// Auto-creation off on the second: the produce fails as on a broker
	// with auto.create.topics.enable=false; on the first it creates the topic.
	if err := sendToMissing(a2, "script-missing"); !errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
		t.Fatalf("produce to a missing topic with DEVKAFKA_AUTO_CREATE=off: err = %v, want %v", err, sarama.ErrUnknownTopicOrPartition)
	}
	if err := roundTrip([]string{a2}, sarama.V2_8_0_0, "script-created", 20, true); err != nil {
		t.Fatalf("a created topic on the broker without auto-creation: %v", err)
	}
	if err := sendToMissing(a1, "script-auto"); err != nil {
		t.Fatalf("produce to a missing topic with auto-creation on: %v", err)
	}

	// up again on the second: the same broker when the settings agree,
	// an error naming the difference when they do not.
	s.up(second, "DEVKAFKA_AUTO_CREATE=off")
	if r := s.run(second, nil, "up"); r.code == 0 || r.stdout != "" || !strings.Contains(r.stderr, "runs with auto-create off") {
		t.Fatalf("up with auto-creation on, on the port of a broker running without: exit %d, stdout %q, stderr %s", r.code, r.stdout, r.stderr)
	}
	if r := s.run(second, []string{"DEVKAFKA_AUTO_CREATE=perhaps"}, "up"); r.code == 0 || !strings.Contains(r.stderr, "DEVKAFKA_AUTO_CREATE=perhaps") {
		t.Fatalf("up with DEVKAFKA_AUTO_CREATE=perhaps: exit %d, stderr %s", r.code, r.stderr)
	}

	// down stops the second only.
	if r := s.run(second, nil, "down"); r.code != 0 {
		t.Fatalf("down on port %d: exit %d: %s", second, r.code, r.stderr)
	}
	if code := s.status(second); code != 3 || listening(a2) {
		t.Fatalf("after down, the second broker: status exit %d (want 3), listening %v", code, listening(a2))
	}
	if code := s.status(first); code != 0 {
		t.Fatalf("down on port %d stopped the broker on port %d too (status exit %d)", second, first, code)
	}
	if err := roundTrip([]string{a1}, sarama.V2_8_0_0, "script-after", 20, false); err != nil {
		t.Fatalf("the first broker after the second stopped: %v", err)
	}
	if r := s.run(first, nil, "down"); r.code != 0 {
		t.Fatalf("down on port %d: exit %d: %s", first, r.code, r.stderr)
	}
	if code := s.status(first); code != 3 || listening(a1) {
		t.Fatalf("after down, the first broker: status exit %d (want 3), listening %v", code, listening(a1))
	}
}
