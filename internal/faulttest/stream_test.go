package faulttest

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
)

// streaming sets the world's table up for the streaming relay, which
// creates the slot itself (see testenv.Streaming).
func (w *world) streaming(t *testing.T) {
	t.Helper()
	testenv.Streaming(t, w.pool, w.table, false)
}

// streamRelay is a relay in Stream mode with its own producer, and its log.
type streamRelay struct {
	*relay.Relay
	pub  *relay.SaramaPublisher
	log  *syncBuffer
	once sync.Once
	// failed counts the publisher's calls that returned an error (at
	// least once; an exactly-once relay sends through its own
	// transactional producer, which the publisher does not see).
	failed atomic.Int64
}

// countedPublisher is a SaramaPublisher whose failed calls are counted. It
// embeds the publisher, so that an exactly-once relay takes its brokers
// and configuration from it, as from a SaramaPublisher.
type countedPublisher struct {
	*relay.SaramaPublisher
	failed *atomic.Int64
}

func (p countedPublisher) Publish(ctx context.Context, msgs []relay.Message) error {
	err := p.SaramaPublisher.Publish(ctx, msgs)
	if err != nil {
		p.failed.Add(1)
	}
	return err
}

// startStreamRelay starts a streaming relay with the fault tests' settings
// and short stream intervals, adjusted by tune (may be nil). Its log goes to
// the test log and to its buffer. It is stopped at cleanup.
func (w *world) startStreamRelay(t *testing.T, tune func(*relay.Config)) *streamRelay {
	t.Helper()
	return w.startStreamRelayWith(t, tune, nil)
}

// startStreamRelayWith is startStreamRelay with a producer configuration
// (nil: the default).
func (w *world) startStreamRelayWith(t *testing.T, tune func(*relay.Config), sc *sarama.Config) *streamRelay {
	t.Helper()
	return w.startStreamRelayOn(t, w.pool, tune, sc)
}

// startStreamRelayOn is startStreamRelayWith on the database pool db. The
// relay has the world's delivery and progress: exactly once, each batch is
// one Kafka transaction with the stream's record (cursor progress, which
// the world's table has then, see progressFor).
func (w *world) startStreamRelayOn(t *testing.T, db *pgxpool.Pool, tune func(*relay.Config), sc *sarama.Config) *streamRelay {
	t.Helper()
	pub, err := relay.NewSaramaPublisher(w.brokers, sc)
	if err != nil {
		t.Fatal(err)
	}
	x := &streamRelay{pub: pub, log: &syncBuffer{}}
	cfg := &relay.Config{
		Mode: relay.Stream, Delivery: w.delivery, Progress: w.progress,
		Table: w.table, BatchSize: batchSize, MaxBatchSize: maxBatchSize, PollInterval: pollInterval, MaxBackoff: maxBackoff,
		Stream: relay.StreamConfig{StandbyRetry: 50 * time.Millisecond, StatusInterval: 100 * time.Millisecond, SweepInterval: 500 * time.Millisecond},
		Logger: slog.New(slog.NewTextHandler(teeWriter{testWriter{t}, x.log}, nil)),
	}
	if tune != nil {
		tune(cfg)
	}
	if x.Relay, err = relay.New(db, countedPublisher{pub, &x.failed}, cfg); err != nil {
		t.Fatal(err)
	}
	if err := x.Start(w.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { x.stop(t) })
	return x
}

// stop stops the relay gracefully, then closes its producer.
func (x *streamRelay) stop(t *testing.T) {
	x.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := x.Stop(ctx); err != nil {
			t.Errorf("relay stop: %v", err)
		}
		_ = x.pub.Close()
	})
}

// kill stops the relay without grace (its in-flight batch abandoned) and
// closes its producer, as a crashed process would.
func (x *streamRelay) kill() {
	x.once.Do(func() {
		dead, cancel := context.WithCancel(context.Background())
		cancel()
		_ = x.Stop(dead)
		_ = x.pub.Close()
	})
}

func (x *streamRelay) state() relay.StreamState { return x.StreamStatus().State }

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

type teeWriter struct {
	a, b interface{ Write([]byte) (int, error) }
}

