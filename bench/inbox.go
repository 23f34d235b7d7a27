package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/inbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/migrations"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// Inbox is section 5: consuming with package inbox. Rates are records
// applied per second, from the first record processed to the last one
// committed (the group join is not counted), medians over rounds.
type Inbox struct {
	// Where these figures come from: BENCH_ONLY=inbox runs record only
	// this section, and may be merged into a results file of a full run.
	Command      string `json:"command"`
	StartedAt    string `json:"started_at"`
	LoadAvgStart string `json:"loadavg_start"`
	LoadAvgEnd   string `json:"loadavg_end"`

	Events     int `json:"events"`
	Keys       int `json:"distinct_keys"`
	Partitions int `json:"partitions"`
	Rounds     int `json:"rounds"`
	// InboxEPS and PlainEPS are the inbox and a plain sarama consumer
	// group at 16 records in flight per partition (on distinct keys);
	// OverheadRatio is InboxEPS/PlainEPS (median of the per-round ratios).
	InboxEPS      float64 `json:"inbox_eps"`
	PlainEPS      float64 `json:"plain_eps"`
	OverheadRatio float64 `json:"overhead_ratio"`
	// The same two, one record at a time per partition.
	InboxSerialEPS      float64 `json:"inbox_serial_eps"`
	PlainSerialEPS      float64 `json:"plain_serial_eps"`
	OverheadRatioSerial float64 `json:"overhead_ratio_serial"`
	// KeyParallelSpeedup is Concurrency 16 over 1 on a topic of one
	// partition (OnePartitionEvents events, the same keys): the speed-up of
	// key-parallel processing over partition-serial at 16-way concurrency.
	// Inbox1EPS and InboxSerial1EPS are its two rates, Plain1EPS and
	// PlainSerial1EPS the plain group's, PlainKeyParallelSpeedup their
	// ratio.
	OnePartitionEvents      int     `json:"one_partition_events"`
	Inbox1EPS               float64 `json:"inbox_1p_eps"`
	InboxSerial1EPS         float64 `json:"inbox_serial_1p_eps"`
	Plain1EPS               float64 `json:"plain_1p_eps"`
	PlainSerial1EPS         float64 `json:"plain_serial_1p_eps"`
	KeyParallelSpeedup      float64 `json:"keyparallel_speedup"`
	PlainKeyParallelSpeedup float64 `json:"plain_keyparallel_speedup"`
	// KeyParallelSpeedup6 is InboxEPS / InboxSerialEPS (six partitions,
	// where Concurrency 1 already has six transactions in flight and the
	// two cores are mostly busy), PlainKeyParallelSpeedup6 the plain
	// group's.
	KeyParallelSpeedup6      float64 `json:"keyparallel_speedup_6p"`
	PlainKeyParallelSpeedup6 float64 `json:"plain_keyparallel_speedup_6p"`
	// HandDedupeEPS is the plain group at 16 writing the inbox's row
	// itself in each transaction (hand-written dedupe), and
	// InboxVsHandDedupe InboxEPS over it: the inbox's own cost beyond the
	// row.
	// Batch handling (inbox.Config.BatchSize 50): InboxBatchEPS the inbox at
	// Concurrency 16 applying up to 50 ready records per transaction,
	// PlainBatchEPS the plain group batching the same way (a statement per
	// record, one COMMIT). OverheadRatioBatch is their ratio (the inbox's
	// cost when both batch); InboxBatchVsPlain is InboxBatchEPS over
	// PlainEPS, the plain group with a transaction per record.
	InboxBatchEPS      float64 `json:"inbox_batch_eps"`
	PlainBatchEPS      float64 `json:"plain_batch_eps"`
	OverheadRatioBatch float64 `json:"overhead_ratio_batch"`
	InboxBatchVsPlain  float64 `json:"inbox_batch_vs_plain"`
	HandDedupeEPS      float64 `json:"handwritten_dedupe_eps"`
	InboxVsHandDedupe  float64 `json:"inbox_vs_handwritten_dedupe"`
	// ReadUncommittedEPS is the inbox at Concurrency 16 with
	// Sarama.Consumer.IsolationLevel = sarama.ReadUncommitted, and
	// CommittedVsUncommitted InboxEPS (the default, ReadCommitted) over it:
	// what reading committed costs (issue 32 asks for nothing measurable).
	ReadUncommittedEPS     float64 `json:"inbox_read_uncommitted_eps"`
	CommittedVsUncommitted float64 `json:"read_committed_vs_uncommitted"`
	// Commit-to-applied latency through the whole chain at LatencyRate.
	LatencyRate     int     `json:"latency_offered_eps"`
	LatencyAchieved float64 `json:"latency_achieved_eps"`
	LatencyP50      float64 `json:"latency_p50_ms"`
	LatencyP99      float64 `json:"latency_p99_ms"`
	LatencyP999     float64 `json:"latency_p999_ms"`
	LatencyMissing  int     `json:"latency_missing"`
	// PGUsPerRecord is, per contender, the median CPU time the
	// benchmark's PostgreSQL backends spent per record (microseconds):
	// where the cores go when the machine is saturated, and unlike the
	// rates hardly moved by other load on the machine.
	PGUsPerRecord map[string]float64 `json:"pg_us_per_record,omitempty"`
	Runs          []InboxRun         `json:"runs"`
	Note          string             `json:"note"`
}

