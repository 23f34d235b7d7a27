package inbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/inbox"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/migrations"
	"github.com/fxoutbox/outbox/unitofwork"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// env is one test's world: a fresh schema with the outbox and inbox tables
// and an effects table the handlers write (one row per application of an
// event), and a fresh topic.
type env struct {
	t       *testing.T
	pool    *pgxpool.Pool
	table   outbox.Table // the outbox table; the inbox is in the same schema
	inbox   outbox.Table
	brokers []string
	topic   string
	uow     *unitofwork.UnitOfWork
	effects string
	batch   int // Config.BatchSize of the consumers config makes
}

// modes runs f as parallel subtests on an env of its own: with a
// transaction per record ("one") and with BatchSize 50 ("batch").
func modes(t *testing.T, partitions int32, f func(t *testing.T, e *env)) {
	for _, m := range []struct {
		name  string
		batch int
	}{{"one", 1}, {"batch", 50}} {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, partitions)
			e.batch = m.batch
			f(t, e)
		})
	}
}

func newEnv(t *testing.T, partitions int32) *env {
	t.Helper()
	pool := testenv.Pool(t)
	tbl := testenv.Table(t, pool)
	e := &env{t: t, pool: pool, table: tbl, inbox: outbox.Table{Schema: tbl.Schema}, brokers: testenv.Brokers(t)}
	ctx := context.Background()
	if err := migrations.Inbox.Up(ctx, pool, e.inbox); err != nil {
		t.Fatal(err)
	}
	e.effects = `"` + tbl.Schema + `".effects`
	if _, err := pool.Exec(ctx, `CREATE TABLE `+e.effects+` (n bigserial PRIMARY KEY, consumer text NOT NULL, event_id text NOT NULL, key text NOT NULL, seq int NOT NULL, member text,
		txid bigint NOT NULL DEFAULT txid_current())`); err != nil {
		t.Fatal(err)
	}
	e.topic = testenv.Topic(t, e.brokers, partitions)
	var err error
	if e.uow, err = unitofwork.New(pool, &unitofwork.Config{Table: tbl}); err != nil {
		t.Fatal(err)
	}
	return e
}

// ev is a record to produce.
type ev struct {
	ID          string // default: a new UUIDv7; "-" for none
	Key         string
	Seq         int
	Type        string
	Poison      bool
	Traceparent string
}

type payload struct {
	Seq    int  `json:"seq"`
	Poison bool `json:"poison,omitempty"`
}

// produce sends events to the env's topic, in order, keyed, with the
// headers the relay sets.
func (e *env) produce(events ...ev) []ev {
	e.t.Helper()
	var msgs []*sarama.ProducerMessage
	for i := range events {
		v := &events[i]
		if v.ID == "" {
			v.ID = uuid.Must(uuid.NewV7()).String()
		}
		if v.Type == "" {
			v.Type = "thing.happened.v1"
		}
		b, _ := json.Marshal(payload{Seq: v.Seq, Poison: v.Poison})
		m := &sarama.ProducerMessage{Topic: e.topic, Key: sarama.StringEncoder(v.Key), Value: sarama.ByteEncoder(b)}
		if v.ID != "-" {
			m.Headers = append(m.Headers, sarama.RecordHeader{Key: []byte(outbox.HeaderEventID), Value: []byte(v.ID)})
		}
		m.Headers = append(m.Headers, sarama.RecordHeader{Key: []byte(outbox.HeaderEventType), Value: []byte(v.Type)})
		if v.Traceparent != "" {
			m.Headers = append(m.Headers, sarama.RecordHeader{Key: []byte("traceparent"), Value: []byte(v.Traceparent)})
		}
		msgs = append(msgs, m)
	}
	testenv.Produce(e.t, e.brokers, msgs...)
	return events
}

// events returns n events over keys keys, seq increasing per key.
func events(n, keys int) []ev {
	out := make([]ev, n)
	for i := range out {
		out[i] = ev{Key: fmt.Sprintf("k%03d", i%keys), Seq: i / keys}
	}
	return out
}

// effect is the test handler: one effects row per application.
func (e *env) effect(member string) inbox.Handler {
	return func(ctx context.Context, tx unitofwork.Tx, m *inbox.Message) error {
		var p payload
		if err := json.Unmarshal(m.Value, &p); err != nil {
			return outbox.Permanent(err)
		}
		if p.Poison {
			return fmt.Errorf("poison record %d", p.Seq)
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+e.effects+` (consumer, event_id, key, seq, member) VALUES ($1, $2, $3, $4, $5)`,
			"c", m.ID, string(m.Key), p.Seq, member)
		return err
	}
}

// config returns a consumer configuration for tests: fast backoff and
// commits, short sessions so rebalances after a member stops are quick.
func (e *env) config(group string, h inbox.Handler) *inbox.Config {
	sc := inbox.DefaultSaramaConfig()
	sc.Consumer.Offsets.AutoCommit.Interval = 100 * time.Millisecond
	sc.Consumer.Group.Session.Timeout = 6 * time.Second
	sc.Consumer.Group.Heartbeat.Interval = 500 * time.Millisecond
	sc.Consumer.Group.Rebalance.Timeout = 10 * time.Second
	sc.Metadata.RefreshFrequency = time.Second
	return &inbox.Config{
		Group:      group,
		Name:       "c",
		Brokers:    e.brokers,
		Sarama:     sc,
		Table:      e.inbox,
		Routes:     []inbox.Route{{Topic: e.topic, Handler: h}},
		MinBackoff: 10 * time.Millisecond,
		MaxBackoff: 200 * time.Millisecond,
		BatchSize:  e.batch,
		Logger:     testLogger(),
	}
}

