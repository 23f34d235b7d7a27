package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// JavaOrderPartitions12 is the partition of the keys "order-0" ..
// "order-199" on a topic of 12 partitions as Apache Kafka 4.4's Java
// producer chooses it (BuiltInPartitioner.partitionForKey, which its
// default partitioner and the console producer use: murmur2), computed
// with the kafka-clients jar that scripts/kafka.sh caches. Tests on any
// broker check the relay's default against it; the real-broker test in
// package fxoutbox checks the same keys against the Java producer itself.
var JavaOrderPartitions12 = [200]int32{
	4, 10, 3, 3, 2, 2, 9, 1, 5, 10, 6, 6, 7, 5, 10, 4, 0, 9, 11, 3, 7, 8, 9, 11, 6,
	2, 4, 6, 11, 1, 5, 4, 7, 1, 7, 8, 10, 7, 1, 3, 3, 8, 0, 10, 8, 11, 4, 1, 0, 7,
	10, 5, 3, 0, 6, 9, 7, 5, 5, 8, 6, 6, 7, 2, 6, 8, 1, 10, 7, 3, 2, 1, 5, 4, 0,
	0, 1, 0, 4, 7, 10, 8, 11, 8, 10, 0, 3, 1, 8, 10, 1, 9, 8, 6, 10, 3, 5, 1, 11, 6,
	1, 10, 6, 3, 9, 8, 6, 6, 6, 9, 2, 2, 3, 2, 7, 7, 9, 2, 7, 10, 2, 3, 11, 1, 11,
	3, 4, 6, 1, 8, 2, 1, 5, 0, 10, 6, 5, 3, 3, 4, 0, 9, 4, 3, 5, 6, 4, 5, 9, 7,
	7, 7, 6, 10, 6, 6, 10, 1, 1, 7, 11, 11, 0, 3, 2, 11, 2, 1, 7, 2, 3, 6, 9, 0, 10,
	9, 0, 8, 4, 5, 0, 0, 11, 8, 1, 7, 0, 9, 0, 7, 10, 1, 10, 9, 3, 5, 3, 10, 2, 8,
}

// RealKafka skips the test unless OUTBOX_TEST_REAL_KAFKA=1 (make
// test-kafka: KAFKA_BROKERS is an Apache Kafka broker), and fails or skips
// it (OUTBOX_TEST_REQUIRE) when Java, which Kafka's own tools need, is
// missing.
func RealKafka(t testing.TB) {
	t.Helper()
	if os.Getenv("OUTBOX_TEST_REAL_KAFKA") != "1" {
		t.Skip("this test runs Apache Kafka's Java tools against a real broker: set OUTBOX_TEST_REAL_KAFKA=1 (make test-kafka does)")
	}
	if _, err := exec.LookPath("java"); err != nil {
		msg := "Apache Kafka's tools (scripts/kafka.sh tool) need Java 17+ (apt-get install openjdk-17-jre-headless)"
		if os.Getenv("OUTBOX_TEST_REQUIRE") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
}

// KafkaTool runs an Apache Kafka command-line class (e.g.
// org.apache.kafka.tools.ConsoleProducer) in one JVM, with the classpath of
// the broker jars scripts/kafka.sh caches (`scripts/kafka.sh tool`), stdin
// as its input, and returns its standard output. The tool's log (warnings)
// goes to the test's log; a failure or a run longer than timeout fails the
// test. It calls RealKafka first.
func KafkaTool(t testing.TB, timeout time.Duration, stdin string, class string, args ...string) string {
	t.Helper()
	RealKafka(t)
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", append([]string{filepath.Join(root, "scripts", "kafka.sh"), "tool", class}, args...)...)
	cmd.Dir = root
	// The tool's generated config files (its log4j2 setup) go to a state
	// dir of the test's own, not the broker's.
	cmd.Env = append(os.Environ(), "KAFKA_STATE_DIR="+t.TempDir())
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err = cmd.Run()
	if s := strings.TrimSpace(stderr.String()); s != "" {
		t.Logf("%s stderr:\n%s", class, s)
	}
	if err != nil {
		t.Fatalf("scripts/kafka.sh tool %s %s: %v (after %v)", class, strings.Join(args, " "), err, time.Since(start).Round(time.Millisecond))
	}
	t.Logf("%s ran %v", class, time.Since(start).Round(time.Millisecond))
	return stdout.String()
}

// RepoRoot walks up from the working directory (a package's directory
// under go test) to the repository's root: the directory holding go.mod
// and scripts/kafka.sh.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if exists(filepath.Join(dir, "go.mod")) && exists(filepath.Join(dir, "scripts", "kafka.sh")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("testenv: no go.mod with scripts/kafka.sh above the working directory")
		}
		dir = parent
	}
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// ConsoleRecord is one record as Apache Kafka's console consumer
// (org.apache.kafka.tools.consumer.ConsoleConsumer) printed it with
// ConsoleConsumerFormat.
type ConsoleRecord struct {
	Partition int32
	Headers   map[string]string
	Key       string
	Value     string
}

