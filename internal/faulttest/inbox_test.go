package faulttest

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
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

// inboxWorld is a consumer's world for the inbox's fault tests: a schema
// with the outbox and inbox tables and an effects table (a row per
// application of an event) on pool, and a topic on brokers.
type inboxWorld struct {
	ctx     context.Context
	pool    *pgxpool.Pool
	brokers []string
	table   outbox.Table
	effects string
	topic   string
	sent    []sentEvent
}

type sentEvent struct {
	id  string
	key string
	seq int
}

func newInboxWorld(t *testing.T, pool *pgxpool.Pool, brokers []string, partitions int32) *inboxWorld {
	t.Helper()
	w := &inboxWorld{ctx: context.Background(), pool: pool, brokers: brokers, table: testenv.Table(t, pool)}
	if err := migrations.Inbox.Up(w.ctx, pool, outbox.Table{Schema: w.table.Schema}); err != nil {
		t.Fatal(err)
	}
	w.effects = `"` + w.table.Schema + `".effects`
	if _, err := pool.Exec(w.ctx, `CREATE TABLE `+w.effects+` (n bigserial PRIMARY KEY, event_id text NOT NULL, key text NOT NULL, seq int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	w.topic = testenv.Topic(t, brokers, partitions)
	return w
}

// produce sends n events over keys keys (seq counting on from the events
// sent before), with the headers the relay sets.
func (w *inboxWorld) produce(t *testing.T, n, keys int) {
	t.Helper()
	first := len(w.sent)
	var msgs []*sarama.ProducerMessage
	for i := first; i < first+n; i++ {
		e := sentEvent{id: uuid.Must(uuid.NewV7()).String(), key: fmt.Sprintf("k%02d", i%keys), seq: i / keys}
		v, _ := json.Marshal(map[string]int{"seq": e.seq})
		msgs = append(msgs, &sarama.ProducerMessage{Topic: w.topic, Key: sarama.StringEncoder(e.key), Value: sarama.ByteEncoder(v),
			Headers: []sarama.RecordHeader{{Key: []byte(outbox.HeaderEventID), Value: []byte(e.id)}, {Key: []byte(outbox.HeaderEventType), Value: []byte("thing.happened.v1")}}})
		w.sent = append(w.sent, e)
	}
	testenv.Produce(t, w.brokers, msgs...)
}

// start starts a consumer whose handler takes delay per record, then
// writes its effect. MaxAttempts is 1: a failure charged to a record parks
// it at once, so a fault that is not the records' parks something.
func (w *inboxWorld) start(t *testing.T, delay time.Duration) *inbox.Consumer {
	t.Helper()
	uow, err := unitofwork.New(w.pool, &unitofwork.Config{Table: w.table})
	if err != nil {
		t.Fatal(err)
	}
	sc := inbox.DefaultSaramaConfig()
	sc.Consumer.Offsets.AutoCommit.Interval = 100 * time.Millisecond
	sc.Consumer.Group.Session.Timeout = 6 * time.Second
	sc.Consumer.Group.Heartbeat.Interval = 500 * time.Millisecond
	sc.Consumer.Group.Rebalance.Timeout = 10 * time.Second
	sc.Metadata.RefreshFrequency = time.Second
	logger := slog.New(slog.DiscardHandler)
	if testing.Verbose() {
		logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	c, err := inbox.New(w.pool, uow, &inbox.Config{
		Group: testenv.Name("faults_"), Brokers: w.brokers, Sarama: sc, Table: outbox.Table{Schema: w.table.Schema},
		Concurrency: 2, MaxAttempts: 1, MinBackoff: 20 * time.Millisecond, MaxBackoff: 500 * time.Millisecond, Logger: logger,
		Routes: []inbox.Route{{Topic: w.topic, Handler: func(ctx context.Context, tx unitofwork.Tx, m *inbox.Message) error {
			var p struct{ Seq int }
			if err := json.Unmarshal(m.Value, &p); err != nil {
				return outbox.Permanent(err)
			}
			time.Sleep(delay)
			_, err := tx.Exec(ctx, `INSERT INTO `+w.effects+` (event_id, key, seq) VALUES ($1, $2, $3)`, m.ID, string(m.Key), p.Seq)
			return err
		}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(w.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = c.Stop(ctx)
	})
	return c
}

func (w *inboxWorld) applied(t *testing.T) int {
	t.Helper()
	var n int
	// Errors (the database restarting) count as nothing applied yet.
	_ = w.pool.QueryRow(w.ctx, `SELECT count(*) FROM `+w.effects).Scan(&n)
	return n
}

// verify fails unless every event sent was applied exactly once, each key's
// events in order, and nothing was parked.
func (w *inboxWorld) verify(t *testing.T, c *inbox.Consumer) {
	t.Helper()
	rows, err := w.pool.Query(w.ctx, `SELECT event_id, key, seq FROM `+w.effects+` ORDER BY n`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	times := map[string]int{}
	last := map[string]int{}
	var disorder int
	for rows.Next() {
		var id, key string
		var seq int
		if err := rows.Scan(&id, &key, &seq); err != nil {
			t.Fatal(err)
		}
		times[id]++
		if prev, ok := last[key]; ok && seq < prev {
			disorder++
		}
		last[key] = seq
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	var missing, twice []string
	for _, e := range w.sent {
		switch times[e.id] {
		case 0:
			missing = append(missing, e.id)
		case 1:
		default:
			twice = append(twice, e.id)
		}
	}
	if len(missing) > 0 || len(twice) > 0 || disorder > 0 || len(times) != len(w.sent) {
		t.Errorf("%d events sent: %d never applied (e.g. %v), %d applied more than once (e.g. %v), %d key-order violations, %d distinct applied",
			len(w.sent), len(missing), first(missing), len(twice), first(twice), disorder, len(times))
	}
	parked, err := c.List(w.ctx, inbox.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(parked) > 0 {
		t.Errorf("%d records parked, e.g. %s: %s; a fault of the broker or the database is not the records'", len(parked), parked[0].ErrorType, parked[0].LastError)
	}
}

func first(ids []string) []string { return ids[:min(len(ids), 3)] }

// TestInboxBrokerOutageParksNothing kills the broker (SIGKILL) while a
// consumer applies records, keeps it down for 15 seconds and starts it
// again: records fetched before the outage are applied, their offsets
// cannot be committed, and after the restart they come again and are
// dropped; new records flow. Every event is applied exactly once, each
// key in order, nothing is parked, and health fails during the outage and
// recovers by itself. Runs with OUTBOX_TEST_REAL_KAFKA=1 (make test-kafka).
func TestInboxBrokerOutageParksNothing(t *testing.T) {
	b := faultBroker(t)
	w := newInboxWorld(t, testenv.Pool(t), b.brokers(), 3)
	w.produce(t, 600, 30)
	c := w.start(t, 10*time.Millisecond)
	waitFor(t, 60*time.Second, "200 records applied", func() bool { return w.applied(t) >= 200 })

	b.kill(t)
	atKill := w.applied(t)
	waitFor(t, 60*time.Second, "health to report the outage", func() bool { return c.Health(w.ctx) != nil })
	time.Sleep(15 * time.Second)
	t.Logf("broker down: %d records applied at the kill, %d after 15s; health: %v", atKill, w.applied(t), c.Health(w.ctx))

	upAfterOutage(t, b)
	w.produce(t, 300, 30)
	waitFor(t, 120*time.Second, "every record applied after the outage", func() bool { return w.applied(t) >= len(w.sent) })
	waitFor(t, 60*time.Second, "health to recover", func() bool { return c.Health(w.ctx) == nil })
	time.Sleep(time.Second) // a late duplicate would show now
	w.verify(t, c)
}

// TestInboxSurvivesPostgresRestart restarts PostgreSQL (pg_ctl restart -m
// fast: every session is terminated, transactions in progress roll back)
// while a consumer applies records. The consumer, never restarted, retries
// the records whose transactions failed, without charging them: every
// event is applied exactly once, each key in order, and nothing is parked
// although MaxAttempts is 1.
func TestInboxSurvivesPostgresRestart(t *testing.T) {
	brokers := testenv.Brokers(t)
	pg := ownPG(t)
	w := newInboxWorld(t, pg.pool(t), brokers, 3)
	w.produce(t, 600, 30)
	c := w.start(t, 10*time.Millisecond)
	waitFor(t, 60*time.Second, "150 records applied", func() bool { return w.applied(t) >= 150 })
	start := time.Now()
	if _, _, err := pg.run(2*time.Minute, "restart"); err != nil {
		t.Fatal(err)
	}
	t.Logf("PostgreSQL restarted in %v", time.Since(start).Round(time.Millisecond))
	waitFor(t, 120*time.Second, "every record applied after the restart", func() bool { return w.applied(t) >= len(w.sent) })
	time.Sleep(time.Second)
	w.verify(t, c)
}
