// Command devkafka runs an in-memory development Kafka-protocol broker (kfake,
// not Apache Kafka) as its own process, for tests and the demo.
//
//	devkafka [-port 59092] [-partitions 12] [-auto-create=true] [-pidfile FILE] [-v]
//
// Once it listens it prints KAFKA_BROKERS=127.0.0.1:<port> on stdout (and
// nothing else there), so a script can read the line. It listens on 127.0.0.1
// only, keeps everything in memory, and stops cleanly on SIGINT or SIGTERM.
// scripts/devkafka.sh builds and starts it in the background.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/fxoutbox/outbox/examples/devkafka"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	fs := flag.NewFlagSet("devkafka", flag.ContinueOnError)
	port := fs.Int("port", 59092, "TCP port to listen on, on 127.0.0.1 (0 = random free port)")
	partitions := fs.Int("partitions", devkafka.DefaultPartitions, "partition count of auto-created topics (and CreateTopics with -1)")
	autoCreate := fs.Bool("auto-create", true, "create missing topics on metadata requests that ask for it")
	pidfile := fs.String("pidfile", "", "write the process id to this file once listening; removed on exit")
	verbose := fs.Bool("v", false, "log broker requests to stderr")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "devkafka: unexpected arguments: %s\n", strings.Join(fs.Args(), " "))
		return 2
	}

	cfg := devkafka.Config{
		Port:             *port,
		Partitions:       *partitions,
		AutoCreateTopics: *autoCreate,
		Log:              os.Stderr,
		LogLevel:         kfake.LogLevelWarn,
	}
	if *verbose {
		cfg.LogLevel = kfake.LogLevelInfo
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	b, err := devkafka.Start(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "devkafka: %v\n", err)
		return 1
	}
	defer b.Close()

	if *pidfile != "" {
		if err := writePidfile(*pidfile); err != nil {
			fmt.Fprintf(os.Stderr, "devkafka: %v\n", err)
			return 1
		}
		defer removePidfile(*pidfile)
	}

	fmt.Fprintf(os.Stderr, "devkafka: development in-memory Kafka-protocol broker (kfake, not Apache Kafka; data is lost on exit) listening on %s, %d partitions per auto-created topic, auto-create=%v\n",
		strings.Join(b.Addrs(), ","), effectivePartitions(*partitions), *autoCreate)
	fmt.Printf("KAFKA_BROKERS=%s\n", strings.Join(b.Addrs(), ","))

	<-ctx.Done()
	fmt.Fprintln(os.Stderr, "devkafka: signal received, stopping")
	return 0
}

func effectivePartitions(n int) int {
	if n == 0 {
		return devkafka.DefaultPartitions
	}
	return n
}

func writePidfile(path string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return fmt.Errorf("write pidfile: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write pidfile: %w", err)
	}
	return nil
}

// removePidfile removes path only if it still names this process.
func removePidfile(path string) {
	b, err := os.ReadFile(path)
	if err != nil {
		return
	}
	if strings.TrimSpace(string(b)) == strconv.Itoa(os.Getpid()) {
		_ = os.Remove(path)
	}
}