func (t teeWriter) Write(p []byte) (int, error) {
	_, _ = t.a.Write(p)
	return t.b.Write(p)
}

// slotWALStatus returns the slot's wal_status ("" when there is no slot).
func (w *world) slotWALStatus(t *testing.T) string {
	t.Helper()
	var st *string
	err := w.pool.QueryRow(w.ctx, "SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1", testenv.Slot(t, w.pool, w.table)).Scan(&st)
	if errors.Is(err, pgx.ErrNoRows) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	if st == nil {
		return "null"
	}
	return *st
}

// TestStreamSlotInvalidatedResumesFromTheTable lets the server invalidate
// the relay's slot while the relay is stopped and writers go on (on the
// tests' own cluster: max_slot_wal_keep_size 1MB, WAL switches and
// checkpoints until the slot's wal_status is 'lost'). The relay then
// starts, says that the slot was lost, counts it (StreamStatus.SlotLost),
// drops the lost slot, publishes from the table by polling (from the marks,
// or from the lanes' positions that the stream's checkpoint wrote) while it
// creates a new one, and streams again. Nothing is lost, each key's first
// deliveries come in commit order, and the duplicates stay within the
// bound: none with marks; under cursor progress, the events the stream
// published after its last checkpoint (about two seconds of writes).
// With OUTBOX_TEST_DELIVERY=exactly-once the cursor variant's relays are
// exactly once (before the relay polls, the stream's record in the
// progress topic becomes the lanes' positions): read_committed, not one
// duplicate. The marks variant then runs at least once, and says so:
// exactly-once streaming records cursor progress only.
func TestStreamSlotInvalidatedResumesFromTheTable(t *testing.T) {
	for _, progress := range []relay.Progress{relay.ProgressMarks, relay.ProgressCursor} {
		t.Run(progress.String(), func(t *testing.T) { slotInvalidated(t, progress) })
	}
}

func slotInvalidated(t *testing.T, progress relay.Progress) {
	brokers := testenv.Brokers(t)
	pg := ownPG(t)
	pool := pg.pool(t)
	delivery := testDelivery(t)
	if delivery == relay.ExactlyOnce && progress != relay.ProgressCursor {
		t.Logf("%s=%v: exactly-once streaming records cursor progress only (the relay refuses marks in Stream mode), so a slot lost under marks progress cannot happen exactly once: this variant runs at least once; the cursor variant runs exactly once", envDelivery, delivery)
		delivery = relay.AtLeastOnce
	}
	w := newWorldWith(t, pool, brokers, 30, delivery, progress)
	w.streaming(t)
	// A first relay creates the slot and streams, then stops.
	first := w.startStreamRelay(t, nil)
	waitFor(t, 30*time.Second, "the first relay to stream", func() bool { return first.state() == relay.Streaming })
	began := time.Now()
	ws := w.startWriters(t, 4)
	waitFor(t, 30*time.Second, "200 events published", func() bool { return w.published(t) >= 200 })
	time.Sleep(2 * time.Second) // a checkpoint or two under load
	first.stop(t)
	written := w.count(t, "true")
	rate := float64(written) / time.Since(began).Seconds()

	// With no relay reading it, the slot falls behind the server's bound.
	w.invalidateSlot(t)
	t.Logf("slot invalidated; %d events wait", w.unpublished(t))

	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	r := w.startStreamRelay(t, func(c *relay.Config) { c.MeterProvider = mp })
	waitFor(t, 30*time.Second, "the relay to count the lost slot", func() bool { return r.StreamStatus().SlotLost > 0 })
	// The counter says so too, as invalidated: once, not again as missing
	// when the relay creates the new slot.
	lost := slotsLost(t, reader)
	if lost["invalidated"] != 1 || lost["missing"] != 0 {
		t.Errorf("%s = %v, want invalidated 1, missing 0", relay.MetricStreamSlotsLost, lost)
	}
	if l := r.log.String(); !strings.Contains(l, "invalidated") || !strings.Contains(l, "publishing from the table") {
		t.Errorf("the relay's log does not say that the slot was lost and what it does:\n%s", l)
	}
	waitFor(t, 60*time.Second, "the relay to stream from a new slot", func() bool { return r.state() == relay.Streaming })
	if st := w.slotWALStatus(t); st != "reserved" {
		t.Errorf("new slot wal_status %q, want reserved", st)
	}
	before := w.published(t)
	waitFor(t, 30*time.Second, "the relay to publish from the new slot", func() bool { return w.published(t) > before+200 })
	if err := r.Health(w.ctx, 0); err != nil {
		t.Errorf("Health while streaming from the new slot: %v, want healthy", err)
	}

	if errs := ws.halt(); len(errs) > 0 {
		t.Fatalf("%d writer commits failed, first: %v", len(errs), errs[0])
	}
	waitFor(t, 60*time.Second, "every event published", func() bool { return w.unpublished(t) == 0 })
	// The loss is counted once, as invalidated, never as missing (nor again
	// by a retry that met the lost slot before the drop showed).
	if lost := slotsLost(t, reader); lost["invalidated"] != 1 || lost["missing"] != 0 || r.StreamStatus().SlotLost != 1 {
		t.Errorf("after streaming from the new slot: %s = %v and StreamStatus.SlotLost %d, want one loss, invalidated", relay.MetricStreamSlotsLost, lost, r.StreamStatus().SlotLost)
	}
	r.stop(t)
	faults := 0
	if progress == relay.ProgressCursor && w.delivery == relay.AtLeastOnce {
		// The bound: what the stream published after the last checkpoint
		// it wrote before it stopped (taken at one checkpoint, written at
		// the next), in batches.
		faults = int(rate*3/maxBatchSize) + 1
		t.Logf("writers at %.0f events/s: up to %d duplicates allowed", rate, faults*maxBatchSize)
	}
	w.verify(t, faults)
}

