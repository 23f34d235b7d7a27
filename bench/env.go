package main

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx", for watermill-sql
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/migrations"
	"github.com/fxoutbox/outbox/relay"
)

// schema holds every table the benchmark creates, so it never touches the
// tables of tests or demos that share the cluster.
const schema = "fxbench"

// cursorTable is the outbox table of the relays with cursor progress
// (relay.ProgressCursor); its positions table is cursor_event_cursor.
var cursorTable = outbox.Table{Schema: schema, Name: "cursor_event"}

// tableNamed is the benchmark's table of that name ("" the default one),
// for the child processes (FXBENCH_TABLE).
func tableNamed(name string) outbox.Table { return outbox.Table{Schema: schema, Name: name} }

type env struct {
	p          params
	pool       *pgxpool.Pool
	sqldb      *sql.DB // database/sql over pgx's stdlib driver, for watermill
	brokers    []string
	brokerKind string
	cluster    *kfake.Cluster
	admin      sarama.ClusterAdmin
	client     sarama.Client
	table      outbox.Table
	// ctable is a second outbox table, with the cursor migration
	// (migrations.Cursor.Up), for the relays with relay.ProgressCursor: its
	// rows are never marked, so it is kept apart from the marks relays'.
	ctable   outbox.Table
	topicSeq atomic.Int64
}

func setup(ctx context.Context, p params) (*env, error) {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		return nil, errors.New("DATABASE_URL is not set: run `make bench`, or eval \"export $(scripts/pg.sh up)\" first")
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	cfg.MaxConns = 48
	cfg.MinConns = 4
	cfg.ConnConfig.RuntimeParams["application_name"] = appName
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		return nil, fmt.Errorf("PostgreSQL at DATABASE_URL does not answer: %w", err)
	}
	sqldb, err := sql.Open("pgx", url)
	if err != nil {
		return nil, err
	}
	sqldb.SetMaxOpenConns(24)
	sqldb.SetMaxIdleConns(24)
	e := &env{p: p, pool: pool, sqldb: sqldb, table: outbox.Table{Schema: schema}, ctable: cursorTable}
	if err := e.setupSchema(ctx); err != nil {
		return nil, err
	}
	if err := e.setupBroker(); err != nil {
		return nil, err
	}
	return e, nil
}

func (e *env) close() {
	if e.client != nil {
		_ = e.client.Close()
	}
	if e.admin != nil {
		_ = e.admin.Close()
	}
	if e.cluster != nil {
		e.cluster.Close()
	}
	_ = e.sqldb.Close()
	e.pool.Close()
}

// setupSchema recreates the benchmark schema: the fxoutbox table (through
// the library's own migrations), a business table, and a copy of the outbox
// table without secondary indexes (to price them).
func (e *env) setupSchema(ctx context.Context) error {
	if _, err := e.pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
		return err
	}
	if err := migrations.Outbox.Up(ctx, e.pool, e.table); err != nil {
		return err
	}
	// The cursor relays' table: the same migrations, then the cursor's.
	if err := migrations.Outbox.Up(ctx, e.pool, e.ctable); err != nil {
		return err
	}
	if err := migrations.Cursor.Up(ctx, e.pool, e.ctable); err != nil {
		return err
	}
	for _, q := range []string{
		`CREATE TABLE ` + schema + `.orders (
			id          text PRIMARY KEY,
			customer_id text NOT NULL,
			total_cents bigint NOT NULL,
			status      text NOT NULL,
			created_at  timestamptz NOT NULL DEFAULT now())`,
		// Same columns as the outbox table, primary key only.
		`CREATE TABLE ` + schema + `.outbox_noidx (LIKE ` + ident(e.table) + ` INCLUDING DEFAULTS INCLUDING IDENTITY)`,
		`ALTER TABLE ` + schema + `.outbox_noidx ADD PRIMARY KEY (id)`,
	} {
		if _, err := e.pool.Exec(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", firstLine(q), err)
		}
	}
	// The payload shape must be what the issue asks for, as PostgreSQL
	// stores and returns it.
	var n int
	if err := e.pool.QueryRow(ctx, "SELECT length(($1::jsonb)::text)", string(payload(1, 1))).Scan(&n); err != nil {
		return err
	}
	if n != e.p.PayloadBytes {
		return fmt.Errorf("payload is %d bytes as jsonb text, want %d", n, e.p.PayloadBytes)
	}
	return nil
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i > 0 {
		return s[:i]
	}
	return s
}