// InboxRun is one contender in one round.
type InboxRun struct {
	Contender string  `json:"contender"`
	Round     int     `json:"round"`
	EPS       float64 `json:"eps"`
	Applied   int     `json:"applied"`
	// CPU is where the machine's cores went from the first record
	// processed to the last one committed; PGUsPerRecord the CPU time of
	// the benchmark's PostgreSQL backends per record (microseconds; 0 when
	// PostgreSQL runs elsewhere).
	CPU           *CPUUse `json:"cpu,omitempty"`
	PGUsPerRecord float64 `json:"pg_us_per_record,omitempty"`
}

type inboxContender struct {
	name        string
	concurrency int
	plain       bool
	dedupe      bool // plain, with the inbox's row written by hand
	batch       int  // records per transaction at most (inbox.Config.BatchSize); 0 is 1
	one         bool // on the topic of one partition
	uncommitted bool // Consumer.IsolationLevel = sarama.ReadUncommitted (the default reads committed)
}

func runInbox(ctx context.Context, e *env) (*Inbox, error) {
	const partitions, keys = 6, 200
	n, n1, rounds := 20_000, 10_000, 3
	if e.p.Quick {
		n, n1, rounds = 10_000, 5_000, 1
	}
	if e.p.DrainRounds > 0 && !e.p.Quick {
		rounds = e.p.DrainRounds
	}
	res := &Inbox{Events: n, Keys: keys, Partitions: partitions, Rounds: rounds, OnePartitionEvents: n1,
		Command: command(e.p), StartedAt: time.Now().UTC().Format(time.RFC3339), LoadAvgStart: loadavg()}
	if only := os.Getenv("BENCH_ONLY"); only != "" {
		res.Command = "BENCH_ONLY=" + only + " " + res.Command
	}
	defer func() { res.LoadAvgEnd = loadavg() }()
	inboxTable := outbox.Table{Schema: schema}
	if err := migrations.Inbox.Up(ctx, e.pool, inboxTable); err != nil {
		return nil, err
	}
	if _, err := e.pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+schema+`.invoices (
		id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		order_id text   NOT NULL,
		event_id text   NOT NULL,
		amount   bigint NOT NULL)`); err != nil {
		return nil, err
	}
	topic, err := e.newTopicN("inbox", partitions)
	if err != nil {
		return nil, err
	}
	defer e.dropTopic(topic)
	if err := e.fillInboxTopic(ctx, topic, n, keys); err != nil {
		return nil, err
	}
	// Key-parallel vs partition-serial is measured on one partition: with
	// six, partition-serial already runs six transactions at once.
	topic1, err := e.newTopicN("inbox1", 1)
	if err != nil {
		return nil, err
	}
	defer e.dropTopic(topic1)
	if err := e.fillInboxTopic(ctx, topic1, n1, keys); err != nil {
		return nil, err
	}
	cs := []inboxContender{
		{name: "inbox c16", concurrency: 16},
		{name: "plain c16", concurrency: 16, plain: true},
		{name: "inbox c1", concurrency: 1},
		{name: "plain c1", concurrency: 1, plain: true},
		// Batch handling: up to 50 records of distinct keys per transaction.
		{name: "inbox c16 b50", concurrency: 16, batch: 50},
		{name: "plain c16 b50", concurrency: 16, plain: true, batch: 50},
		// Where the overhead is: the plain group writing the inbox's row
		// itself (INSERT ... ON CONFLICT DO NOTHING, skip on conflict).
		{name: "plain+row c16", concurrency: 16, plain: true, dedupe: true},
		// What reading committed costs: the inbox at 16 reading uncommitted.
		{name: "inbox c16 ru", concurrency: 16, uncommitted: true},
		// Key-parallel speed-up: one partition, 16 records in flight vs 1.
		{name: "inbox c16 1p", concurrency: 16, one: true},
		{name: "inbox c1 1p", concurrency: 1, one: true},
		{name: "plain c16 1p", concurrency: 16, plain: true, one: true},
		{name: "plain c1 1p", concurrency: 1, plain: true, one: true},
	}
	if re := e.p.contenders; re != nil {
		cs = slices.DeleteFunc(cs, func(c inboxContender) bool { return !re.MatchString(c.name) })
	}
	series, pgus := map[string][]float64{}, map[string][]float64{}
	for r := range rounds {
		// Alternate the order so neither side always runs first.
		order := slices.Clone(cs)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, c := range order {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			for _, q := range []string{"TRUNCATE " + schema + ".invoices", "TRUNCATE " + ident(sqlname.Inbox(inboxTable))} {
				if _, err := e.pool.Exec(ctx, q); err != nil {
					return nil, err
				}
			}
			e.checkpoint(ctx)
			tp, cn := topic, n
			if c.one {
				tp, cn = topic1, n1
			}
			run, err := e.inboxRound(ctx, c, tp, cn)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", c.name, err)
			}
			run.Round = r + 1
			series[c.name] = append(series[c.name], run.EPS)
			if run.PGUsPerRecord > 0 {
				pgus[c.name] = append(pgus[c.name], run.PGUsPerRecord)
			}
			res.Runs = append(res.Runs, run)
			cpu := ""
			if run.CPU != nil {
				cpu = fmt.Sprintf("; machine %.0f%% busy: bench process %.2f cores, PostgreSQL and the rest %.2f; PostgreSQL backends %.0f us/record",
					100*run.CPU.Busy, run.CPU.Bench, run.CPU.Postgres, run.PGUsPerRecord)
			}
			log.Printf("inbox round %d/%d  %-13s %8.0f records/s applied (%d records, one-row write each)%s", r+1, rounds, c.name, run.EPS, run.Applied, cpu)
		}
	}
	res.InboxEPS, res.PlainEPS = round1(median(series["inbox c16"])), round1(median(series["plain c16"]))
	res.InboxSerialEPS, res.PlainSerialEPS = round1(median(series["inbox c1"])), round1(median(series["plain c1"]))
	res.OverheadRatio = medianRatio(series["inbox c16"], series["plain c16"])
	res.OverheadRatioSerial = medianRatio(series["inbox c1"], series["plain c1"])
	res.KeyParallelSpeedup6 = medianRatio(series["inbox c16"], series["inbox c1"])
	res.PlainKeyParallelSpeedup6 = medianRatio(series["plain c16"], series["plain c1"])
	res.Inbox1EPS, res.InboxSerial1EPS = round1(median(series["inbox c16 1p"])), round1(median(series["inbox c1 1p"]))
	res.Plain1EPS, res.PlainSerial1EPS = round1(median(series["plain c16 1p"])), round1(median(series["plain c1 1p"]))
	res.KeyParallelSpeedup = medianRatio(series["inbox c16 1p"], series["inbox c1 1p"])
	res.PlainKeyParallelSpeedup = medianRatio(series["plain c16 1p"], series["plain c1 1p"])
	for name, us := range pgus {
		if res.PGUsPerRecord == nil {
			res.PGUsPerRecord = map[string]float64{}
		}
		res.PGUsPerRecord[name] = round1(median(us))
	}
	res.InboxBatchEPS, res.PlainBatchEPS = round1(median(series["inbox c16 b50"])), round1(median(series["plain c16 b50"]))
	res.OverheadRatioBatch = medianRatio(series["inbox c16 b50"], series["plain c16 b50"])
	res.InboxBatchVsPlain = medianRatio(series["inbox c16 b50"], series["plain c16"])
	res.HandDedupeEPS = round1(median(series["plain+row c16"]))
	res.InboxVsHandDedupe = medianRatio(series["inbox c16"], series["plain+row c16"])
	res.ReadUncommittedEPS = round1(median(series["inbox c16 ru"]))
	res.CommittedVsUncommitted = medianRatio(series["inbox c16"], series["inbox c16 ru"])

	if _, err := e.pool.Exec(ctx, "TRUNCATE "+schema+".invoices, "+ident(sqlname.Inbox(inboxTable))); err != nil {
		return nil, err
	}
	if err := e.inboxLatency(ctx, res, partitions, keys); err != nil {
		return nil, fmt.Errorf("latency: %w", err)
	}
	res.Note = fmt.Sprintf("A topic of %d partitions is filled with %d events over %d keys (x-event-id set, as the relay sends them); "+
		"each contender is a new consumer group reading it from the start and, per record, one transaction with a one-row INSERT, "+
		"the offset marked after the commit (sarama auto-commit, 1 s). inbox cN: package inbox, Concurrency N (records of one key in order, "+
		"different keys in parallel), plus its inbox row (dedupe), sent with BEGIN in one round trip. plain cN: the same sarama consumer group and write without dedupe, N workers "+
		"per partition dispatched as the inbox does (an idle worker takes the next record whose key has nothing in progress), offsets marked up to the lowest record not yet committed; "+
		"plain+row c16 also inserts the inbox's row itself, in a round trip of its own. "+
		"inbox c16 ru: the inbox at 16 reading uncommitted (every contender else reads committed, the inbox's default). "+
		"inbox c16 b50 / plain c16 b50: the same with BatchSize 50 (a worker applies the records ready at that moment, up to 50 of distinct keys, in one transaction; the inbox's rows in one INSERT sent with BEGIN, "+
		"the plain group's a statement per record). The key-parallel speed-up (c16 vs c1) is measured on a second topic of one partition "+
		"(%d events, the same keys), where c1 is partition-serial. Rate: records from the first processed "+
		"to the last committed, medians of %d round(s), contenders alternated. Latency: %d writers commit one event each at %d/s for %.0f s "+
		"(unitofwork.Do, relay woken after commit), the inbox applies it (one-row INSERT); from the writer's commit to the end of the inbox's "+
		"process span (after its commit).", partitions, n, keys, n1, rounds, e.p.LatWriters, res.LatencyRate, e.p.LatDurationS)
	return res, nil
}

