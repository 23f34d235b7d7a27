package faulttest

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/fxoutbox/outbox/internal/testenv"
)

// cluster is three Apache Kafka nodes (each broker and controller, a static
// quorum of three voters), run by scripts/kafka.sh in state directories and
// on ports of their own, so that partitions have three replicas and a
// leader can be killed while the other two go on.
type cluster struct {
	nodes []*broker
}

const (
	clusterNodes = 3
	// clusterBasePort: node i listens on base+2i, its controller on
	// base+2i+1 (below the ephemeral ports); OUTBOX_FAULTTEST_CLUSTER_PORT
	// moves the six ports.
	clusterBasePort = 29292
)

var (
	clusterMu  sync.Mutex
	theCluster *cluster
)

// faultCluster skips the test unless OUTBOX_TEST_REAL_KAFKA=1, and otherwise
// returns the package's three-node cluster, running. The first call starts
// it on fresh data directories.
func faultCluster(t *testing.T) *cluster {
	t.Helper()
	needRealKafka(t)
	clusterMu.Lock()
	defer clusterMu.Unlock()
	if theCluster == nil {
		root, err := testenv.RepoRoot()
		if err != nil {
			t.Fatal(err)
		}
		id := make([]byte, 16)
		_, _ = rand.Read(id)
		id[0] &= 0x7f // a Kafka Uuid may not start with '-' on the command line
		clusterID := base64.RawURLEncoding.EncodeToString(id)
		base := clusterBasePort
		if v := os.Getenv("OUTBOX_FAULTTEST_CLUSTER_PORT"); v != "" {
			if base, err = strconv.Atoi(v); err != nil || base < 1 || base > 65535-2*clusterNodes {
				t.Fatalf("OUTBOX_FAULTTEST_CLUSTER_PORT=%q: want a port number", v)
			}
		}
		var voters []string
		for i := range clusterNodes {
			voters = append(voters, fmt.Sprintf("%d@127.0.0.1:%d", i+1, base+2*i+1))
		}
		c := &cluster{}
		for i := range clusterNodes {
			port := base + 2*i
			dir := filepath.Join(root, ".cache", "kafka-cluster", "node"+strconv.Itoa(i+1))
			c.nodes = append(c.nodes, &broker{
				root: root, dir: dir, addr: fmt.Sprintf("127.0.0.1:%d", port),
				env: append(os.Environ(),
					"KAFKA_STATE_DIR="+dir,
					"KAFKA_PORT="+strconv.Itoa(port),
					"KAFKA_CONTROLLER_PORT="+strconv.Itoa(port+1),
					"KAFKA_NODE_ID="+strconv.Itoa(i+1),
					"KAFKA_QUORUM_VOTERS="+strings.Join(voters, ","),
					"KAFKA_CLUSTER_ID="+clusterID,
					"KAFKA_REPLICATION_FACTOR=3",
					"KAFKA_MIN_INSYNC_REPLICAS=2",
					"KAFKA_HEAP_OPTS=-Xms128m -Xmx384m",
				),
			})
		}
		// Fresh data: a cluster id from an earlier run would not match.
		for _, n := range c.nodes {
			if _, _, err := n.run(time.Minute, "destroy"); err != nil {
				t.Fatal(err)
			}
		}
		theCluster = c
	}
	// A node waits for a quorum before it serves: start all, then wait for each.
	for _, n := range theCluster.nodes {
		if _, _, err := n.run(3*time.Minute, "start"); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range theCluster.nodes {
		n.up(t)
	}
	return theCluster
}

func (c *cluster) brokers() []string {
	var out []string
	for _, n := range c.nodes {
		out = append(out, n.addr)
	}
	return out
}

// node returns the node listening on addr.
func (c *cluster) node(addr string) *broker {
	for _, n := range c.nodes {
		if n.addr == addr {
			return n
		}
	}
	return nil
}

// destroyCluster kills the package's cluster, if one was started, and
// deletes its data directories.
func destroyCluster() error {
	clusterMu.Lock()
	defer clusterMu.Unlock()
	if theCluster == nil {
		return nil
	}
	defer func() { theCluster = nil }()
	for _, n := range theCluster.nodes {
		if _, _, err := n.run(time.Minute, "kill"); err != nil {
			return err
		}
		if _, _, err := n.run(time.Minute, "destroy"); err != nil {
			return err
		}
	}
	return nil
}

// leaders returns, for each node address, the partitions of topic it leads.
func leaders(t *testing.T, brokers []string, topic string) map[string][]int32 {
	t.Helper()
	cfg := sarama.NewConfig()
	cfg.Metadata.Retry.Max = 10
	cfg.Metadata.Retry.Backoff = 200 * time.Millisecond
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		t.Fatalf("kafka client: %v", err)
	}
	defer client.Close()
	parts, err := client.Partitions(topic)
	if err != nil {
		t.Fatalf("partitions of %s: %v", topic, err)
	}
	out := map[string][]int32{}
	for _, p := range parts {
		b, err := client.Leader(topic, p)
		if err != nil {
			t.Fatalf("leader of %s/%d: %v", topic, p, err)
		}
		out[b.Addr()] = append(out[b.Addr()], p)
	}
	return out
}

