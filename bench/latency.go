package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/google/uuid"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/admin"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// LatencyRun is one contender at one offered rate in one round.
type LatencyRun struct {
	Contender string  `json:"contender"`
	Rate      int     `json:"offered_eps"`
	Achieved  float64 `json:"achieved_eps"`
	Committed int     `json:"committed"`
	Missing   int     `json:"missing"`    // committed but not consumed within the grace period
	CatchUpS  float64 `json:"catch_up_s"` // from the last commit to the last arrival
	P50       float64 `json:"p50_ms"`
	P99       float64 `json:"p99_ms"`
	P999      float64 `json:"p999_ms"`
	Max       float64 `json:"max_ms"`
	Mean      float64 `json:"mean_ms"`
	// WarmupMax is the worst wait of the warm-up's events (not in the
	// percentiles).
	WarmupMax float64 `json:"warmup_max_ms"`
	Saturated bool    `json:"saturated,omitempty"`
	// WritersShort: the writers committed under 90% of the offered rate.
	WritersShort bool `json:"writers_short,omitempty"`
	// PGUsPerEvent is the CPU time of the PostgreSQL backends serving the
	// benchmark's sessions (writers and fxoutbox relays, while writing and
	// catching up) per committed event, in microseconds.
	PGUsPerEvent float64 `json:"pg_us_per_event,omitempty"`
}

// LatencySeries is the median over rounds of one contender at one rate.
type LatencySeries struct {
	Contender    string       `json:"contender"`
	Desc         string       `json:"desc"`
	Rate         int          `json:"offered_eps"`
	P50          float64      `json:"p50_ms"`
	P99          float64      `json:"p99_ms"`
	P999         float64      `json:"p999_ms"`
	Achieved     float64      `json:"achieved_eps"`
	Saturated    bool         `json:"saturated,omitempty"` // in most rounds
	WritersShort bool         `json:"writers_short,omitempty"`
	Rounds       []LatencyRun `json:"rounds"`
}

// Latency is section 2. The headline figures are fxoutbox with its defaults
// and the in-process wake-up (what fxoutbox.Module wires) at 1k events/s.
type Latency struct {
	P50  float64        `json:"p50_ms"`
	P99  float64        `json:"p99_ms"`
	P999 float64        `json:"p999_ms"`
	At5k map[string]any `json:"at_5k"`
	// The steady latency with replicas at 1k events/s: 3 relays in separate
	// processes against 1 (defaults + Listen, writers with the Notifier).
	Replicas1P50    float64 `json:"replicas1_procs_p50_ms,omitempty"`
	Replicas1P99    float64 `json:"replicas1_procs_p99_ms,omitempty"`
	Replicas3P50    float64 `json:"replicas3_procs_p50_ms,omitempty"`
	Replicas3P99    float64 `json:"replicas3_procs_p99_ms,omitempty"`
	Replicas3P50Vs1 float64 `json:"replicas3_p50_vs_1,omitempty"`
	Replicas3P99Vs1 float64 `json:"replicas3_p99_vs_1,omitempty"`
	// fxoutbox wake with cursor progress (relay.ProgressCursor) at 1k/s.
	CursorP50 float64 `json:"cursor_p50_ms,omitempty"`
	// EOP50, EOP99: "fxoutbox wake exactly-once" at 1k/s, read committed.
	EOP50      float64 `json:"eo_p50_ms,omitempty"`
	EOP99      float64 `json:"eo_p99_ms,omitempty"`
	CursorP99  float64 `json:"cursor_p99_ms,omitempty"`
	CursorP999 float64 `json:"cursor_p999_ms,omitempty"`
	// The same at 1k/s while a transaction that wrote events stays open
	// for the whole run (60 s), beside the run without it, cursor and
	// marks; OpenTxHeldLost counts the runs whose held events were not
	// all delivered within 30 s of its commit (the goal is 0).
	CursorOpenTxP50   float64          `json:"cursor_open_tx_p50_ms,omitempty"`
	CursorOpenTxP99   float64          `json:"cursor_open_tx_p99_ms,omitempty"`
	CursorOpenTxP99Vs float64          `json:"cursor_open_tx_p99_vs_without,omitempty"`
	MarksOpenTxP99    float64          `json:"marks_open_tx_p99_ms,omitempty"`
	MarksOpenTxP99Vs  float64          `json:"marks_open_tx_p99_vs_without,omitempty"`
	OpenTxHeldLost    int64            `json:"open_tx_held_lost"`
	Note              string           `json:"note"`
	Series            []*LatencySeries `json:"series"`
}