// setupBroker connects to KAFKA_BROKERS, or starts kfake in this process.
func (e *env) setupBroker() error {
	if s := os.Getenv("KAFKA_BROKERS"); s != "" {
		for _, a := range strings.Split(s, ",") {
			if a = strings.TrimSpace(a); a != "" {
				e.brokers = append(e.brokers, a)
			}
		}
		e.brokerKind = "apache-kafka"
		if k := os.Getenv("BENCH_BROKER_KIND"); k != "" {
			e.brokerKind = k // e.g. "kfake (scripts/devkafka.sh)" when KAFKA_BROKERS is not Apache Kafka
		}
	} else {
		c, err := kfake.NewCluster(
			kfake.NumBrokers(1),
			kfake.DefaultNumPartitions(e.p.Partitions),
			kfake.ListenFn(func(network, address string) (net.Listener, error) {
				_, port, err := net.SplitHostPort(address)
				if err != nil {
					return nil, err
				}
				return net.Listen("tcp4", net.JoinHostPort("127.0.0.1", port))
			}),
		)
		if err != nil {
			return fmt.Errorf("start kfake: %w", err)
		}
		e.cluster = c
		e.brokers = c.ListenAddrs()
		e.brokerKind = "kfake (in-memory)"
	}
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V2_8_0_0
	cfg.ClientID = "fxbench-admin"
	client, err := sarama.NewClient(e.brokers, cfg)
	if err != nil {
		return fmt.Errorf("connect to Kafka %v: %w", e.brokers, err)
	}
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return err
	}
	// A second client for offsets, so admin calls and offset polls do not share state.
	oc, err := sarama.NewClient(e.brokers, cfg)
	if err != nil {
		return err
	}
	e.admin, e.client = admin, oc
	return nil
}

// newTopic creates a fresh topic with the configured partitions.
func (e *env) newTopic(prefix string) (string, error) { return e.newTopicN(prefix, e.p.Partitions) }