// fillInboxTopic publishes n events over keys keys, with the headers the
// relay sets (x-event-id a UUIDv7, as outbox.Event gets by default).
func (e *env) fillInboxTopic(ctx context.Context, topic string, n, keys int) error {
	sp, err := relay.NewSaramaPublisher(e.brokers, producerConfig("fxbench-inbox-fill"))
	if err != nil {
		return err
	}
	defer sp.Close()
	for i := 0; i < n; i += 1000 {
		batch := make([]relay.Message, 0, 1000)
		for j := i; j < min(n, i+1000); j++ {
			id := uuid.Must(uuid.NewV7()) // as the unit of work gives events
			key := orderID(j % keys)
			batch = append(batch, relay.Message{
				EventID: id, Topic: topic, Key: []byte(key), Value: payload(j%keys, j),
				Headers: []relay.Header{{Key: outbox.HeaderEventID, Value: []byte(id.String())}, {Key: outbox.HeaderEventType, Value: []byte(eventType)}},
			})
		}
		if err := sp.Publish(ctx, batch); err != nil {
			return fmt.Errorf("fill %s: %w", topic, err)
		}
	}
	got, err := e.topicCount(topic)
	if err != nil {
		return err
	}
	if got != int64(n) {
		return fmt.Errorf("fill %s: %d records, want %d", topic, got, n)
	}
	return nil
}