// heldLost counts the open-transaction runs whose held events were not
// delivered after its commit.
var heldLost atomic.Int64

type latContender struct {
	name, desc string
	// start starts the publishing side and returns a write function (one
	// business transaction recording one event with id) and a stop function.
	start func(ctx context.Context, topic, warm string) (write func(ctx context.Context, id uuid.UUID, key, seq int) error, stop func(), err error)
	rates map[int]bool // nil: every rate
	// committed: the consumer reads committed (exactly-once contenders:
	// an event counts when its transaction committed).
	committed bool
	// long: the run lasts 60 s (the default run's length when quick).
	long bool
}

func runLatency(ctx context.Context, e *env) (*Latency, error) {
	p := e.p
	warm, err := e.newTopic("warmup")
	if err != nil {
		return nil, err
	}
	defer e.dropTopic(warm)
	fxStartP := func(wake, listen bool, batch int, delivery relay.Delivery, progress relay.Progress, openTx bool) func(ctx context.Context, topic, warm string) (func(context.Context, uuid.UUID, int, int) error, func(), error) {
		return func(ctx context.Context, topic, warm string) (func(context.Context, uuid.UUID, int, int) error, func(), error) {
			table := e.table
			if progress == relay.ProgressCursor {
				table = e.ctable // with the cursor migration; truncate empties its positions too
			}
			if err := e.truncate(ctx, table); err != nil {
				return nil, nil, err
			}
			sp, err := relay.NewSaramaPublisher(e.brokers, producerConfig("fxoutbox"))
			if err != nil {
				return nil, nil, err
			}
			if err := sp.Publish(ctx, []relay.Message{{Topic: warm, Key: []byte("k"), Value: []byte(`{}`)}}); err != nil {
				return nil, nil, err
			}
			rc := &relay.Config{Table: table, Listen: listen, BatchSize: batch, Delivery: delivery, Progress: progress} // zero values: the defaults
			r, err := relay.New(e.pool, sp, rc)
			if err != nil {
				return nil, nil, err
			}
			cfg := &unitofwork.Config{Table: table}
			var notifier *unitofwork.Notifier
			switch {
			case wake:
				cfg.OnCommit = func(int) { r.Wake() } // what fxoutbox.Module wires in one process
			case listen:
				// A writer in another process: the coalesced NOTIFY after commit.
				if notifier, err = unitofwork.NewNotifier(e.pool, table, 0, nil); err != nil {
					return nil, nil, err
				}
				cfg.OnCommit = notifier.OnCommit
			}
			uow, err := unitofwork.New(e.pool, cfg)
			if err != nil {
				return nil, nil, err
			}
			if err := r.Start(ctx); err != nil {
				return nil, nil, err
			}
			if delivery == relay.ExactlyOnce {
				// Connect the transactional producers before the clock
				// starts: one warm-up event through the relay.
				if err := uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
					return tx.Add(ctx, outbox.Event{AggregateType: aggregateType, AggregateID: "warm", Type: eventType, Topic: warm, Payload: json.RawMessage(`{}`)})
				}); err != nil {
					return nil, nil, err
				}
				if err := e.waitPublished(ctx, 30*time.Second); err != nil {
					return nil, nil, err
				}
			}
			var long pgx.Tx
			if openTx {
				// A transaction that wrote its events and stays open while
				// the others write: under cursor progress it is in every
				// lane's done snapshot until it commits.
				if long, err = e.pool.Begin(ctx); err != nil {
					return nil, nil, err
				}
				for i := range 3 {
					if err := uow.AddTx(ctx, long, outbox.Event{AggregateType: aggregateType, AggregateID: "held", Type: eventType,
						Topic: warm, Payload: json.RawMessage(payload(0, i))}); err != nil {
						_ = long.Rollback(ctx)
						return nil, nil, err
					}
				}
			}
			write := func(ctx context.Context, id uuid.UUID, key, seq int) error {
				return uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
					return tx.Add(ctx, outbox.Event{ID: id, AggregateType: aggregateType, AggregateID: orderID(key), Type: eventType,
						Topic: topic, Payload: json.RawMessage(payload(key, seq))})
				})
			}
			stop := func() {
				sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				if long != nil {
					// The held events are delivered once it commits.
					if err := long.Commit(sctx); err != nil {
						log.Printf("latency: the open transaction's commit: %v", err)
						heldLost.Add(1)
					} else if err := waitDelivered(sctx, e.pool, table); err != nil {
						log.Printf("latency: LOST: the open transaction's events: %v", err)
						heldLost.Add(1)
					}
				}
				_ = r.Stop(sctx)
				_ = sp.Close()
				if notifier != nil {
					notifier.Close()
				}
			}
			return write, stop, nil
		}
	}
	// procsStart runs k relays in separate processes (defaults + Listen),
	// the writers here sending the coalesced NOTIFY after commit: pods whose
	// relays wake on any pod's commits.
	procsStart := func(k int) func(ctx context.Context, topic, warm string) (func(context.Context, uuid.UUID, int, int) error, func(), error) {
		return func(ctx context.Context, topic, warm string) (func(context.Context, uuid.UUID, int, int) error, func(), error) {
			if _, err := e.pool.Exec(ctx, "TRUNCATE "+ident(e.table)+" RESTART IDENTITY"); err != nil {
				return nil, nil, err
			}
			ps, err := e.startRelayProcs(ctx, k, 0, true, warm, func(int) {})
			if err != nil {
				return nil, nil, err
			}
			if err := ps.start(); err != nil {
				_ = ps.stop()
				return nil, nil, err
			}
			notifier, err := unitofwork.NewNotifier(e.pool, e.table, 0, nil)
			if err != nil {
				_ = ps.stop()
				return nil, nil, err
			}
			uow, err := unitofwork.New(e.pool, &unitofwork.Config{Table: e.table, OnCommit: notifier.OnCommit})
			if err != nil {
				notifier.Close()
				_ = ps.stop()
				return nil, nil, err
			}
			write := func(ctx context.Context, id uuid.UUID, key, seq int) error {
				return uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
					return tx.Add(ctx, outbox.Event{ID: id, AggregateType: aggregateType, AggregateID: orderID(key), Type: eventType,
						Topic: topic, Payload: json.RawMessage(payload(key, seq))})
				})
			}
			stop := func() {
				if err := ps.stop(); err != nil {
					log.Printf("relay processes: %v", err)
				}
				notifier.Close()
			}
			return write, stop, nil
		}
	}
	fxStart := func(wake, listen bool, batch int, delivery relay.Delivery) func(ctx context.Context, topic, warm string) (func(context.Context, uuid.UUID, int, int) error, func(), error) {
		return fxStartP(wake, listen, batch, delivery, relay.ProgressMarks, false)
	}
	wmStart := func(ctx context.Context, topic, warm string) (func(context.Context, uuid.UUID, int, int) error, func(), error) {
		if err := e.resetWatermill(ctx); err != nil {
			return nil, nil, err
		}
		_, stopFwd, err := e.startForwarder(ctx, warm, 0, newProgress(1<<62))
		if err != nil {
			return nil, nil, err
		}
		write := func(ctx context.Context, id uuid.UUID, key, seq int) error {
			tx, err := e.sqldb.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			m := wmMessage(key, seq)
			m.UUID = id.String()
			if err := wmPublishTx(tx, topic, m); err != nil {
				_ = tx.Rollback()
				return err
			}
			return tx.Commit()
		}
		return write, func() { _ = stopFwd() }, nil
	}
	cs := []latContender{
		{name: "fxoutbox wake", desc: "defaults, woken in-process after each commit (fxoutbox.Module)", start: fxStart(true, false, 0, relay.AtLeastOnce)},
		{name: "fxoutbox wake cursor", desc: "defaults + Progress ProgressCursor (on a table with the cursor migration), woken in-process after each commit", start: fxStartP(true, false, 0, relay.AtLeastOnce, relay.ProgressCursor, false), rates: map[int]bool{1000: true}},
		{name: "fxoutbox wake cursor open-tx", desc: "as fxoutbox wake cursor, while a transaction that wrote 3 events stays open for the whole run (60 s; quick: the run's length); it commits at the end and its events must be delivered within 30 s", start: fxStartP(true, false, 0, relay.AtLeastOnce, relay.ProgressCursor, true), rates: map[int]bool{1000: true}, long: true},
		{name: "fxoutbox wake open-tx", desc: "as fxoutbox wake (marks), while a transaction that wrote 3 events stays open for the whole run (60 s; quick: the run's length)", start: fxStartP(true, false, 0, relay.AtLeastOnce, relay.ProgressMarks, true), rates: map[int]bool{1000: true}, long: true},
		{name: "fxoutbox wake exactly-once", desc: "defaults + Delivery ExactlyOnce, woken in-process after each commit; the consumer reads committed", start: fxStart(true, false, 0, relay.ExactlyOnce), committed: true},
		{name: "fxoutbox listen", desc: "defaults + Listen, writers use unitofwork.Notifier (relay in another process)", start: fxStart(false, true, 0, relay.AtLeastOnce)},
		{name: "fxoutbox ticker", desc: "defaults, no wake-up: 500 ms ticker only", start: fxStart(false, false, 0, relay.AtLeastOnce)},
		{name: "fxoutbox wake b500", desc: "BatchSize 500, woken in-process after each commit", start: fxStart(true, false, 500, relay.AtLeastOnce), rates: map[int]bool{5000: true}},
		{name: "fxoutbox listen x1 proc", desc: "defaults + Listen, 1 relay in a process of its own, writers use unitofwork.Notifier", start: procsStart(1), rates: map[int]bool{1000: true}},
		{name: "fxoutbox listen x3 procs", desc: "defaults + Listen, 3 relays in separate processes on one table, writers use unitofwork.Notifier", start: procsStart(3), rates: map[int]bool{1000: true}},
		{name: "watermill", desc: "Forwarder with watermill-sql defaults (1 s poll, batch 100)", start: wmStart},
	}
	if p.Quick {
		for i := range cs {
			switch cs[i].name {
			case "fxoutbox listen", "fxoutbox ticker", "watermill":
				cs[i].rates = map[int]bool{1000: true}
			case "fxoutbox wake b500":
				cs[i].rates = map[int]bool{} // not in the quick run
			}
		}
	}
	if re := e.p.contenders; re != nil { // BENCH_CONTENDERS: a subset, while tuning
		kept := cs[:0]
		for _, c := range cs {
			if re.MatchString(c.name) {
				kept = append(kept, c)
			}
		}
		cs = kept
	}
	series := map[string]*LatencySeries{}
	var order []*LatencySeries
	for r := range p.LatRounds {
		for _, rate := range p.LatRates {
			for _, c := range cs {
				if c.rates != nil && !c.rates[rate] {
					continue
				}
				if err := ctx.Err(); err != nil {
					return nil, err
				}
				key := fmt.Sprintf("%s@%d", c.name, rate)
				s := series[key]
				if s == nil {
					s = &LatencySeries{Contender: c.name, Desc: c.desc, Rate: rate}
					series[key] = s
					order = append(order, s)
				}
				e.checkpoint(ctx)
				run, err := e.measureLatency(ctx, c, warm, rate)
				if err != nil {
					return nil, fmt.Errorf("%s at %d/s: %w", c.name, rate, err)
				}
				s.Rounds = append(s.Rounds, run)
				sat := ""
				if run.Saturated {
					sat = fmt.Sprintf("  SATURATED (%d not consumed, %.1f s to catch up)", run.Missing, run.CatchUpS)
				}
				if run.WritersShort {
					sat += fmt.Sprintf("  (writers reached only %.0f/s)", run.Achieved)
				}
				log.Printf("latency round %d/%d  %-16s @%5d/s  p50 %7.1f ms  p99 %7.1f ms  p99.9 %7.1f ms  (n=%d; PostgreSQL %.1f µs/event)%s",
					r+1, p.LatRounds, c.name, rate, run.P50, run.P99, run.P999, run.Committed, run.PGUsPerEvent, sat)
			}
		}
	}
	l := &Latency{Series: order, At5k: map[string]any{}}
	for _, s := range order {
		var p50, p99, p999, ach []float64
		nSat, nShort := 0, 0
		for _, r := range s.Rounds {
			p50, p99, p999, ach = append(p50, r.P50), append(p99, r.P99), append(p999, r.P999), append(ach, r.Achieved)
			if r.Saturated {
				nSat++
			}
			if r.WritersShort {
				nShort++
			}
		}
		s.P50, s.P99, s.P999, s.Achieved = round2(median(p50)), round2(median(p99)), round2(median(p999)), round1(median(ach))
		// Like the figures, the flags follow the majority of the rounds.
		s.Saturated, s.WritersShort = 2*nSat > len(s.Rounds), 2*nShort > len(s.Rounds)
		if s.Contender == "fxoutbox wake" && s.Rate == 1000 {
			l.P50, l.P99, l.P999 = s.P50, s.P99, s.P999
		}
		if s.Contender == "fxoutbox wake exactly-once" && s.Rate == 1000 {
			l.EOP50, l.EOP99 = s.P50, s.P99
		}
		if s.Contender == "fxoutbox wake cursor" && s.Rate == 1000 {
			l.CursorP50, l.CursorP99, l.CursorP999 = s.P50, s.P99, s.P999
		}
		switch {
		case s.Contender == "fxoutbox wake cursor open-tx" && s.Rate == 1000:
			l.CursorOpenTxP50, l.CursorOpenTxP99 = s.P50, s.P99
		case s.Contender == "fxoutbox wake open-tx" && s.Rate == 1000:
			l.MarksOpenTxP99 = s.P99
		}
		if s.Rate == 5000 {
			l.At5k[s.Contender] = map[string]float64{"p50_ms": s.P50, "p99_ms": s.P99, "p999_ms": s.P999}
		}
	}
	if l.CursorOpenTxP99 > 0 && l.CursorP99 > 0 {
		l.CursorOpenTxP99Vs = round2(l.CursorOpenTxP99 / l.CursorP99)
	}
	if l.MarksOpenTxP99 > 0 && l.P99 > 0 {
		l.MarksOpenTxP99Vs = round2(l.MarksOpenTxP99 / l.P99)
	}
	l.OpenTxHeldLost = heldLost.Load()
	for _, s := range order {
		if s.Contender == "fxoutbox listen x3 procs" && s.Rate == 1000 {
			for _, one := range order {
				if one.Contender == "fxoutbox listen x1 proc" && one.Rate == 1000 && one.P50 > 0 && one.P99 > 0 {
					l.Replicas3P50, l.Replicas3P99 = s.P50, s.P99
					l.Replicas1P50, l.Replicas1P99 = one.P50, one.P99
					l.Replicas3P50Vs1, l.Replicas3P99Vs1 = round2(s.P50/one.P50), round2(s.P99/one.P99)
				}
			}
		}
	}
	l.Note = fmt.Sprintf("commit-to-consumer: %d writers commit one event per transaction at the offered rate for %.0f s, after a warm-up of %.0f s at that rate whose events are not in the percentiles (its worst wait is each round's warmup_max_ms); the commit time is taken when UnitOfWork.Do (or tx.Commit) returns, the arrival time when a sarama consumer (all partitions, same process) receives the record; medians over %d round(s). A contender still more than 1 s behind when the writers stop, or with a median over 1 s, is marked saturated (its percentiles cover what arrived within %.0f s); achieved/s below 90%% of the offered rate means the writers themselves could not commit faster on this machine.",
		p.LatWriters, p.LatDurationS, p.LatWarmupS, p.LatRounds, graceFor(p).Seconds())
	return l, nil
}

