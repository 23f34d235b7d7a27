package relay_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/relay/internal/kafkaproducer"
)

// streamEOConfig is an exactly-once Stream relay under cursor progress.
func streamEOConfig() relay.Config {
	cfg := streamCursorConfig()
	cfg.Delivery = relay.ExactlyOnce
	cfg.BatchSize, cfg.MaxBatchSize = 50, 200
	return cfg
}

// eoStreamer is an exactly-once streaming relay with its own producer.
type eoStreamer struct {
	r    *relay.Relay
	pub  *relay.SaramaPublisher
	done atomic.Bool
}

func (s *setup) startEOStream(t *testing.T, cfg relay.Config) *eoStreamer {
	t.Helper()
	pub, err := relay.NewSaramaPublisher(s.kafka(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	x := &eoStreamer{pub: pub, r: s.relay(t, pub, cfg)}
	if err := x.r.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { x.stop(t) })
	return x
}

func (x *eoStreamer) stop(t *testing.T) {
	t.Helper()
	if x.done.Swap(true) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := x.r.Stop(ctx); err != nil {
		t.Errorf("stop relay: %v", err)
	}
	_ = x.pub.Close()
}

// kill stops the relay without grace, as a crashed pod would.
func (x *eoStreamer) kill() {
	if x.done.Swap(true) {
		return
	}
	dead, cancel := context.WithCancel(context.Background())
	cancel()
	_ = x.r.Stop(dead)
	_ = x.pub.Close()
}

func (x *eoStreamer) streaming() bool { return x.r.StreamStatus().State == relay.Streaming }

// committedOnce waits for total distinct events on a read_committed
// consumer, gives a duplicate time to arrive, and checks that each came
// once, each key in order.
func committedOnce(t *testing.T, cons *testenv.Consumer, total int) {
	t.Helper()
	cons.WaitForDistinct(total, 60*time.Second)
	time.Sleep(time.Second)
	if dups := checkKeyOrder(t, cons.Messages(), total); dups > 0 {
		t.Errorf("read_committed: %d events delivered twice, want none", dups)
	}
}

// TestStreamExactlyOnceDelivers: events written before the slot existed
// (handed over by polling, in Kafka transactions with the lanes' records),
// and those the stream decodes (one transaction per batch with the
// stream's record), reach a read_committed consumer once, each key in
// order; a graceful restart resumes from the stream's record and sends
// nothing again.
func TestStreamExactlyOnceDelivers(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	s.cursor(t)
	topic := testenv.Topic(t, s.kafka(t), 4)
	cons := testenv.ConsumeCommitted(t, s.kafka(t), topic)
	s.writeSeq(t, topic, 0, 60, 6) // before the slot
	s.streaming(t)
	s.writeSeq(t, topic, 60, 60, 6)

	a := s.startEOStream(t, streamEOConfig())
	waitUntil(t, 60*time.Second, "streaming", a.streaming)
	s.writeSeq(t, topic, 120, 120, 6)
	cons.WaitForDistinct(240, 60*time.Second)
	a.stop(t)
	s.writeSeq(t, topic, 240, 60, 6)
	b := s.startEOStream(t, streamEOConfig())
	waitUntil(t, 60*time.Second, "streaming again", b.streaming)
	s.writeSeq(t, topic, 300, 60, 6)
	committedOnce(t, cons, 360)
	s.noRowUpdated(t)
	waitUntil(t, time.Minute, "the checkpoint to hold every event", func() bool { return s.waiting(t) == 0 })
}

// cuttable dials connections whose writes fail once cut is set: the
// replication connection of a relay that dies between its Kafka commits
// and the report of its position to the server.
type cuttable struct{ cut atomic.Bool }

type cutConn struct {
	net.Conn
	c *cuttable
}

func (c cutConn) Write(b []byte) (int, error) {
	if c.c.cut.Load() {
		return 0, errors.New("cut by the test")
	}
	return c.Conn.Write(b)
}

func (c *cuttable) config(t *testing.T, s *setup) *pgconn.Config {
	t.Helper()
	cfg := s.pool.Config().ConnConfig.Config.Copy()
	var d net.Dialer
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return cutConn{Conn: conn, c: c}, nil
	}
	return cfg
}