const invoiceInsert = `INSERT INTO ` + schema + `.invoices (order_id, event_id, amount) VALUES ($1, $2, $3)`

// inboxRound runs one contender over the whole topic and returns its rate
// and CPU use.
func (e *env) inboxRound(ctx context.Context, c inboxContender, topic string, n int) (InboxRun, error) {
	run := InboxRun{Contender: c.name, Applied: n}
	var (
		first    atomic.Int64 // unix nanos of the first record processed
		applied  atomic.Int64
		lastDone atomic.Int64
	)
	note := func() {
		first.CompareAndSwap(0, time.Now().UnixNano())
	}
	done := func() {
		if applied.Add(1) == int64(n) {
			lastDone.Store(time.Now().UnixNano())
		}
	}
	group := fmt.Sprintf("fxbench-%s-%d", c.name[:5], time.Now().UnixNano())
	var stop func() error
	if c.plain {
		pg, err := newPlainGroup(e, group, topic, c.concurrency, max(1, c.batch), c.dedupe, note, done)
		if err != nil {
			return run, err
		}
		stop = pg.stop
	} else {
		uow, err := unitofwork.New(e.pool, &unitofwork.Config{Table: e.table})
		if err != nil {
			return run, err
		}
		sc := inbox.DefaultSaramaConfig() // reads committed
		if c.uncommitted {
			sc.Consumer.IsolationLevel = sarama.ReadUncommitted
		}
		ic, err := inbox.New(e.pool, uow, &inbox.Config{
			Sarama: sc, Group: group, Brokers: e.brokers, Table: outbox.Table{Schema: schema}, Concurrency: c.concurrency, BatchSize: c.batch,
			CleanupInterval: time.Hour,
			Routes: []inbox.Route{{Topic: topic, Handler: func(ctx context.Context, tx unitofwork.Tx, m *inbox.Message) error {
				note()
				if _, err := tx.Exec(ctx, invoiceInsert, string(m.Key), m.ID, m.Offset); err != nil {
					return err
				}
				// Counted when the handler returns; the commit follows, and the
				// rate is taken once the table holds every row (below).
				done()
				return nil
			}}},
		})
		if err != nil {
			return run, err
		}
		if err := ic.Start(ctx); err != nil {
			return run, err
		}
		stop = func() error {
			sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			return ic.Stop(sctx)
		}
	}
	defer func() {
		if err := stop(); err != nil {
			log.Printf("stop %s: %v", c.name, err)
		}
	}()
	deadline := time.Now().Add(10 * time.Minute)
	var (
		cpu0    cpuSample
		pg0     pgCPU
		sampled bool
	)
	for applied.Load() < int64(n) {
		if !sampled && first.Load() != 0 {
			cpu0, pg0, sampled = sampleCPU(), e.pgBackendCPU(ctx), true
		}
		if time.Now().After(deadline) {
			return run, fmt.Errorf("%d of %d records applied within 10 minutes", applied.Load(), n)
		}
		if err := ctx.Err(); err != nil {
			return run, err
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Every row committed (the inbox counts before its commit).
	for {
		var rows int64
		if err := e.pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".invoices").Scan(&rows); err != nil {
			return run, err
		}
		if rows == int64(n) {
			break
		}
		if rows > int64(n) {
			return run, fmt.Errorf("%d invoice rows for %d records", rows, n)
		}
		if time.Now().After(deadline) {
			return run, fmt.Errorf("%d of %d rows committed within 10 minutes", rows, n)
		}
		time.Sleep(time.Millisecond)
	}
	end := time.Now().UnixNano()
	if c.plain {
		end = lastDone.Load() // counted after its commit
	}
	if sampled {
		run.CPU = cpu0.until(sampleCPU())
		if s := pg0.until(e.pgBackendCPU(ctx)); s >= 0 {
			run.PGUsPerRecord = round1(s / float64(n) * 1e6)
		}
	}
	run.EPS = round1(float64(n-1) / (float64(end-first.Load()) / 1e9))
	return run, nil
}

// plainGroup is a sarama consumer group that writes each record in a
// transaction of its own, without dedupe: per partition, workers chosen by
// key hash apply records (one key's records in order), and the partition's
// offset is marked up to the lowest record not yet committed.
type plainGroup struct {
	e       *env
	workers int
	batch   int    // records per transaction at most
	dedupe  string // the inbox's row insert, or ""
	name    string // the consumer name in it
	note    func()
	done    func()
	group   sarama.ConsumerGroup
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

func newPlainGroup(e *env, group, topic string, workers, batch int, dedupe bool, note, done func()) (*plainGroup, error) {
	sc := inbox.DefaultSaramaConfig() // the inbox's settings: oldest, auto-commit 1 s
	sc.ClientID = "fxbench-plain"
	g, err := sarama.NewConsumerGroup(e.brokers, group, sc)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	pg := &plainGroup{e: e, workers: workers, batch: batch, note: note, done: done, group: g, cancel: cancel, name: group}
	if dedupe {
		pg.dedupe = `INSERT INTO ` + ident(sqlname.Inbox(outbox.Table{Schema: schema})) +
			` (consumer, event_id, topic, "partition", "offset") VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING`
	}
	pg.wg.Add(2)
	go func() {
		defer pg.wg.Done()
		for ctx.Err() == nil {
			if err := g.Consume(ctx, []string{topic}, pg); err != nil && ctx.Err() == nil {
				log.Printf("plain consumer group: %v", err)
				time.Sleep(100 * time.Millisecond)
			}
		}
	}()
	go func() {
		defer pg.wg.Done()
		for err := range g.Errors() {
			if ctx.Err() == nil {
				log.Printf("plain consumer group: %v", err)
			}
		}
	}()
	return pg, nil
}

func (pg *plainGroup) stop() error {
	pg.cancel()
	err := pg.group.Close()
	pg.wg.Wait()
	return err
}

func (pg *plainGroup) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (pg *plainGroup) Cleanup(sarama.ConsumerGroupSession) error { return nil }

// ConsumeClaim dispatches as package inbox does, so that the two differ
// only by the inbox's own work: an idle worker takes the next record whose
// key has nothing earlier in progress or waiting (one key's records in
// order, distinct keys in parallel whatever they hash to), at most
// workers x 64 records read ahead of the lowest one not yet committed.
func (pg *plainGroup) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	ctx := sess.Context()
	type rec struct {
		m    *sarama.ConsumerMessage
		done bool
	}
	limit := pg.workers * 64
	var (
		mu     sync.Mutex
		window []*rec                // in offset order, not yet marked
		keys   = map[string][]*rec{} // keys in progress: their records waiting
		failed error
		ready  = make(chan *rec, limit) // never more than the window
		space  = make(chan struct{}, 1)
		stop   = make(chan struct{})
	)
	finish := func(r *rec) {
		mu.Lock()
		r.done = true
		i := 0
		for ; i < len(window) && window[i].done; i++ {
		}
		if i > 0 {
			sess.MarkMessage(window[i-1].m, "")
			window = window[i:]
		}
		var next *rec
		k := string(r.m.Key)
		if q := keys[k]; len(q) > 0 {
			next, keys[k] = q[0], q[1:]
		} else {
			delete(keys, k)
		}
		mu.Unlock()
		select {
		case space <- struct{}{}:
		default:
		}
		if next != nil {
			ready <- next
		}
	}
	var wg sync.WaitGroup
	for range pg.workers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				case r := <-ready:
					pg.note()
					// As inbox.Config.BatchSize: the records ready now, up to batch.
					rs := []*rec{r}
				more:
					for len(rs) < pg.batch {
						select {
						case next := <-ready:
							rs = append(rs, next)
						default:
							break more
						}
					}
					ms := make([]*sarama.ConsumerMessage, len(rs))
					for i, r := range rs {
						ms[i] = r.m
					}
					if err := pg.apply(ctx, ms); err != nil {
						mu.Lock()
						failed = err
						mu.Unlock()
						continue // not marked: left to the next owner
					}
					for _, r := range rs {
						pg.done()
						finish(r)
					}
				}
			}
		})
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()
	for {
		select {
		case m, ok := <-claim.Messages():
			if !ok {
				return nil
			}
			r := &rec{m: m}
			for {
				mu.Lock()
				if err := failed; err != nil && ctx.Err() == nil {
					mu.Unlock()
					return err
				}
				if len(window) < limit {
					break
				}
				mu.Unlock()
				select {
				case <-space:
				case <-ctx.Done():
					return nil
				}
			}
			window = append(window, r)
			k := string(m.Key)
			q, busy := keys[k]
			if busy {
				keys[k] = append(q, r)
			} else {
				keys[k] = nil
			}
			mu.Unlock()
			if !busy {
				ready <- r
			}
		case <-ctx.Done():
			return nil
		}
	}
}