// invalidateSlot makes the server invalidate the table's slot, which no
// relay may hold then: max_slot_wal_keep_size 1MB (reset once the slot is
// lost, and at cleanup: the cluster's directory is kept for the next
// tests), then WAL, switches and checkpoints until its wal_status is lost.
func (w *world) invalidateSlot(t *testing.T) {
	t.Helper()
	setKeep := func(v string) {
		t.Helper()
		q := "ALTER SYSTEM RESET max_slot_wal_keep_size"
		if v != "" {
			q = "ALTER SYSTEM SET max_slot_wal_keep_size = '" + v + "'"
		}
		if _, err := w.pool.Exec(w.ctx, q); err != nil {
			t.Fatal(err)
		}
		if _, err := w.pool.Exec(w.ctx, "SELECT pg_reload_conf()"); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { setKeep("") })
	setKeep("1MB")
	var st string
	for i := 0; ; i++ {
		if st = w.slotWALStatus(t); st == "lost" {
			break
		}
		if i == 100 {
			t.Fatalf("slot wal_status %q after %d WAL switches and checkpoints, want lost", st, i)
		}
		// A megabyte of WAL (writers, when they run, add theirs), then a
		// new segment and a checkpoint, which invalidates the slot once
		// it is further behind than the bound.
		for _, q := range []string{"SELECT pg_logical_emit_message(false, 'faulttest', repeat('x', 1 << 20))", "SELECT pg_switch_wal()", "CHECKPOINT"} {
			if _, err := w.pool.Exec(w.ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	setKeep("") // the invalidation is for good; the new slot must not be lost again
}

// TestStreamSlotInvalidatedCountedOnce: a relay that meets its lost slot
// again and again counts the loss once. Its role may stream and create
// slots (REPLICATION) but not call pg_drop_replication_slot (EXECUTE
// revoked from PUBLIC on the test's own cluster), so every RetryInterval
// the relay polls, retries, meets the same invalidated slot and fails to
// drop it, as a retry that meets the slot before its drop shows does; once
// the function is granted again, the relay drops the slot, finds it
// missing, creates a new one and streams. Through it all the slot was
// lost once: outbox.stream.slots_lost says invalidated 1, missing 0. Every
// event is then delivered once (within the bound of
// TestStreamSlotInvalidatedResumesFromTheTable under cursor progress at
// least once; exactly once, read_committed, not one duplicate).
func TestStreamSlotInvalidatedCountedOnce(t *testing.T) {
	brokers := testenv.Brokers(t)
	pg := ownPG(t)
	pool := pg.pool(t)
	w := newWorldFor(t, pool, brokers, 10, testDelivery(t), relay.Stream)
	w.streaming(t)

	// The relay's role: not a superuser (who may call any function), with
	// REPLICATION and the table's privileges.
	role := testenv.Name("faulttest_relay_")
	schema := pgx.Identifier{w.table.Schema}.Sanitize()
	for _, q := range []string{
		"CREATE ROLE " + role + " LOGIN REPLICATION",
		"GRANT USAGE ON SCHEMA " + schema + " TO " + role,
		"GRANT ALL ON ALL TABLES IN SCHEMA " + schema + " TO " + role,
		"GRANT ALL ON ALL SEQUENCES IN SCHEMA " + schema + " TO " + role,
		"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA " + schema + " TO " + role,
	} {
		if _, err := pool.Exec(w.ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP OWNED BY "+role)
		_, _ = pool.Exec(context.Background(), "DROP ROLE "+role)
	})
	pc, err := pgxpool.ParseConfig(pg.url)
	if err != nil {
		t.Fatal(err)
	}
	pc.ConnConfig.User = role
	relayDB, err := pgxpool.NewWithConfig(w.ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(relayDB.Close)

	first := w.startStreamRelayOn(t, relayDB, nil, nil)
	waitFor(t, 30*time.Second, "the first relay to stream", func() bool { return first.state() == relay.Streaming })
	began := time.Now()
	ws := w.startWriters(t, 2)
	waitFor(t, 30*time.Second, "20 events published", func() bool { return w.published(t) >= 20 })
	first.stop(t)
	rate := float64(w.count(t, "true")) / time.Since(began).Seconds()
	w.invalidateSlot(t)

	const revoke, grant = "REVOKE EXECUTE ON FUNCTION pg_drop_replication_slot(name) FROM PUBLIC", "GRANT EXECUTE ON FUNCTION pg_drop_replication_slot(name) TO PUBLIC"
	if _, err := pool.Exec(w.ctx, revoke); err != nil {
		t.Fatal(err)
	}
	granted := false
	t.Cleanup(func() {
		if !granted {
			_, _ = pool.Exec(context.Background(), grant)
		}
	})
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	r := w.startStreamRelayOn(t, relayDB, func(c *relay.Config) {
		c.MeterProvider = mp
		c.Stream.RetryInterval = 100 * time.Millisecond
	}, nil)
	const failed = "dropping it failed"
	waitFor(t, 60*time.Second, "the relay to fail to drop the lost slot three times", func() bool { return strings.Count(r.log.String(), failed) >= 3 })
	if lost := slotsLost(t, reader); lost["invalidated"] != 1 || lost["missing"] != 0 || r.StreamStatus().SlotLost != 1 {
		t.Errorf("after the relay met the lost slot %d times: %s = %v and StreamStatus.SlotLost %d, want one loss, invalidated",
			strings.Count(r.log.String(), failed), relay.MetricStreamSlotsLost, lost, r.StreamStatus().SlotLost)
	}
	if st := r.state(); st != relay.StreamFallback {
		t.Errorf("state %v while the lost slot cannot be dropped, want %v", st, relay.StreamFallback)
	}

	if _, err := pool.Exec(w.ctx, grant); err != nil {
		t.Fatal(err)
	}
	granted = true
	waitFor(t, 60*time.Second, "the relay to stream from a new slot", func() bool { return r.state() == relay.Streaming })
	if st := w.slotWALStatus(t); st != "reserved" {
		t.Errorf("new slot wal_status %q, want reserved", st)
	}
	if errs := ws.halt(); len(errs) > 0 {
		t.Fatalf("%d writer commits failed, first: %v", len(errs), errs[0])
	}
	waitFor(t, 60*time.Second, "every event published", func() bool { return w.unpublished(t) == 0 })
	if lost := slotsLost(t, reader); lost["invalidated"] != 1 || lost["missing"] != 0 || r.StreamStatus().SlotLost != 1 {
		t.Errorf("after streaming from the new slot: %s = %v and StreamStatus.SlotLost %d, want one loss, invalidated", relay.MetricStreamSlotsLost, lost, r.StreamStatus().SlotLost)
	}
	r.stop(t)
	faults := 0
	if w.progress == relay.ProgressCursor && w.delivery == relay.AtLeastOnce {
		// As in TestStreamSlotInvalidatedResumesFromTheTable: what the
		// first relay published after its last checkpoint.
		faults = int(rate*3/maxBatchSize) + 1
		t.Logf("writers at %.0f events/s: up to %d duplicates allowed", rate, faults*maxBatchSize)
	}
	w.verify(t, faults)
}

// crash stops the cluster's server the way a crash would (pg_ctl stop -m
// immediate: no shutdown checkpoint, every backend killed).
func (c *pgCluster) crash(t *testing.T, w *world) {
	t.Helper()
	var dataDir, binDir string
	if err := w.pool.QueryRow(w.ctx, "SELECT current_setting('data_directory'), (SELECT setting FROM pg_config WHERE name = 'BINDIR')").Scan(&dataDir, &binDir); err != nil {
		t.Fatal(err)
	}
	args := []string{filepath.Join(binDir, "pg_ctl"), "stop", "-m", "immediate", "-w", "-D", dataDir}
	if os.Geteuid() == 0 {
		args = append([]string{"runuser", "-u", "postgres", "--"}, args...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Dir = "/"
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("PostgreSQL crashed (pg_ctl stop -m immediate)")
}

// TestStreamSurvivesPostgresCrash crashes PostgreSQL (pg_ctl stop -m
// immediate, then start: crash recovery) while writers commit and a
// streaming relay publishes. The relay, never restarted, reconnects by
// itself and streams again from its slot (which the crash may have moved
// back to its last checkpointed position: the server sends transactions
// again, and the relay skips what it had published). Every committed event
// is delivered, first deliveries in per-key order, with at most one batch
// of duplicates (under cursor progress, at most the events of about three
// seconds: those the stream published after its last checkpoint). Exactly
// once (OUTBOX_TEST_DELIVERY), read_committed: not one duplicate.
func TestStreamSurvivesPostgresCrash(t *testing.T) {
	brokers := testenv.Brokers(t)
	pg := ownPG(t)
	pool := pg.pool(t)
	w := newWorldFor(t, pool, brokers, 30, testDelivery(t), relay.Stream)
	w.streaming(t)
	r := w.startStreamRelay(t, nil)
	waitFor(t, 30*time.Second, "the relay to stream", func() bool { return r.state() == relay.Streaming })
	began := time.Now()
	ws := w.startWriters(t, 4)
	waitFor(t, 30*time.Second, "300 events published", func() bool { return w.published(t) >= 300 })

	before := ws.commits.Load()
	rate := float64(w.count(t, "true")) / time.Since(began).Seconds()
	pg.crash(t, w)
	crashed := time.Now()
	time.Sleep(time.Second)
	if st := r.state(); st == relay.Streaming {
		t.Errorf("state %v with the server down, want retrying", st)
	}
	if _, _, err := pg.run(2*time.Minute, "up"); err != nil {
		t.Fatal(err)
	}
	t.Logf("PostgreSQL back %v after the crash", time.Since(crashed).Round(time.Millisecond))
	waitFor(t, 30*time.Second, "writers to commit again", func() bool { return ws.commits.Load() > before+300 })
	took := waitFor(t, 30*time.Second, "the relay to stream again", func() bool { return r.state() == relay.Streaming })
	t.Logf("streaming again %v after the server came back", took.Round(time.Millisecond))
	published := w.published(t)
	waitFor(t, 30*time.Second, "the relay to publish after the crash", func() bool { return w.published(t) > published+200 })
	errs := ws.halt()
	t.Logf("writers: %d commits, %d failed (expected around the crash), first failure: %v", ws.commits.Load(), len(errs), firstErr(errs))
	waitFor(t, 60*time.Second, "every event published", func() bool { return w.unpublished(t) == 0 })
	if n := w.count(t, "attempts > 0 OR parked_at IS NOT NULL"); n != 0 {
		t.Errorf("%d rows charged or parked: a database crash is not the events' fault", n)
	}
	r.stop(t)
	faults := 1
	if w.progress == relay.ProgressCursor && w.delivery == relay.AtLeastOnce {
		// The stream's bound under cursor progress: what it published
		// after its last checkpoint (taken at one checkpoint, written at
		// the next), which the handover's polling sends again.
		faults = int(rate*3/maxBatchSize) + 1
		t.Logf("writers at %.0f events/s: up to %d duplicates allowed", rate, faults*maxBatchSize)
	}
	w.verify(t, faults)
}

// TestStreamBrokerOutageConfirmsNothingUnpublished takes the package's
// broker away (SIGKILL) for a few seconds while writers commit and a
// relay streams. During the outage nothing is charged or parked, and the
// position the relay confirms to the server (the slot's confirmed_flush_lsn
// and StreamStatus.Confirmed) never passes a transaction whose events are
// not published: it stays below the WAL position taken after events began
// to wait. The relay is then killed while the broker is still down; the
// broker returns, a new relay starts, and every committed event is
// delivered, first deliveries in per-key order, with at most one batch of
// duplicates per fault (exactly once, OUTBOX_TEST_DELIVERY: read_committed,
// none; its failures are failed Kafka transactions and restarts from the
// stream's record, with BatchTimeout 5 s). Runs with
// OUTBOX_TEST_REAL_KAFKA=1, on the package's own broker and PostgreSQL
// cluster.
func TestStreamBrokerOutageConfirmsNothingUnpublished(t *testing.T) {
	b := faultBroker(t)
	pg := ownPG(t)
	w := newWorldFor(t, pg.pool(t), b.brokers(), 30, testDelivery(t), relay.Stream)
	w.streaming(t)
	// A producer that gives up on a dead broker within seconds (the
	// default waits up to Metadata.Timeout, 15s, and then the batch's
	// BatchTimeout ends the whole stream connection): the relay then goes
	// through the stream's own failure path (keep the rows, back off,
	// report the position, receive more, try again) many times during the
	// outage.
	sc := relay.DefaultSaramaConfig()
	sc.Metadata.Retry.Max, sc.Metadata.Timeout = 0, time.Second
	sc.Net.DialTimeout = time.Second
	sc.Producer.Retry.Max = 1
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	eo := w.delivery == relay.ExactlyOnce
	r := w.startStreamRelayWith(t, func(c *relay.Config) {
		c.MeterProvider = mp
		if eo {
			// An exactly-once stream's transaction retries its requests
			// to the transaction coordinator until BatchTimeout, then
			// starts over from its record (whose initialisation is
			// bounded alike): 5 s instead of 30 makes three trips
			// through that path fit the wait below.
			c.BatchTimeout = 5 * time.Second
		}
	}, sc)
	// The relay's failures: at least once, its publisher's calls that
	// failed (it keeps the rows, backs off, reports its position,
	// receives more, tries again). Exactly once it sends through its own
	// transactional producer: its Kafka transactions that did not commit
	// (a failed batch, kept and retried as above), and its starts from
	// the stream's record (after a commit of unknown outcome, or with a
	// producer to initialise again, it ends the stream connection,
	// reconnects and receives again from the position it confirmed).
	const restart = "streaming from the replication slot, publishing what it decodes"
	failedTxns := func() int64 {
		return counterSum(t, reader, relay.MetricTransactions, func(s attribute.Set) bool {
			v, _ := s.Value(relay.AttrTxnOutcome)
			return v.AsString() != "committed"
		})
	}
	failures := func() int64 {
		if eo {
			return failedTxns() + int64(strings.Count(r.log.String(), restart))
		}
		return r.failed.Load()
	}
	waitFor(t, 30*time.Second, "the relay to stream", func() bool { return r.state() == relay.Streaming })
	ws := w.startWriters(t, 4)
	waitFor(t, 30*time.Second, "300 events published", func() bool { return w.published(t) >= 300 })

	b.kill(t)
	killed := time.Now()
	// No event committed after this position can be acknowledged: the
	// relay must not confirm past it until the broker is back.
	var walNow string
	if err := w.pool.QueryRow(w.ctx, "SELECT pg_current_wal_lsn()::text").Scan(&walNow); err != nil {
		t.Fatal(err)
	}
	mark, err := pglogrepl.ParseLSN(walNow)
	if err != nil {
		t.Fatal(err)
	}
	// Wait for three failures after the mark: the relay went through its
	// failure path with events received after the mark.
	failed := failures()
	waitFor(t, time.Minute, "three failures during the outage", func() bool { return failures() >= failed+3 })
	if eo {
		t.Logf("%d failures (%d Kafka transactions that did not commit, the rest restarts from the stream's record) in the %v since the broker was killed",
			failures()-failed, failedTxns(), time.Since(killed).Round(time.Second))
		if failedTxns() == 0 {
			t.Errorf("no Kafka transaction of the relay failed during the broker outage (%s)", relay.MetricTransactions)
		}
	} else {
		t.Logf("%d sends failed in the %v since the broker was killed", failures()-failed, time.Since(killed).Round(time.Second))
	}
	if n := w.unpublished(t); n == 0 {
		t.Fatal("nothing waits during the broker outage: the outage did not reach the relay")
	}
	var flushed string
	if err := w.pool.QueryRow(w.ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", testenv.Slot(t, w.pool, w.table)).Scan(&flushed); err != nil {
		t.Fatal(err)
	}
	slotLSN, err := pglogrepl.ParseLSN(flushed)
	if err != nil {
		t.Fatal(err)
	}
	if st := r.StreamStatus(); st.Confirmed > mark || slotLSN > mark {
		t.Errorf("during the outage the relay confirmed %v (slot confirmed_flush_lsn %v), past %v, the WAL position when the broker died: events after it cannot have been acknowledged", st.Confirmed, slotLSN, mark)
	} else {
		t.Logf("during the outage: confirmed %v, slot %v, WAL position when the broker died %v", st.Confirmed, slotLSN, mark)
	}
	if n := w.count(t, "attempts > 0 OR parked_at IS NOT NULL"); n != 0 {
		t.Errorf("%d rows charged or parked during the broker outage", n)
	}
	r.kill()

	upAfterOutage(t, b)
	r2 := w.startStreamRelay(t, nil)
	waitFor(t, 60*time.Second, "the new relay to stream", func() bool { return r2.state() == relay.Streaming })
	time.Sleep(time.Second)
	if errs := ws.halt(); len(errs) > 0 {
		t.Errorf("%d writer commits failed, first: %v (writers must never need Kafka)", len(errs), errs[0])
	}
	waitFor(t, 60*time.Second, "every event published", func() bool { return w.unpublished(t) == 0 })
	if n := w.count(t, "attempts > 0 OR parked_at IS NOT NULL OR last_error IS NOT NULL"); n != 0 {
		t.Errorf("%d rows were charged an attempt or parked because of a broker outage", n)
	}
	r2.stop(t)
	w.verify(t, 2)
	if eo {
		w.javaCheck(t)
	}
}

// counterSum reads the int64 counter name and sums its data points whose
// attributes keep accepts.
func counterSum(t *testing.T, reader sdkmetric.Reader, name string, keep func(attribute.Set) bool) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			d, ok := m.Data.(metricdata.Sum[int64])
			if m.Name != name || !ok {
				continue
			}
			for _, p := range d.DataPoints {
				if keep(p.Attributes) {
					n += p.Value
				}
			}
		}
	}
	return n
}

// slotsLost reads outbox.stream.slots_lost by outbox.stream.slot.loss.
func slotsLost(t *testing.T, reader sdkmetric.Reader) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			d, ok := m.Data.(metricdata.Sum[int64])
			if m.Name != relay.MetricStreamSlotsLost || !ok {
				continue
			}
			for _, p := range d.DataPoints {
				v, _ := p.Attributes.Value(relay.AttrSlotLoss)
				out[v.AsString()] += p.Value
			}
		}
	}
	return out
}