func testLogger() *slog.Logger {
	if os.Getenv("INBOX_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.DiscardHandler)
}

// start builds and starts a consumer, stopped when the test ends.
func (e *env) start(cfg *inbox.Config) *inbox.Consumer {
	e.t.Helper()
	c, err := inbox.New(e.pool, e.uow, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	var once sync.Once
	e.t.Cleanup(func() { once.Do(func() { stop(e.t, c) }) })
	return c
}

func stop(t testing.TB, c *inbox.Consumer) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Stop(ctx); err != nil {
		t.Errorf("stop: %v", err)
	}
}

// count returns the number of effects rows.
func (e *env) count() int {
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+e.effects).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// eventually waits for cond (testenv.Eventually), what naming what it
// waits for.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, timeout, testenv.Cond(what, cond))
}

// waitEffects waits until n events have an effect.
func (e *env) waitEffects(n int) {
	e.t.Helper()
	testenv.Eventually(e.t, 90*time.Second, func() (bool, string) {
		var got int
		err := e.pool.QueryRow(context.Background(), `SELECT count(DISTINCT event_id) FROM `+e.effects).Scan(&got)
		return err == nil && got >= n, fmt.Sprintf("%d of %d events applied (%v)", got, n, err)
	})
}

// waitCommitted waits until group's committed offsets on the env's topic
// of partitions partitions add up to n records.
func (e *env) waitCommitted(group string, partitions int32, n int, timeout time.Duration) {
	e.t.Helper()
	testenv.Eventually(e.t, timeout, func() (bool, string) {
		var total int64
		for _, o := range e.committed(group, partitions) {
			total += o
		}
		return total == int64(n), fmt.Sprintf("group %s committed offsets add up to %d, want all %d records", group, total, n)
	})
}

// checkOnce fails unless each of want has exactly one effect, none other,
// and each key's effects are in seq order.
func (e *env) checkOnce(want []ev) {
	e.t.Helper()
	ctx := context.Background()
	rows, err := e.pool.Query(ctx, `SELECT event_id, count(*) FROM `+e.effects+` GROUP BY event_id`)
	if err != nil {
		e.t.Fatal(err)
	}
	got := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			e.t.Fatal(err)
		}
		got[id] = n
	}
	rows.Close()
	bad := 0
	for _, w := range want {
		if got[w.ID] != 1 {
			bad++
			if bad <= 5 {
				e.t.Errorf("event %s (key %s, seq %d) applied %d times, want once", w.ID, w.Key, w.Seq, got[w.ID])
			}
		}
		delete(got, w.ID)
	}
	if bad > 0 || len(got) > 0 {
		e.t.Fatalf("%d of %d events not applied exactly once; %d unexpected", bad, len(want), len(got))
	}
	e.checkOrder()
}

// checkOrder fails unless each key's effects were applied in seq order.
func (e *env) checkOrder() {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT key, array_agg(seq ORDER BY n) FROM `+e.effects+` GROUP BY key`)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var key string
		var seqs []int32
		if err := rows.Scan(&key, &seqs); err != nil {
			e.t.Fatal(err)
		}
		if !slices.IsSorted(seqs) {
			e.t.Errorf("key %s applied out of order: %v", key, seqs)
		}
	}
}

// committed returns the group's committed offsets per partition.
func (e *env) committed(group string, partitions int32) map[int32]int64 {
	e.t.Helper()
	sc := sarama.NewConfig()
	sc.Version = sarama.V2_1_0_0
	admin, err := sarama.NewClusterAdmin(e.brokers, sc)
	if err != nil {
		e.t.Fatal(err)
	}
	defer admin.Close()
	ps := make([]int32, partitions)
	for i := range ps {
		ps[i] = int32(i)
	}
	out := map[int32]int64{}
	// Apache Kafka answers COORDINATOR_LOAD_IN_PROGRESS while the group's
	// coordinator loads its offsets partition (a group whose coordinator
	// moved, or just after the broker started), and sarama's admin does not
	// retry that code; ask again for up to 30s.
	var resp *sarama.OffsetFetchResponse
	testenv.Eventually(e.t, 30*time.Second, func() (bool, string) {
		resp, err = admin.ListConsumerGroupOffsets(group, map[string][]int32{e.topic: ps})
		return !errors.Is(err, sarama.ErrOffsetsLoadInProgress), fmt.Sprintf("committed offsets of group %s: %v", group, err)
	})
	if errors.Is(err, sarama.ErrGroupIDNotFound) {
		return out // nothing committed yet
	}
	if err != nil {
		e.t.Fatalf("committed offsets of group %s: %v", group, err)
	}
	for p, b := range resp.Blocks[e.topic] {
		out[p] = b.Offset
	}
	return out
}

func group() string { return testenv.Name("g_") }

func contains(s, sub string) bool { return strings.Contains(s, sub) }

// poolFromEnv connects to DATABASE_URL (in a child process, without the
// parent's schema set-up).
func poolFromEnv(t *testing.T) *pgxpool.Pool {
	pool, err := pgxpool.New(context.Background(), os.Getenv("DATABASE_URL"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}