// apply writes ms in one transaction, a statement per record.
func (pg *plainGroup) apply(ctx context.Context, ms []*sarama.ConsumerMessage) error {
	tx, err := pg.e.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for _, m := range ms {
		var id string
		for _, h := range m.Headers {
			if string(h.Key) == outbox.HeaderEventID {
				id = string(h.Value)
			}
		}
		if pg.dedupe != "" {
			tag, err := tx.Exec(ctx, pg.dedupe, pg.name, id, m.Topic, m.Partition, m.Offset)
			if err != nil {
				return err
			}
			if tag.RowsAffected() == 0 {
				return errors.New("plain+row: a duplicate in a fresh group")
			}
		}
		if _, err := tx.Exec(ctx, invoiceInsert, string(m.Key), id, m.Offset); err != nil {
			return err
		}
	}
	return tx.Commit(ctx)
}

// appliedRecorder records when each record's process span ends (after the
// inbox's commit), by event id.
type appliedRecorder struct {
	mu sync.Mutex
	at map[string]time.Time
}

func (a *appliedRecorder) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (a *appliedRecorder) OnEnd(s sdktrace.ReadOnlySpan) {
	if s.SpanKind().String() != "consumer" {
		return
	}
	var id, outcome string
	for _, kv := range s.Attributes() {
		switch kv.Key {
		case semconv.MessagingMessageIDKey:
			id = kv.Value.AsString()
		case attribute.Key("outbox.inbox.outcome"):
			outcome = kv.Value.AsString()
		}
	}
	if id == "" || outcome != inbox.OutcomeApplied {
		return
	}
	a.mu.Lock()
	if _, ok := a.at[id]; !ok {
		a.at[id] = s.EndTime()
	}
	a.mu.Unlock()
}
func (a *appliedRecorder) Shutdown(context.Context) error   { return nil }
func (a *appliedRecorder) ForceFlush(context.Context) error { return nil }