func graceFor(p params) time.Duration {
	if p.Quick {
		return 3 * time.Second
	}
	return 8 * time.Second
}

func (e *env) measureLatency(ctx context.Context, c latContender, warm string, rate int) (LatencyRun, error) {
	p := e.p
	topic, err := e.newTopic("lat")
	if err != nil {
		return LatencyRun{}, err
	}
	defer e.dropTopic(topic)

	// The consumer, started first, reading every partition from the start.
	var (
		mu       sync.Mutex
		arrivals = map[string]time.Time{}
		consumed atomic.Int64
	)
	ccfg := sarama.NewConfig()
	ccfg.Version = sarama.V2_8_0_0
	ccfg.ClientID = "fxbench-consumer"
	if c.committed {
		ccfg.Consumer.IsolationLevel = sarama.ReadCommitted
	}
	consumer, err := sarama.NewConsumer(e.brokers, ccfg)
	if err != nil {
		return LatencyRun{}, err
	}
	parts, err := consumer.Partitions(topic)
	if err != nil {
		consumer.Close()
		return LatencyRun{}, err
	}
	var cwg sync.WaitGroup
	var pcs []sarama.PartitionConsumer
	defer func() {
		for _, pc := range pcs {
			pc.AsyncClose()
		}
		cwg.Wait()
		consumer.Close()
	}()
	for _, part := range parts {
		pc, err := consumer.ConsumePartition(topic, part, sarama.OffsetOldest)
		if err != nil {
			return LatencyRun{}, err
		}
		pcs = append(pcs, pc)
		cwg.Add(1)
		go func() {
			defer cwg.Done()
			for m := range pc.Messages() {
				now := time.Now()
				var id string
				for _, h := range m.Headers {
					if k := string(h.Key); k == outbox.HeaderEventID || k == wmkafka.UUIDHeaderKey {
						id = string(h.Value)
						break
					}
				}
				mu.Lock()
				if _, dup := arrivals[id]; !dup {
					arrivals[id] = now
				}
				mu.Unlock()
				consumed.Add(1)
			}
		}()
	}

	write, stop, err := c.start(ctx, topic, warm)
	if err != nil {
		return LatencyRun{}, err
	}
	stopped := false
	defer func() {
		if !stopped {
			stop()
		}
	}()

	d := p.latDuration()
	if c.long && !p.Quick {
		d = 60 * time.Second
	}
	warmN := int(float64(rate) * p.latWarmup().Seconds())
	total := warmN + int(float64(rate)*d.Seconds())
	tokens := make(chan int, total)
	type commit struct {
		id  string
		at  time.Time
		seq int
	}
	commits := make([][]commit, p.LatWriters)
	var werr atomic.Value
	var wg sync.WaitGroup
	for w := range p.LatWriters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := range tokens {
				id, _ := uuid.NewV7()
				if err := write(ctx, id, randKey(p.Keys), seq); err != nil {
					werr.CompareAndSwap(nil, err)
					continue
				}
				commits[w] = append(commits[w], commit{id.String(), time.Now(), seq})
			}
		}()
	}
	// Open-loop pacing: token i is due at t0 + i/rate.
	pg0 := e.pgBackendCPU(ctx)
	t0 := time.Now()
	for i := 0; i < total; {
		due := min(total, int(time.Since(t0).Seconds()*float64(rate))+1)
		for ; i < due; i++ {
			tokens <- i
		}
		time.Sleep(200 * time.Microsecond)
	}
	close(tokens)
	wg.Wait()
	writeElapsed := time.Since(t0)
	if err, _ := werr.Load().(error); err != nil {
		return LatencyRun{}, fmt.Errorf("write: %w", err)
	}
	var all []commit
	for _, cs := range commits {
		all = append(all, cs...)
	}
	// Grace period for the tail.
	stopWrites := time.Now()
	deadline := stopWrites.Add(graceFor(p))
	for consumed.Load() < int64(len(all)) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	catchUp := time.Since(stopWrites)
	pgUsed := pg0.until(e.pgBackendCPU(ctx)) // before the relays close their sessions
	stop()
	stopped = true

	mu.Lock()
	defer mu.Unlock()
	lats := make([]time.Duration, 0, len(all))
	missing := 0
	var sum, warmMax time.Duration
	for _, c := range all {
		a, ok := arrivals[c.id]
		if !ok {
			missing++
			continue
		}
		d := max(0, a.Sub(c.at))
		if c.seq < warmN {
			warmMax = max(warmMax, d)
			continue
		}
		lats = append(lats, d)
		sum += d
	}
	slices.Sort(lats)
	run := LatencyRun{
		Contender: c.name,
		Rate:      rate,
		Achieved:  round1(float64(len(all)) / writeElapsed.Seconds()),
		Committed: len(all),
		Missing:   missing,
		P50:       percentileMS(lats, 0.50),
		P99:       percentileMS(lats, 0.99),
		P999:      percentileMS(lats, 0.999),
		Max:       percentileMS(lats, 1),
		WarmupMax: round2(float64(warmMax) / float64(time.Millisecond)),
		CatchUpS:  round3(catchUp.Seconds()),
		// The publishing side did not keep up: events left behind, a
		// backlog that took over a second to clear after the writers
		// stopped, or a median wait over a second.
		Saturated: missing > 0 || catchUp > time.Second || percentileMS(lats, 0.5) > 1000,
		// The writers themselves could not commit the offered rate.
		WritersShort: float64(len(all))/writeElapsed.Seconds() < 0.9*float64(rate),
	}
	if len(lats) > 0 {
		run.Mean = round2(float64(sum) / float64(len(lats)) / float64(time.Millisecond))
	}
	if pgUsed >= 0 && len(all) > 0 {
		run.PGUsPerEvent = round2(pgUsed / float64(len(all)) * 1e6)
	}
	return run, nil
}

// waitPublished waits until the table has no unpublished row.
// waitDelivered waits until table has no backlog (marks or cursor
// positions, as admin reads it).
func waitDelivered(ctx context.Context, pool *pgxpool.Pool, table outbox.Table) error {
	for {
		st, err := admin.ReadStatus(ctx, pool, table, nil)
		if err != nil {
			return err
		}
		if st.Backlog == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d events not delivered: %w", st.Backlog, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (e *env) waitPublished(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		var n int
		if err := e.pool.QueryRow(ctx, "SELECT count(*) FROM "+ident(e.table)+" WHERE published_at IS NULL").Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d events still unpublished after %v", n, limit)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