// slotConfirmed is the slot's confirmed position on the server.
func (s *setup) slotConfirmed(t *testing.T) pglogrepl.LSN {
	t.Helper()
	var lsn string
	if err := s.pool.QueryRow(s.ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", testenv.Slot(t, s.pool, s.table)).Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	l, err := pglogrepl.ParseLSN(lsn)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestStreamExactlyOnceKilledBeforeConfirm: the streaming relay commits
// its batches to Kafka, but the server never hears of the positions (the
// replication connection's writes fail, then the relay is killed). The
// next relay gets every transaction again from the slot; the stream's
// record says which are published, and a read_committed consumer gets each
// event once.
func TestStreamExactlyOnceKilledBeforeConfirm(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	s.cursor(t)
	topic := testenv.Topic(t, s.kafka(t), 4)
	cons := testenv.ConsumeCommitted(t, s.kafka(t), topic)
	s.streaming(t)
	var cut cuttable
	cfg := streamEOConfig()
	cfg.Stream.ConnConfig = cut.config(t, s)
	cfg.Stream.StatusInterval = time.Hour // the position is reported at Stop only
	a := s.startEOStream(t, cfg)
	waitUntil(t, 60*time.Second, "streaming", a.streaming)
	before := s.slotConfirmed(t)
	ws := s.startKeyWriters(t, topic, 3, 20)
	waitUntil(t, 2*time.Minute, "300 events published", func() bool { return len(cons.Messages()) >= 300 })
	cut.cut.Store(true)
	a.kill()
	total, err := ws.halt()
	if err != nil {
		t.Fatal(err)
	}
	if got := s.slotConfirmed(t); got != before {
		t.Fatalf("the slot's position moved from %v to %v: the test meant the server to hear of none", before, got)
	}
	published := len(cons.Messages())

	b := s.startEOStream(t, streamEOConfig())
	waitUntil(t, 60*time.Second, "streaming again", b.streaming)
	s.writeSeq(t, topic, 0, 40, 4) // keys of their own ("k0".."k3")
	committedOnce(t, cons, total+40)
	t.Logf("%d events, %d delivered before the kill, slot left at %v", total+40, published, before)
}

// TestStreamExactlyOnceFencedStreamer: while writers commit, the
// streaming relay's transactional id is initialised elsewhere (as a relay
// taking the slot over does): its open transaction is aborted and it stops
// streaming; it or the standby streams again from the stream's record.
// Then the streaming relay is killed and the standby takes over. A
// read_committed consumer gets every event once, each key in order.
func TestStreamExactlyOnceFencedStreamer(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	s.cursor(t)
	topic := testenv.Topic(t, s.kafka(t), 6)
	cons := testenv.ConsumeCommitted(t, s.kafka(t), topic)
	s.streaming(t)
	readerA, mpA := newReader(t)
	cfgA := streamEOConfig()
	cfgA.MeterProvider = mpA
	a := s.startEOStream(t, cfgA)
	waitUntil(t, 60*time.Second, "relay A to stream", a.streaming)
	b := s.startEOStream(t, streamEOConfig())
	waitUntil(t, 30*time.Second, "relay B to stand by", func() bool { return b.r.StreamStatus().State == relay.StreamStandby })
	ws := s.startKeyWriters(t, topic, 3, 20)
	waitUntil(t, 60*time.Second, "events published", func() bool { return len(cons.Messages()) >= 200 })

	// Fence A: what a relay taking the slot over does first.
	conf := relay.DefaultSaramaConfig()
	conf.Producer.Idempotent = false
	client, err := sarama.NewClient(s.kafka(t), conf)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	id := a.r.Config().TransactionalID + ".stream"
	// A relay that restarts its stream for a reason of its own just after
	// an Init initialises the id again and fences this one instead: the id
	// is initialised again every 15 s until relay A counts a fence.
	var inited time.Time
	inits := 0
	testenv.Eventually(t, 45*time.Second, func() (bool, string) {
		m := collect(t, readerA)
		if counter(m[relay.MetricFences], relay.AttrFenceSide.String("fenced")) > 0 {
			return true, ""
		}
		if time.Since(inited) >= 15*time.Second {
			if err := kafkaproducer.NewTxn(client, conf, id, 10*time.Second).Init(s.ctx); err != nil {
				t.Fatal(err)
			}
			inited, inits = time.Now(), inits+1
		}
		return false, fmt.Sprintf("relay A has not found it was fenced after %d Init(s) of %q; its stream is %v, its transactions: %d committed, %d aborted, %d unknown",
			inits, id, a.r.StreamStatus().State, counter(m[relay.MetricTransactions], relay.AttrTxnOutcome.String("committed")),
			counter(m[relay.MetricTransactions], relay.AttrTxnOutcome.String("aborted")), counter(m[relay.MetricTransactions], relay.AttrTxnOutcome.String("unknown")))
	})
	var streamer, standby *eoStreamer
	waitUntil(t, 60*time.Second, "a relay to stream again", func() bool {
		switch {
		case a.streaming():
			streamer, standby = a, b
		case b.streaming():
			streamer, standby = b, a
		default:
			return false
		}
		return true
	})
	n := len(cons.Messages())
	waitUntil(t, 60*time.Second, "more events published", func() bool { return len(cons.Messages()) >= n+200 })
	streamer.kill()
	waitUntil(t, 60*time.Second, "the standby to stream", standby.streaming)
	n = len(cons.Messages())
	waitUntil(t, 60*time.Second, "more events published", func() bool { return len(cons.Messages()) >= n+100 })
	total, err := ws.halt()
	if err != nil {
		t.Fatal(err)
	}
	committedOnce(t, cons, total)
}

// TestStreamExactlyOnceSlotDropped: the streaming relay is killed, its
// slot dropped, and writers go on; the next relay finds no slot, writes the
// stream's record into the lanes' positions, publishes what the table holds
// by polling while it makes a new slot, and streams again. A
// read_committed consumer gets every event once, each key in order.
func TestStreamExactlyOnceSlotDropped(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	s.cursor(t)
	topic := testenv.Topic(t, s.kafka(t), 4)
	cons := testenv.ConsumeCommitted(t, s.kafka(t), topic)
	slot := testenv.Streaming(t, s.pool, s.table, true)
	a := s.startEOStream(t, streamEOConfig())
	waitUntil(t, 60*time.Second, "streaming", a.streaming)
	ws := s.startKeyWriters(t, topic, 3, 20)
	waitUntil(t, 2*time.Minute, "events published", func() bool { return len(cons.Messages()) >= 300 })
	a.kill()
	waitUntil(t, 30*time.Second, "the slot dropped once the killed relay's walsender ended", func() bool {
		_, err := s.pool.Exec(s.ctx, "SELECT pg_drop_replication_slot($1)", slot)
		var pe *pgconn.PgError
		if err != nil && !(errors.As(err, &pe) && pe.Code == "55006") {
			t.Fatal(err)
		}
		return err == nil
	})
	n := ws.written.Load()
	waitUntil(t, 60*time.Second, "writes while no relay runs", func() bool { return ws.written.Load() >= n+200 })
	b := s.startEOStream(t, streamEOConfig())
	waitUntil(t, 2*time.Minute, "streaming on a new slot (after the handover from polling)", b.streaming)
	n = int64(len(cons.Messages()))
	waitUntil(t, 60*time.Second, "more events published", func() bool { return int64(len(cons.Messages())) >= n+100 })
	total, err := ws.halt()
	if err != nil {
		t.Fatal(err)
	}
	committedOnce(t, cons, total)
	waitUntil(t, time.Minute, "the checkpoint to hold every event", func() bool { return s.waiting(t) == 0 })
}

// TestStreamExactlyOnceReconnects: while writers commit, the streaming
// relay's replication connection is ended on the server five times (as a
// PostgreSQL restart ends it); each time the relay connects again and
// resumes from the stream's record. A read_committed consumer gets every
// event once, each key in order.
func TestStreamExactlyOnceReconnects(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	s.cursor(t)
	topic := testenv.Topic(t, s.kafka(t), 4)
	cons := testenv.ConsumeCommitted(t, s.kafka(t), topic)
	s.streaming(t)
	a := s.startEOStream(t, streamEOConfig())
	waitUntil(t, 60*time.Second, "streaming", a.streaming)
	ws := s.startKeyWriters(t, topic, 3, 20)
	slot := testenv.Slot(t, s.pool, s.table)
	for i := range 5 {
		n := len(cons.Messages())
		waitUntil(t, 2*time.Minute, "events published", func() bool { return len(cons.Messages()) >= n+100 })
		var pid *int32
		waitUntil(t, 2*time.Minute, "a walsender on the slot", func() bool {
			err := s.pool.QueryRow(s.ctx, "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&pid)
			return err == nil && pid != nil
		})
		if _, err := s.pool.Exec(s.ctx, "SELECT pg_terminate_backend($1)", *pid); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, 2*time.Minute, fmt.Sprintf("round %d: streaming again on a new walsender", i), func() bool {
			var now *int32
			err := s.pool.QueryRow(s.ctx, "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&now)
			return err == nil && now != nil && *now != *pid && a.streaming()
		})
	}
	total, err := ws.halt()
	if err != nil {
		t.Fatal(err)
	}
	committedOnce(t, cons, total)
}