func (a *appliedRecorder) get(id string) (time.Time, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t, ok := a.at[id]
	return t, ok
}

// inboxLatency measures commit-to-applied through the whole chain: writer
// (unitofwork.Do) -> relay (woken after commit) -> Kafka -> inbox handler's
// commit, at 1k events/s.
func (e *env) inboxLatency(ctx context.Context, res *Inbox, partitions, keys int) error {
	const rate = 1000
	res.LatencyRate = rate
	topic, err := e.newTopicN("inboxlat", partitions)
	if err != nil {
		return err
	}
	defer e.dropTopic(topic)
	if _, err := e.pool.Exec(ctx, "TRUNCATE "+ident(e.table)+" RESTART IDENTITY"); err != nil {
		return err
	}
	sp, err := relay.NewSaramaPublisher(e.brokers, producerConfig("fxbench-inbox-relay"))
	if err != nil {
		return err
	}
	defer sp.Close()
	r, err := relay.New(e.pool, sp, &relay.Config{Table: e.table})
	if err != nil {
		return err
	}
	uow, err := unitofwork.New(e.pool, &unitofwork.Config{Table: e.table, OnCommit: func(int) { r.Wake() }})
	if err != nil {
		return err
	}
	if err := r.Start(ctx); err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = r.Stop(sctx)
	}()
	rec := &appliedRecorder{at: map[string]time.Time{}}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	ic, err := inbox.New(e.pool, nil, &inbox.Config{
		Group: fmt.Sprintf("fxbench-inboxlat-%d", time.Now().UnixNano()), Brokers: e.brokers,
		Table: outbox.Table{Schema: schema}, CleanupInterval: time.Hour, TracerProvider: tp,
		Routes: []inbox.Route{{Topic: topic, Handler: func(ctx context.Context, tx unitofwork.Tx, m *inbox.Message) error {
			_, err := tx.Exec(ctx, invoiceInsert, string(m.Key), m.ID, m.Offset)
			return err
		}}},
	})
	if err != nil {
		return err
	}
	if err := ic.Start(ctx); err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = ic.Stop(sctx)
	}()
	write := func(ctx context.Context, id uuid.UUID, key, seq int) error {
		return uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
			return tx.Add(ctx, outbox.Event{ID: id, AggregateType: aggregateType, AggregateID: orderID(key), Type: eventType,
				Topic: topic, Payload: json.RawMessage(payload(key, seq))})
		})
	}
	// Warm up: the group has joined and the chain runs end to end.
	warm := uuid.New()
	if err := write(ctx, warm, 0, 0); err != nil {
		return err
	}
	for deadline := time.Now().Add(60 * time.Second); ; {
		if _, ok := rec.get(warm.String()); ok {
			break
		}
		if time.Now().After(deadline) {
			return errors.New("the warm-up event was not applied within 60s")
		}
		time.Sleep(10 * time.Millisecond)
	}

	total := int(float64(rate) * e.p.latDuration().Seconds())
	tokens := make(chan int, total)
	type commit struct {
		id string
		at time.Time
	}
	commits := make([][]commit, e.p.LatWriters)
	var werr atomic.Value
	var wg sync.WaitGroup
	for w := range e.p.LatWriters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := range tokens {
				id, _ := uuid.NewV7()
				if err := write(ctx, id, randKey(keys), seq); err != nil {
					werr.CompareAndSwap(nil, err)
					continue
				}
				commits[w] = append(commits[w], commit{id.String(), time.Now()})
			}
		}()
	}
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
	elapsed := time.Since(t0)
	if err, _ := werr.Load().(error); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	var all []commit
	for _, cs := range commits {
		all = append(all, cs...)
	}
	deadline := time.Now().Add(graceFor(e.p) + 5*time.Second)
	var lats []time.Duration
	for {
		lats, res.LatencyMissing = lats[:0], 0
		for _, c := range all {
			a, ok := rec.get(c.id)
			if !ok {
				res.LatencyMissing++
				continue
			}
			lats = append(lats, max(0, a.Sub(c.at)))
		}
		if res.LatencyMissing == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	slices.Sort(lats)
	res.LatencyAchieved = round1(float64(len(all)) / elapsed.Seconds())
	res.LatencyP50, res.LatencyP99, res.LatencyP999 = percentileMS(lats, 0.5), percentileMS(lats, 0.99), percentileMS(lats, 0.999)
	log.Printf("inbox latency @%d/s (achieved %.0f/s): commit-to-applied p50 %.1f ms, p99 %.1f ms, p99.9 %.1f ms (n=%d, missing %d)",
		rate, res.LatencyAchieved, res.LatencyP50, res.LatencyP99, res.LatencyP999, len(lats), res.LatencyMissing)
	return nil
}