// ConsoleConsumerFormat are the console consumer's formatter properties
// ParseConsoleRecords reads: partition, headers, key and value, separated
// by a byte that no key, header or JSON value of the tests holds.
var ConsoleConsumerFormat = []string{
	"--formatter-property", "print.partition=true",
	"--formatter-property", "print.headers=true",
	"--formatter-property", "print.key=true",
	"--formatter-property", "key.separator=\x1f",
	"--formatter-property", "headers.separator=\x1e",
}

// ParseConsoleRecords parses the console consumer's output printed with
// ConsoleConsumerFormat (lines "Partition:<n>", headers "k:v" joined by
// 0x1e or "NO_HEADERS", key, value, separated by 0x1f). Other lines (the
// tool's "Processed a total of N messages") are skipped. A record that
// carries a header name twice is an error.
func ParseConsoleRecords(out string) ([]ConsoleRecord, error) {
	var recs []ConsoleRecord
	for _, line := range strings.Split(out, "\n") {
		fields := strings.Split(line, "\x1f")
		if len(fields) < 4 {
			continue
		}
		if len(fields) != 4 {
			return nil, fmt.Errorf("console consumer line with %d fields, want 4: %q", len(fields), line)
		}
		var r ConsoleRecord
		if _, err := fmt.Sscanf(fields[0], "Partition:%d", &r.Partition); err != nil {
			return nil, fmt.Errorf("console consumer line %q: partition: %w", line, err)
		}
		r.Headers = map[string]string{}
		if fields[1] != "NO_HEADERS" {
			for _, h := range strings.Split(fields[1], "\x1e") {
				k, v, _ := strings.Cut(h, ":")
				if _, twice := r.Headers[k]; twice {
					// A Java consumer's lastHeader and kafkajs's arrays
					// would disagree on such a record.
					return nil, fmt.Errorf("console consumer line %q: header %q appears twice", line, k)
				}
				r.Headers[k] = v
			}
		}
		r.Key, r.Value = fields[2], fields[3]
		recs = append(recs, r)
	}
	return recs, nil
}

// ConsoleConsume reads topic from its beginning with Apache Kafka's console
// consumer (a client the project does not use) at isolation level
// isolation ("read_committed": records of aborted transactions are
// skipped, and those of open ones wait until their end; "read_uncommitted":
// every record), until no record came for idle, and returns the records in
// the order it printed them (each partition's in offset order).
func ConsoleConsume(t testing.TB, brokers []string, topic, isolation string, idle time.Duration) []ConsoleRecord {
	t.Helper()
	out := KafkaTool(t, 5*time.Minute, "", "org.apache.kafka.tools.consumer.ConsoleConsumer",
		append([]string{"--bootstrap-server", strings.Join(brokers, ","), "--topic", topic, "--from-beginning",
			"--isolation-level", isolation, "--timeout-ms", fmt.Sprint(idle.Milliseconds())}, ConsoleConsumerFormat...)...)
	recs, err := ParseConsoleRecords(out)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}