// TestBelowMinISRParksNothing takes a topic of the three-node cluster
// below its min.insync.replicas: replication factor 3 and
// min.insync.replicas 3, one node SIGKILLed for 20 s while two relays
// publish and writers commit. Meanwhile no acks=all write of the topic can
// succeed (the dead replica holds it back, then it leaves the ISR and the
// leaders answer NOT_ENOUGH_REPLICAS). The relays must retry without
// charging or parking anything, and once the node is back publish every
// event: nothing lost, each key's first deliveries in write order, at most
// one batch of duplicates per relay and fault. It runs before
// TestLeaderKillsKeepPerKeyOrder, which then reuses the cluster.
func TestBelowMinISRParksNothing(t *testing.T) {
	const outage = 20 * time.Second
	c := faultCluster(t)
	w := newWorldOn(t, testenv.Pool(t), c.brokers(), 50)
	w.topic = testenv.Name("test.minisr.")
	minISR := "3"
	testenv.CreateTopicDetail(t, w.brokers, w.topic, &sarama.TopicDetail{
		NumPartitions: 6, ReplicationFactor: 3, ConfigEntries: map[string]*string{"min.insync.replicas": &minISR},
	})
	const relays = 2
	for range relays {
		w.startRelay(t)
	}
	ws := w.startWriters(t, 4)
	waitFor(t, time.Minute, "the relays to publish 300 events", func() bool { return w.published(t) >= 300 })

	n := c.nodes[len(c.nodes)-1]
	n.kill(t)
	killed := time.Now()
	time.Sleep(outage / 2)
	during := w.published(t)
	time.Sleep(outage / 2)
	stalled := w.published(t) - during
	backlog := w.unpublished(t)
	t.Logf("node %s down %v: %d events published in its last %v (the topic is below min.insync.replicas), %d waiting",
		n.addr, time.Since(killed).Round(time.Millisecond), stalled, outage/2, backlog)
	if backlog == 0 {
		t.Errorf("nothing waiting while the topic was below min.insync.replicas: the fault did not reach the relays")
	}
	if n := w.count(t, "attempts > 0 OR parked_at IS NOT NULL"); n != 0 {
		t.Errorf("%d rows charged or parked while the topic was below min.insync.replicas", n)
	}
	n.up(t)
	back := time.Now()
	time.Sleep(2 * time.Second)
	if errs := ws.halt(); len(errs) > 0 {
		t.Errorf("%d writer commits failed, first: %v (writers must never need Kafka)", len(errs), errs[0])
	}
	took := waitFor(t, 2*time.Minute, "the relays to publish every row", func() bool { return w.unpublished(t) == 0 })
	t.Logf("backlog drained %v after the node was back (%v after the writers stopped)", time.Since(back).Round(time.Millisecond), took.Round(time.Millisecond))
	if n := w.count(t, "attempts > 0 OR parked_at IS NOT NULL OR last_error IS NOT NULL"); n != 0 {
		t.Errorf("%d rows charged, parked or given an error because the topic was below min.insync.replicas", n)
	}
	w.verify(t, relays)
}