func inboxTargets(x *Inbox) []Target {
	if x == nil || x.InboxEPS == 0 {
		return nil
	}
	ts := []Target{{Name: "inbox: overhead ratio (c16)", Goal: ">= 85% of a plain consumer group's rate", Value: x.OverheadRatio, Unit: "fraction", Met: x.OverheadRatio >= 0.85}}
	ts = append(ts, Target{Name: "inbox: key-parallel speed-up", Goal: ">= 3x partition-serial (Concurrency 16 vs 1, one partition)", Value: x.KeyParallelSpeedup, Unit: "x", Met: x.KeyParallelSpeedup >= 3})
	for i := range ts {
		want := 0.85
		if i == 1 {
			want = 3
		}
		if !ts[i].Met && ts[i].Value > 0 {
			ts[i].Gap = fmt.Sprintf("%.0f%% short (%.3g of %.3g)", 100*(1-ts[i].Value/want), ts[i].Value, want)
		}
	}
	return append(ts, Target{Name: "inbox: commit-to-applied p99 at 1k/s", Goal: "reported (no target)", Value: x.LatencyP99, Unit: "ms", Met: true})
}

func printInbox(w io.Writer, x *Inbox, line string) {
	if x == nil {
		return
	}
	fmt.Fprintf(w, "%s\n5. INBOX  %d events, %d keys, %d partitions, one-row write per record; records/s applied, median of %d round(s)\n",
		line, x.Events, x.Keys, x.Partitions, x.Rounds)
	fmt.Fprintf(w, "   16 in flight per partition: inbox %.0f, plain consumer group %.0f -> inbox keeps %.0f%%\n", x.InboxEPS, x.PlainEPS, 100*x.OverheadRatio)
	fmt.Fprintf(w, "   partition-serial:           inbox %.0f, plain consumer group %.0f -> inbox keeps %.0f%%\n", x.InboxSerialEPS, x.PlainSerialEPS, 100*x.OverheadRatioSerial)
	fmt.Fprintf(w, "   key-parallel speed-up, one partition (inbox Concurrency 16 vs 1): %.0f vs %.0f -> %.2fx (the plain group's: %.0f vs %.0f -> %.2fx)\n",
		x.Inbox1EPS, x.InboxSerial1EPS, x.KeyParallelSpeedup, x.Plain1EPS, x.PlainSerial1EPS, x.PlainKeyParallelSpeedup)
	fmt.Fprintf(w, "   the same on six partitions: inbox %.2fx, plain %.2fx\n", x.KeyParallelSpeedup6, x.PlainKeyParallelSpeedup6)
	fmt.Fprintf(w, "   BatchSize 50 (c16): inbox %.0f, plain group batching alike %.0f -> inbox keeps %.0f%%; inbox batched vs plain per record %.2fx\n",
		x.InboxBatchEPS, x.PlainBatchEPS, 100*x.OverheadRatioBatch, x.InboxBatchVsPlain)
	fmt.Fprintf(w, "   plain group writing the inbox row itself (c16): %.0f -> inbox at %.0f%% of hand-written dedupe\n", x.HandDedupeEPS, 100*x.InboxVsHandDedupe)
	if x.ReadUncommittedEPS > 0 {
		fmt.Fprintf(w, "   reading committed (the default) vs uncommitted (c16): %.0f vs %.0f -> %.2fx\n", x.InboxEPS, x.ReadUncommittedEPS, x.CommittedVsUncommitted)
	}
	if pg := x.PGUsPerRecord; pg != nil {
		fmt.Fprintf(w, "   PostgreSQL backends' CPU per record (c16): inbox %.0f us, plain %.0f us, plain+row %.0f us; BatchSize 50: inbox %.0f us, plain %.0f us\n",
			pg["inbox c16"], pg["plain c16"], pg["plain+row c16"], pg["inbox c16 b50"], pg["plain c16 b50"])
	}
	fmt.Fprintf(w, "   writer commit -> relay -> Kafka -> inbox commit at %d/s (achieved %.0f/s): p50 %.1f ms, p99 %.1f ms, p99.9 %.1f ms, missing %d\n",
		x.LatencyRate, x.LatencyAchieved, x.LatencyP50, x.LatencyP99, x.LatencyP999, x.LatencyMissing)
}
