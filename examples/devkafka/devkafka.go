// Package devkafka runs a development Kafka-protocol broker inside a Go
// process, for tests and the demo.
//
// It is an in-memory development broker built on kfake
// (github.com/twmb/franz-go/pkg/kfake), a fake Kafka cluster written in Go. It
// is NOT Apache Kafka: it speaks the Kafka wire protocol well enough for
// clients such as IBM/sarama (including idempotent producers), but it keeps
// every record in memory, loses everything when it stops, has a single broker
// and no replication, and its timing, error and rebalancing behaviour only
// approximates a real cluster. Use it to develop and to run fast tests; run
// benchmarks and failure tests that matter against a real Kafka.
//
// The broker listens on 127.0.0.1 only.
package devkafka

import (
	"fmt"
	"io"
	"net"
	"strconv"

	"github.com/twmb/franz-go/pkg/kfake"
)

// DefaultPartitions is the default partition count of topics created without
// an explicit count (auto-created topics, and CreateTopics with -1).
const DefaultPartitions = 12

// Config configures [Start]. The zero value is valid: a random free port on
// 127.0.0.1, 12 partitions per created topic, and no automatic topic creation.
// [DefaultConfig] returns the settings the demo uses.
type Config struct {
	// Port is the TCP port to listen on, on 127.0.0.1. 0 picks a random free
	// port; read it back with [Broker.Addrs].
	Port int

	// Partitions is the partition count of topics created without an explicit
	// count: topics auto-created by a metadata request and CreateTopics
	// requests with NumPartitions -1. 0 means [DefaultPartitions].
	Partitions int

	// AutoCreateTopics lets metadata requests that ask for it create missing
	// topics (Kafka's auto.create.topics.enable). sarama asks for it by
	// default (Metadata.AllowAutoTopicCreation).
	AutoCreateTopics bool

	// ClusterID is returned in metadata responses. Empty means "fxoutbox-dev".
	ClusterID string

	// Log, if non-nil, receives the broker's log lines at LogLevel.
	Log io.Writer
	// LogLevel is the kfake log level used with Log; 0 (none) means
	// kfake.LogLevelInfo.
	LogLevel kfake.LogLevel
}

// DefaultConfig returns the demo's settings: a random free port, 12
// partitions, and automatic topic creation.
func DefaultConfig() Config {
	return Config{Partitions: DefaultPartitions, AutoCreateTopics: true}
}

// Broker is a running in-memory development broker (kfake); see the package
// documentation.
type Broker struct {
	cluster *kfake.Cluster
	addrs   []string
}

// Start starts an in-memory development broker (kfake, not Apache Kafka) on
// 127.0.0.1 and returns once it accepts connections.
func Start(cfg Config) (*Broker, error) {
	if cfg.Port < 0 || cfg.Port > 65535 {
		return nil, fmt.Errorf("devkafka: invalid port %d", cfg.Port)
	}
	if cfg.Partitions < 0 {
		return nil, fmt.Errorf("devkafka: invalid partition count %d", cfg.Partitions)
	}
	parts := cfg.Partitions
	if parts == 0 {
		parts = DefaultPartitions
	}
	clusterID := cfg.ClusterID
	if clusterID == "" {
		clusterID = "fxoutbox-dev"
	}
	opts := []kfake.Opt{
		// One broker: Ports sets the broker count to the number of ports.
		kfake.Ports(cfg.Port),
		kfake.ListenFn(listenLoopback),
		kfake.DefaultNumPartitions(parts),
		kfake.ClusterID(clusterID),
	}
	if cfg.AutoCreateTopics {
		opts = append(opts, kfake.AllowAutoTopicCreation())
	}
	if cfg.Log != nil {
		level := cfg.LogLevel
		if level == kfake.LogLevelNone {
			level = kfake.LogLevelInfo
		}
		opts = append(opts, kfake.WithLogger(kfake.BasicLogger(cfg.Log, level)))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return nil, fmt.Errorf("devkafka: start broker on 127.0.0.1:%d: %w", cfg.Port, err)
	}
	return &Broker{cluster: c, addrs: c.ListenAddrs()}, nil
}

// listenLoopback is kfake's listen function, restricted to IPv4 loopback:
// the development broker must never be reachable from other machines.
func listenLoopback(network, address string) (net.Listener, error) {
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return nil, err
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return nil, fmt.Errorf("devkafka: refusing to listen on non-loopback address %q", address)
	}
	if network == "tcp" {
		network = "tcp4"
	}
	return net.Listen(network, net.JoinHostPort("127.0.0.1", port))
}

// Addrs returns the broker's host:port addresses (one, on 127.0.0.1), to use
// as the client's bootstrap servers.
func (b *Broker) Addrs() []string {
	return append([]string(nil), b.addrs...)
}

// Port returns the TCP port the broker listens on.
func (b *Broker) Port() int {
	if len(b.addrs) == 0 {
		return 0
	}
	_, p, err := net.SplitHostPort(b.addrs[0])
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(p)
	return n
}

// Cluster returns the underlying kfake cluster, for tests that want its
// control hooks (for example to inject produce errors or to move partition
// leadership).
func (b *Broker) Cluster() *kfake.Cluster {
	return b.cluster
}

// Close stops the broker and drops all its data. It is safe to call more than
// once.
func (b *Broker) Close() {
	if b == nil || b.cluster == nil {
		return
	}
	b.cluster.Close()
}