// TestLeaderKillsKeepPerKeyOrder runs two relays on a backlog and a steady
// stream of writes against a three-node cluster (replication factor 3,
// min.insync.replicas 2), and SIGKILLs the node that leads the most
// partitions of the topic three times, restarting it after each kill. The
// partitions it led move to other replicas while batches are in flight.
// Nothing may be lost, nothing charged or parked, each key's first
// deliveries must keep write order, and duplicates stay within one batch
// per relay and kill. OUTBOX_FAULTTEST_KILLS sets the number of kills.
func TestLeaderKillsKeepPerKeyOrder(t *testing.T) {
	c := faultCluster(t)
	// Three JVMs are heavy on a small machine: stop them for the tests after this one.
	t.Cleanup(func() {
		if err := destroyCluster(); err != nil {
			t.Error(err)
		}
	})
	kills := 3
	if v := os.Getenv("OUTBOX_FAULTTEST_KILLS"); v != "" {
		var err error
		if kills, err = strconv.Atoi(v); err != nil || kills < 1 {
			t.Fatalf("OUTBOX_FAULTTEST_KILLS=%q: want a positive number", v)
		}
	}
	w := newWorldOn(t, testenv.Pool(t), c.brokers(), 100)
	w.topic = testenv.Name("test.cluster.")
	minISR := "2"
	testenv.CreateTopicDetail(t, w.brokers, w.topic, &sarama.TopicDetail{
		NumPartitions: 6, ReplicationFactor: 3, ConfigEntries: map[string]*string{"min.insync.replicas": &minISR},
	})

	// A backlog, so that kills land while large batches drain.
	var fill sync.WaitGroup
	for g := range 8 {
		fill.Add(1)
		go func() {
			defer fill.Done()
			for i := g; i < 6000; i += 8 {
				if err := w.commit(w.ctx, w.key(i)); err != nil {
					t.Errorf("commit: %v", err)
					return
				}
			}
		}()
	}
	fill.Wait()
	if t.Failed() {
		return
	}
	stopA := w.startRelay(t)
	stopB := w.startRelay(t)
	ws := w.startWriters(t, 4)

	for k := range kills {
		waitFor(t, 60*time.Second, "publishing to go on before the next kill", func() bool { return w.published(t) >= 500*(k+1) })
		lead := leaders(t, w.brokers, w.topic)
		addrs := slices.Sorted(func(yield func(string) bool) {
			for a := range lead {
				if !yield(a) {
					return
				}
			}
		})
		victim := addrs[0]
		for _, a := range addrs {
			if len(lead[a]) > len(lead[victim]) {
				victim = a
			}
		}
		n := c.node(victim)
		if n == nil {
			t.Fatalf("leader %s is not a node of the cluster %v", victim, c.brokers())
		}
		before := w.published(t)
		n.kill(t)
		t.Logf("kill %d: node %s led partitions %v; %d events published before", k+1, victim, lead[victim], before)
		// The other replicas take over the partitions: publishing goes on
		// while the node is down (after the controller fences it and the
		// producer finds the new leaders).
		took := waitFor(t, time.Minute, "publishing to go on while the killed leader is down", func() bool { return w.published(t) > before+100 })
		t.Logf("kill %d: publishing again %v after the kill", k+1, took.Round(time.Millisecond))
		n.up(t)
		time.Sleep(3 * time.Second)
	}
	if errs := ws.halt(); len(errs) > 0 {
		t.Errorf("%d writer commits failed, first: %v (writers must never need Kafka)", len(errs), errs[0])
	}
	took := waitFor(t, 2*time.Minute, "the relays to publish every row", func() bool { return w.unpublished(t) == 0 })
	t.Logf("backlog drained %v after the writers stopped", took.Round(time.Millisecond))
	if n := w.count(t, "attempts > 0 OR parked_at IS NOT NULL"); n != 0 {
		t.Errorf("%d rows charged an attempt or parked because a leader died: a failover is retried, never held against events", n)
	}
	stopA()
	stopB()
	w.verify(t, 2*kills) // each kill may make each relay repeat one batch
}