// newTopicN creates a fresh topic with parts partitions and waits until
// every partition takes writes: a KRaft broker publishes the metadata before
// it can take writes for a new partition, so a leader in the metadata is not
// enough; ListOffsets must answer.
func (e *env) newTopicN(prefix string, parts int) (string, error) {
	name := fmt.Sprintf("fxbench.%s.%d.%d", prefix, time.Now().Unix()%100000, e.topicSeq.Add(1))
	if err := e.admin.CreateTopic(name, &sarama.TopicDetail{NumPartitions: int32(parts), ReplicationFactor: 1}, false); err != nil {
		return "", fmt.Errorf("create topic %s: %w", name, err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		_ = e.client.RefreshMetadata(name)
		ps, err := e.client.Partitions(name)
		if err == nil && len(ps) == parts {
			ok := true
			for _, p := range ps {
				if _, err = e.client.GetOffset(name, p, sarama.OffsetNewest); err != nil {
					ok = false
					break
				}
			}
			if ok {
				return name, nil
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("topic %s not ready: %v", name, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (e *env) dropTopic(name string) {
	if err := e.admin.DeleteTopic(name); err != nil {
		log.Printf("delete topic %s: %v", name, err)
	}
}

// topicCount returns the number of records in a topic (sum of the
// partitions' high watermarks; the topics are fresh, so they start at 0).
func (e *env) topicCount(topic string) (int64, error) {
	if err := e.client.RefreshMetadata(topic); err != nil {
		return 0, err
	}
	ps, err := e.client.Partitions(topic)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, p := range ps {
		o, err := e.client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return 0, err
		}
		n += o
	}
	return n, nil
}

// producerConfig is the producer the relay uses (relay.DefaultSaramaConfig):
// idempotent, acks=all, one request in flight. Every contender and the raw
// producer ceiling use it, so they are compared at the same guarantees.
func producerConfig(clientID string) *sarama.Config {
	c := relay.DefaultSaramaConfig()
	c.ClientID = clientID
	// sarama's own producers (the seed relay's SyncProducer, the raw
	// producer ceiling) need their acknowledgements returned; the relay's
	// publisher does not read these two settings.
	c.Producer.Return.Successes = true
	c.Producer.Return.Errors = true
	return c
}

// checkpoint flushes dirty buffers before a timed run so that a checkpoint
// triggered by the previous contender's writes does not land in the next one.
func (e *env) checkpoint(ctx context.Context) {
	if _, err := e.pool.Exec(ctx, "CHECKPOINT"); err != nil {
		log.Printf("CHECKPOINT: %v (continuing)", err)
	}
}

// Machine describes where the numbers come from.
type Machine struct {
	NProc           int     `json:"nproc"`
	CPU             string  `json:"cpu"`
	MemoryGiB       float64 `json:"memory_gib"`
	Kernel          string  `json:"kernel"`
	GoVersion       string  `json:"go"`
	PGVersion       string  `json:"pg_version"`
	PGSettings      string  `json:"pg_settings"`
	Broker          string  `json:"broker"`
	LoadAvgStart    string  `json:"loadavg_start"`
	LoadAvgEnd      string  `json:"loadavg_end"`
	SharedMachine   string  `json:"note"`
	GOMAXPROCS      int     `json:"gomaxprocs"`
	PGMaxConnection int     `json:"-"`
}

func (e *env) machine(ctx context.Context) Machine {
	m := Machine{
		NProc:         runtime.NumCPU(),
		CPU:           cpuModel(),
		MemoryGiB:     memGiB(),
		Kernel:        kernel(),
		GoVersion:     runtime.Version(),
		Broker:        e.brokerKind,
		LoadAvgStart:  loadavg(),
		GOMAXPROCS:    runtime.GOMAXPROCS(0),
		SharedMachine: "PostgreSQL, the broker (when kfake) and the benchmark share the same cores",
	}
	var v string
	if err := e.pool.QueryRow(ctx, "SELECT current_setting('server_version')").Scan(&v); err == nil {
		m.PGVersion = "PostgreSQL " + v
	}
	var s string
	if err := e.pool.QueryRow(ctx, `SELECT string_agg(name || '=' || current_setting(name), ' ' ORDER BY name)
		FROM pg_settings WHERE name IN ('fsync','synchronous_commit','shared_buffers','wal_level','max_wal_size','full_page_writes')`).Scan(&s); err == nil {
		m.PGSettings = s
	}
	return m
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}

func memGiB() float64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "MemTotal:") {
			var kb float64
			fmt.Sscanf(strings.TrimSpace(strings.TrimPrefix(l, "MemTotal:")), "%f", &kb)
			return round1(kb / 1024 / 1024)
		}
	}
	return 0
}

func kernel() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return runtime.GOOS
	}
	return runtime.GOOS + " " + strings.TrimSpace(string(b))
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// Library identifies the fxoutbox code that was measured.
type Library struct {
	Commit      string   `json:"commit"`
	Dirty       bool     `json:"dirty"`
	RelayConfig []string `json:"relay_config_fields"`
	Deps        []string `json:"deps"`
}

func libraryInfo() Library {
	l := Library{RelayConfig: relayConfigFields()}
	if out, err := exec.Command("git", "-C", "..", "rev-parse", "--short", "HEAD").Output(); err == nil {
		l.Commit = strings.TrimSpace(string(out))
	}
	if out, err := exec.Command("git", "-C", "..", "status", "--porcelain", "--untracked-files=no", "--", "relay", "unitofwork", "outbox.go", "event.go", "table.go").Output(); err == nil {
		l.Dirty = len(strings.TrimSpace(string(out))) > 0
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			switch d.Path {
			case "github.com/IBM/sarama", "github.com/jackc/pgx/v5", "github.com/ThreeDotsLabs/watermill",
				"github.com/ThreeDotsLabs/watermill-sql/v4", "github.com/ThreeDotsLabs/watermill-kafka/v3",
				"github.com/twmb/franz-go/pkg/kfake":
				l.Deps = append(l.Deps, d.Path+"@"+d.Version)
			}
		}
	}
	return l
}

// ident quotes t's schema-qualified name for SQL text.
func ident(t outbox.Table) string {
	t = t.WithDefaults()
	if t.Schema == "" {
		return pgx.Identifier{t.Name}.Sanitize()
	}
	return pgx.Identifier{t.Schema, t.Name}.Sanitize()
}
