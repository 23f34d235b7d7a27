package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/fxoutbox/outbox/relay"
)

// drainRun is one contender's figure in one round.
type drainRun struct {
	Published int64   `json:"published"`
	ElapsedS  float64 `json:"elapsed_s"`
	EPS       float64 `json:"eps"`
	Capped    bool    `json:"capped,omitempty"` // measured over a fixed window, not to the end of the backlog
	CPU       *CPUUse `json:"cpu,omitempty"`
	// PGCPUS is the CPU time of the PostgreSQL backends serving the
	// contender's sessions (fxoutbox relays only; see pgBackendCPU), and
	// PGUsPerEvent the same per published event, in microseconds.
	PGCPUS       float64 `json:"pg_backend_cpu_s,omitempty"`
	PGUsPerEvent float64 `json:"pg_us_per_event,omitempty"`
	// EO counts an exactly-once contender's Kafka transactions and lane
	// take-overs, summed over its relays (nil for the others).
	EO *eoCounts `json:"exactly_once,omitempty"`
}

// eoCounts are exactly-once relays' counters over one drain: transactions
// by outcome (outbox.transactions) and fences (outbox.fences): lanes taken
// over by fencing their owner, and the times a relay found itself fenced.
type eoCounts struct {
	Committed int64 `json:"txn_committed"`
	Aborted   int64 `json:"txn_aborted"`
	Unknown   int64 `json:"txn_unknown"`
	Fencing   int64 `json:"lanes_taken_over"`
	Fenced    int64 `json:"fenced"`
}

// add reads the counters of a relay's meter provider into c.
func (c *eoCounts) add(rd sdkmetric.Reader) error {
	var rm metricdata.ResourceMetrics
	if err := rd.Collect(context.Background(), &rm); err != nil {
		return err
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			key, ok := map[string]attribute.Key{relay.MetricTransactions: relay.AttrTxnOutcome, relay.MetricFences: relay.AttrFenceSide}[m.Name]
			d, sum := m.Data.(metricdata.Sum[int64])
			if !ok || !sum {
				continue
			}
			for _, p := range d.DataPoints {
				v, _ := p.Attributes.Value(key)
				switch v.AsString() {
				case "committed":
					c.Committed += p.Value
				case "aborted":
					c.Aborted += p.Value
				case "unknown":
					c.Unknown += p.Value
				case "fencing":
					c.Fencing += p.Value
				case "fenced":
					c.Fenced += p.Value
				}
			}
		}
	}
	return nil
}

func (c *eoCounts) String() string {
	return fmt.Sprintf("  transactions %d committed, %d aborted, %d unknown; %d lanes taken over, fenced %d times",
		c.Committed, c.Aborted, c.Unknown, c.Fencing, c.Fenced)
}

// DrainContender is one contender over every round.
type DrainContender struct {
	Name   string     `json:"name"`
	Desc   string     `json:"desc"`
	Rounds []drainRun `json:"rounds"`
	EPS    float64    `json:"median_eps"`
	// PGUsPerEvent is the median of the rounds' PostgreSQL backend CPU per
	// event (fxoutbox relays only).
	PGUsPerEvent float64 `json:"median_pg_us_per_event,omitempty"`
	Kind         string  `json:"kind"` // contender, limit or diagnostic
}

func (c *DrainContender) series() []float64 {
	out := make([]float64, len(c.Rounds))
	for i, r := range c.Rounds {
		out[i] = r.EPS
	}
	return out
}

func (c *DrainContender) pgSeries() []float64 {
	var out []float64
	for _, r := range c.Rounds {
		if r.PGUsPerEvent > 0 {
			out = append(out, r.PGUsPerEvent)
		}
	}
	return out
}

// Drain holds section 1 of the report.
type Drain struct {
	FxoutboxEPS          float64 `json:"fxoutbox_eps"`      // default config (relay.New(db, pub, nil)), 1 relay
	FxoutboxBestEPS      float64 `json:"fxoutbox_best_eps"` // best of the batch-500 configs
	FxoutboxBestConfig   string  `json:"fxoutbox_best_config"`
	FxoutboxB500x1EPS    float64 `json:"fxoutbox_b500_x1_eps"`
	FxoutboxB500x2EPS    float64 `json:"fxoutbox_b500_x2_eps"`
	FxoutboxB500x4EPS    float64 `json:"fxoutbox_b500_x4_eps"`
	SeedEPS              float64 `json:"seed_eps"`
	WatermillEPS         float64 `json:"watermill_eps"` // best of its two batch sizes
	WatermillBestConfig  string  `json:"watermill_best_config"`
	WatermillDefaultEPS  float64 `json:"watermill_default_eps"` // SubscribeBatchSize default (100)
	WatermillB1000EPS    float64 `json:"watermill_b1000_eps"`
	FxoutboxVsSeed       float64 `json:"fxoutbox_vs_seed"`
	FxoutboxVsWatermill  float64 `json:"fxoutbox_vs_watermill"`
	FxoutboxOfPostgres   float64 `json:"fxoutbox_of_postgres"`
	FxoutboxB500OfPG     float64 `json:"fxoutbox_b500_x1_of_postgres"`
	FxoutboxX4OfPostgres float64 `json:"fxoutbox_b500_x4_of_postgres"`
	BestVsSeed           float64 `json:"fxoutbox_best_vs_seed"`
	BestVsWatermill      float64 `json:"fxoutbox_best_vs_watermill"`
	FxoutboxOfProducer   float64 `json:"fxoutbox_of_producer"`
	BestOfProducer       float64 `json:"fxoutbox_best_of_producer"`
	Note                 string  `json:"note"`

	// The replica series: BatchSize 500, 1 to 4 relays on one table, in
	// the benchmark's process (each with its own producer) and in separate
	// processes (each with its own pool and producer). PG is the CPU time of
	// the relays' PostgreSQL backends per published event (microseconds);
	// the ratios are medians of the rounds' ratios (the contenders alternate
	// in each round).
	Replicas1EPS        float64 `json:"replicas1_eps"`
	Replicas2EPS        float64 `json:"replicas2_eps"`
	Replicas3EPS        float64 `json:"replicas3_eps"`
	Replicas4EPS        float64 `json:"replicas4_eps"`
	Replicas1ProcEPS    float64 `json:"replicas1_proc_eps"`
	Replicas2ProcsEPS   float64 `json:"replicas2_procs_eps"`
	Replicas4ProcsEPS   float64 `json:"replicas4_procs_eps"`
	Replicas1PGUs       float64 `json:"replicas1_pg_us_per_event"`
	Replicas2PGUs       float64 `json:"replicas2_pg_us_per_event"`
	Replicas3PGUs       float64 `json:"replicas3_pg_us_per_event"`
	Replicas4PGUs       float64 `json:"replicas4_pg_us_per_event"`
	Replicas1ProcPGUs   float64 `json:"replicas1_proc_pg_us_per_event"`
	Replicas2ProcsPGUs  float64 `json:"replicas2_procs_pg_us_per_event"`
	Replicas4ProcsPGUs  float64 `json:"replicas4_procs_pg_us_per_event"`
	Replicas2Vs1        float64 `json:"replicas2_vs_1"`
	Replicas3Vs1        float64 `json:"replicas3_vs_1"`
	Replicas4Vs1        float64 `json:"replicas4_vs_1"`
	Replicas2ProcsVs1   float64 `json:"replicas2_procs_vs_1"`
	Replicas4ProcsVs1   float64 `json:"replicas4_procs_vs_1"`
	Replicas4PGVs1      float64 `json:"replicas4_pg_cpu_vs_1"`
	Replicas4ProcsPGVs1 float64 `json:"replicas4_procs_pg_cpu_vs_1"`

	// Cursor progress (relay.ProgressCursor) against marks: 1 relay,
	// defaults otherwise, the same backlog, events/s (median of the
	// rounds' ratios) and PostgreSQL CPU per event.
	CursorEPS     float64 `json:"cursor_eps"`
	CursorVsMarks float64 `json:"cursor_vs_marks"`
	// EOVsALO: exactly-once's drain against at-least-once's (1 relay,
	// defaults; median of the rounds' ratios); EO2VsALO2 the same with 2
	// relays and BatchSize 500 (the eos.* figures of issue 32: on Apache
	// Kafka when KAFKA_BROKERS is set).
	EOVsALO   float64 `json:"eo_vs_alo,omitempty"`
	EO2VsALO2 float64 `json:"eo_vs_alo_2relays,omitempty"`
	// StreamEOVsALO: the streaming relay's drain of a backlog it decodes,
	// exactly-once against at-least-once (1 relay, defaults; median of the
	// rounds' ratios): issue 32's eos.stream_drain_vs_alo.
	StreamEOVsALO float64 `json:"stream_eo_vs_alo,omitempty"`
	CursorPGUs    float64 `json:"cursor_pg_us_per_event"`
	MarksPGUs     float64 `json:"marks_pg_us_per_event"`

	Contenders []*DrainContender `json:"contenders"`
}

// Limits holds section 4.
type Limits struct {
	ProducerEPS        float64 `json:"producer_eps"`                // sarama AsyncProducer alone, streaming
	PublisherB500EPS   float64 `json:"publisher_b500_eps"`          // relay.SaramaPublisher alone, batches of 500
	PostgresEPS        float64 `json:"postgres_eps"`                // claim+mark, batch 500, 1 worker, no publishing, asynchronous commit
	PostgresSyncEPS    float64 `json:"postgres_sync_eps"`           // the same with synchronous commit
	PostgresX4EPS      float64 `json:"postgres_x4_eps"`             // same with 4 workers
	PostgresB50EPS     float64 `json:"postgres_b50_eps"`            // same at the default batch 50
	RelayNoPublishEPS  float64 `json:"relay_nopublish_eps"`         // relay.New with a no-op publisher, batch 500
	RelayNoPubDefault  float64 `json:"relay_nopublish_default_eps"` // the same with every default (batch 50, lanes)
	UnorderedB50EPS    float64 `json:"fxoutbox_unordered_b50_eps"`  // default batch, no lanes, publishing
	RelayOfProducer    float64 `json:"relay_of_producer"`           // fxoutbox default / producer
	RelayOfPostgres    float64 `json:"relay_of_postgres"`           // fxoutbox default / postgres
	BestRelayOfProd    float64 `json:"best_relay_of_producer"`
	BestRelayOfPG      float64 `json:"best_relay_of_postgres"`
	B500x1OfPostgres   float64 `json:"b500_x1_of_postgres"`
	B500x4OfPostgres   float64 `json:"b500_x4_of_postgres"`
	B500x4OfPostgresX4 float64 `json:"b500_x4_of_postgres_x4"`
}

type contender struct {
	name, desc, kind string
	// prepare loads the backlog (untimed); run drains it and returns the figure.
	prepare func(ctx context.Context, topic string) error
	run     func(ctx context.Context, topic string) (drainRun, error)
	// noTopic: the contender publishes nothing (PostgreSQL ceilings).
	noTopic bool
	skip    bool
}

func runDrain(ctx context.Context, e *env) (*Drain, *Limits, error) {
	p := e.p
	n := p.Backlog
	warm, err := e.newTopic("warmup")
	if err != nil {
		return nil, nil, err
	}
	prepFx := func(ctx context.Context, topic string) error { return e.preloadOutbox(ctx, topic, n) }
	// The cursor relay's table: its positions start afresh at the backlog.
	prepCursor := func(ctx context.Context, topic string) error { return e.preloadInto(ctx, e.ctable, topic, n) }
	fx := func(cfg *relay.Config, replicas int) func(context.Context, string) (drainRun, error) {
		return func(ctx context.Context, topic string) (drainRun, error) {
			return e.drainFx(ctx, topic, warm, n, cfg, replicas, false)
		}
	}
	b500 := &relay.Config{BatchSize: 500}
	procs := func(k int) func(context.Context, string) (drainRun, error) {
		return func(ctx context.Context, _ string) (drainRun, error) { return e.drainProcs(ctx, warm, n, 500, k) }
	}
	wmPrep := func(ctx context.Context, topic string) error { return e.preloadWatermill(ctx, topic, n) }
	wm := func(batch int) func(context.Context, string) (drainRun, error) {
		return func(ctx context.Context, topic string) (drainRun, error) {
			return e.drainWatermill(ctx, topic, warm, n, batch)
		}
	}
	cs := []*contender{
		{name: "fxoutbox default", desc: "relay.New with every default (only Table set: batches of 50 growing to 500 while full, per-key lanes, asynchronous commit), 1 relay", kind: "contender", prepare: prepFx, run: fx(nil, 1)},
		{name: "fxoutbox cursor default", desc: "every default but Progress ProgressCursor (the lanes' positions saved once per batch, no mark per event; on a table with the cursor migration), 1 relay", kind: "contender", prepare: prepCursor,
			run: fx(&relay.Config{Progress: relay.ProgressCursor}, 1)},
		{name: "fxoutbox b500 x1", desc: "BatchSize 500, 1 relay", kind: "contender", prepare: prepFx, run: fx(b500, 1)},
		{name: "fxoutbox exactly-once default", desc: "every default but Delivery ExactlyOnce (each batch one Kafka transaction with its lanes' progress records, synchronous commit), 1 relay", kind: "contender", prepare: prepFx,
			run: fx(&relay.Config{Delivery: relay.ExactlyOnce}, 1)},
		{name: "fxoutbox exactly-once mb500", desc: "every default but Delivery ExactlyOnce and MaxBatchSize 500 (at-least-once's default, exactly-once's before 6 December: more, smaller transactions), 1 relay", kind: "contender", prepare: prepFx,
			run: fx(&relay.Config{Delivery: relay.ExactlyOnce, MaxBatchSize: 500}, 1)},
		{name: "fxoutbox exactly-once b500 x1", desc: "BatchSize 500, Delivery ExactlyOnce, 1 relay", kind: "contender", prepare: prepFx,
			run: fx(&relay.Config{BatchSize: 500, Delivery: relay.ExactlyOnce}, 1)},
		{name: "fxoutbox exactly-once b500 x2", desc: "BatchSize 500, Delivery ExactlyOnce, 2 relays (own producers each)", kind: "contender", prepare: prepFx,
			run: fx(&relay.Config{BatchSize: 500, Delivery: relay.ExactlyOnce}, 2)},
		{name: "fxoutbox stream default", desc: "Mode Stream, Progress ProgressCursor, otherwise the defaults, 1 relay, restarted on its slot with a backlog written while it was down (after the slot's position, transactions of 500 events), until it confirmed the backlog's last transaction: at least once, a restart delivers it by polling from the lanes' positions, then streams", kind: "contender",
			run: func(ctx context.Context, topic string) (drainRun, error) {
				return e.drainStream(ctx, topic, warm, n, relay.AtLeastOnce)
			}},
		{name: "fxoutbox stream exactly-once", desc: "as stream default, with Delivery ExactlyOnce: the restart resumes from the stream's record and decodes the backlog from the slot (each batch one Kafka transaction with the stream's record; the slot confirmed after the commit)", kind: "contender",
			run: func(ctx context.Context, topic string) (drainRun, error) {
				return e.drainStream(ctx, topic, warm, n, relay.ExactlyOnce)
			}},
		{name: "fxoutbox b500 x2", desc: "BatchSize 500, 2 relays (own producer each)", kind: "contender", prepare: prepFx, run: fx(b500, 2)},
		{name: "fxoutbox b500 x3", desc: "BatchSize 500, 3 relays (own producer each)", kind: "contender", prepare: prepFx, run: fx(b500, 3)},
		{name: "fxoutbox b500 x4", desc: "BatchSize 500, 4 relays (own producer each)", kind: "contender", prepare: prepFx, run: fx(b500, 4)},
		{name: "fxoutbox b500 x1 proc", desc: "BatchSize 500, 1 relay in a process of its own (own pool and producer)", kind: "contender", prepare: prepFx, run: procs(1)},
		{name: "fxoutbox b500 x2 procs", desc: "BatchSize 500, 2 relays in separate processes (own pool and producer each)", kind: "contender", prepare: prepFx, run: procs(2)},
		{name: "fxoutbox b500 x4 procs", desc: "BatchSize 500, 4 relays in separate processes (own pool and producer each)", kind: "contender", prepare: prepFx, run: procs(4)},
		{name: "fxoutbox unordered b500", desc: "BatchSize 500, Ordering Unordered (plain SKIP LOCKED claim), 1 relay", kind: "contender", prepare: prepFx,
			run: fx(&relay.Config{BatchSize: 500, Ordering: relay.Unordered}, 1)},
		{name: "seed relay", desc: "Go transcription of the seed's @Interval(500) take(50) relay, fixed window", kind: "contender",
			prepare: prepFx, run: func(ctx context.Context, topic string) (drainRun, error) { return e.drainSeed(ctx, topic, warm, n) }},
		{name: "watermill b100", desc: "watermill Forwarder, SQL subscriber default SubscribeBatchSize (100)", kind: "contender", prepare: wmPrep, run: wm(0)},
		{name: "watermill b1000", desc: "watermill Forwarder, SubscribeBatchSize 1000", kind: "contender", prepare: wmPrep, run: wm(1000)},
		{name: "postgres b500 x1", desc: "claim+mark by hand, no publishing: batch 500, 1 worker, asynchronous commit (as the relay commits by default)", kind: "limit", noTopic: true,
			prepare: prepFx, run: func(ctx context.Context, _ string) (drainRun, error) { return e.drainPostgres(ctx, n, 500, 1, false) }},
		{name: "postgres b500 x4", desc: "claim+mark by hand, no publishing: batch 500, 4 workers, asynchronous commit", kind: "limit", noTopic: true,
			prepare: prepFx, run: func(ctx context.Context, _ string) (drainRun, error) { return e.drainPostgres(ctx, n, 500, 4, false) }},
		{name: "postgres b500 x1 sync", desc: "claim+mark by hand, no publishing: batch 500, 1 worker, synchronous commit", kind: "diagnostic", noTopic: true,
			prepare: prepFx, run: func(ctx context.Context, _ string) (drainRun, error) { return e.drainPostgres(ctx, n, 500, 1, true) }},
		{name: "postgres b50 x1", desc: "claim+mark by hand, no publishing: batch 50, 1 worker, asynchronous commit", kind: "diagnostic", noTopic: true,
			prepare: prepFx, run: func(ctx context.Context, _ string) (drainRun, error) { return e.drainPostgres(ctx, n, 50, 1, false) }},
		{name: "relay no-publish b500", desc: "relay.New with a no-op Publisher, BatchSize 500: the library's loop without Kafka", kind: "diagnostic", noTopic: true,
			prepare: prepFx, run: func(ctx context.Context, topic string) (drainRun, error) {
				return e.drainFx(ctx, topic, warm, n, b500, 1, true)
			}},
		{name: "relay no-publish default", desc: "relay.New with a no-op Publisher and every default (batches of 50 growing to 500, per-key lanes): the library's loop without Kafka", kind: "diagnostic", noTopic: true,
			prepare: prepFx, run: func(ctx context.Context, topic string) (drainRun, error) {
				return e.drainFx(ctx, topic, warm, n, nil, 1, true)
			}},
		{name: "fxoutbox unordered b50", desc: "Ordering Unordered, otherwise the defaults (batches of 50 growing to 500), 1 relay: the default config without lanes", kind: "diagnostic", prepare: prepFx,
			run: fx(&relay.Config{Ordering: relay.Unordered}, 1)},
		{name: "producer", desc: "sarama AsyncProducer alone (same config), streaming the backlog", kind: "limit",
			run: func(ctx context.Context, topic string) (drainRun, error) { return e.drainProducer(ctx, topic, n) }},
		{name: "publisher b500", desc: "relay.SaramaPublisher alone, batches of 500 (the relay's publish step without PostgreSQL)", kind: "diagnostic",
			run: func(ctx context.Context, topic string) (drainRun, error) {
				return e.drainPublisher(ctx, topic, warm, n, 500)
			}},
	}
	if !p.Diagnostics {
		for _, c := range cs {
			c.skip = c.kind == "diagnostic"
		}
	}
	if !p.runs("drain") { // limits only
		for _, c := range cs {
			c.skip = c.skip || c.kind == "contender"
		}
	}
	if !p.runs("limits") {
		for _, c := range cs {
			c.skip = c.skip || c.kind != "contender"
		}
	}
	if re := e.p.contenders; re != nil { // BENCH_CONTENDERS: a subset, while tuning
		for _, c := range cs {
			c.skip = c.skip || !re.MatchString(c.name)
		}
	}
	results := map[string]*DrainContender{}
	var order []*DrainContender
	for _, c := range cs {
		if c.skip {
			continue
		}
		dc := &DrainContender{Name: c.name, Desc: c.desc, Kind: c.kind}
		results[c.name] = dc
		order = append(order, dc)
	}
	for r := range p.DrainRounds {
		for _, c := range cs {
			if c.skip {
				continue
			}
			if err := ctx.Err(); err != nil {
				return nil, nil, err
			}
			topic := "fxbench.not-published"
			if !c.noTopic {
				if topic, err = e.newTopic("drain"); err != nil {
					return nil, nil, err
				}
			}
			if c.prepare != nil {
				if err := c.prepare(ctx, topic); err != nil {
					return nil, nil, fmt.Errorf("%s: prepare: %w", c.name, err)
				}
			}
			e.checkpoint(ctx)
			cpu0 := sampleCPU()
			res, err := c.run(ctx, topic)
			if err != nil {
				return nil, nil, fmt.Errorf("%s (round %d): %w", c.name, r+1, err)
			}
			res.CPU = cpu0.until(sampleCPU())
			if !c.noTopic {
				// Every published event must be in the broker.
				got, err := e.topicCount(topic)
				if err != nil {
					return nil, nil, fmt.Errorf("%s: count topic: %w", c.name, err)
				}
				if got < res.Published {
					return nil, nil, fmt.Errorf("%s: the broker holds %d records, the contender reported %d published", c.name, got, res.Published)
				}
			}
			if !c.noTopic {
				e.dropTopic(topic)
			}
			dc := results[c.name]
			dc.Rounds = append(dc.Rounds, res)
			extra := ""
			if res.Capped {
				extra = " (fixed window)"
			}
			if res.EO != nil {
				extra += res.EO.String()
			}
			if u := res.CPU; u != nil {
				extra += fmt.Sprintf("  cpu: %.0f%% of %d cores busy; bench %.2f, jvm broker %.2f, postgres+rest %.2f cores", 100*u.Busy, u.Cores, u.Bench, u.Broker, u.Postgres)
			}
			log.Printf("drain round %d/%d  %-22s %9.0f events/s  (%d in %.2fs)%s", r+1, p.DrainRounds, c.name, res.EPS, res.Published, res.ElapsedS, extra)
		}
	}
	for _, dc := range order {
		dc.EPS = round1(median(dc.series()))
		if pg := dc.pgSeries(); len(pg) > 0 {
			dc.PGUsPerEvent = round2(median(pg))
		}
	}
	e.dropTopic(warm)

	get := func(name string) *DrainContender {
		if c := results[name]; c != nil {
			return c
		}
		return &DrainContender{}
	}
	d := &Drain{Contenders: order}
	fxd := get("fxoutbox default")
	d.FxoutboxEPS = fxd.EPS
	if cur := get("fxoutbox cursor default"); cur.EPS > 0 {
		d.CursorEPS, d.CursorPGUs, d.MarksPGUs = cur.EPS, cur.PGUsPerEvent, fxd.PGUsPerEvent
		d.CursorVsMarks = medianRatio(cur.series(), fxd.series())
	}
	if eo := get("fxoutbox exactly-once default"); eo.EPS > 0 && fxd.EPS > 0 {
		d.EOVsALO = medianRatio(eo.series(), fxd.series())
	}
	if eo, alo := get("fxoutbox stream exactly-once"), get("fxoutbox stream default"); eo.EPS > 0 && alo.EPS > 0 {
		d.StreamEOVsALO = medianRatio(eo.series(), alo.series())
	}
	if eo2, alo2 := get("fxoutbox exactly-once b500 x2"), get("fxoutbox b500 x2"); eo2.EPS > 0 && alo2.EPS > 0 {
		d.EO2VsALO2 = medianRatio(eo2.series(), alo2.series())
	}
	d.FxoutboxB500x1EPS = get("fxoutbox b500 x1").EPS
	d.FxoutboxB500x2EPS = get("fxoutbox b500 x2").EPS
	d.FxoutboxB500x4EPS = get("fxoutbox b500 x4").EPS
	best := fxd
	d.FxoutboxBestConfig = "default"
	for _, name := range []string{"fxoutbox b500 x1", "fxoutbox b500 x2", "fxoutbox b500 x4"} {
		if c := get(name); c.EPS > best.EPS {
			best, d.FxoutboxBestConfig = c, name[len("fxoutbox "):]
		}
	}
	d.FxoutboxBestEPS = best.EPS
	seed := get("seed relay")
	d.SeedEPS = seed.EPS
	wm100, wm1000 := get("watermill b100"), get("watermill b1000")
	d.WatermillDefaultEPS, d.WatermillB1000EPS = wm100.EPS, wm1000.EPS
	wmBest := wm100
	d.WatermillBestConfig = "SubscribeBatchSize 100 (default)"
	if wm1000.EPS > wm100.EPS {
		wmBest, d.WatermillBestConfig = wm1000, "SubscribeBatchSize 1000"
	}
	d.WatermillEPS = wmBest.EPS
	pg, pg4 := get("postgres b500 x1"), get("postgres b500 x4")
	prod := get("producer")
	d.FxoutboxVsSeed = medianRatio(fxd.series(), seed.series())
	d.FxoutboxVsWatermill = medianRatio(fxd.series(), wmBest.series())
	d.FxoutboxOfPostgres = medianRatio(fxd.series(), pg.series())
	d.FxoutboxB500OfPG = medianRatio(get("fxoutbox b500 x1").series(), pg.series())
	d.FxoutboxX4OfPostgres = medianRatio(get("fxoutbox b500 x4").series(), pg.series())
	d.BestVsSeed = medianRatio(best.series(), seed.series())
	d.BestVsWatermill = medianRatio(best.series(), wmBest.series())
	d.FxoutboxOfProducer = medianRatio(fxd.series(), prod.series())
	d.BestOfProducer = medianRatio(best.series(), prod.series())
	x1, x1p := get("fxoutbox b500 x1"), get("fxoutbox b500 x1 proc")
	d.Replicas1EPS, d.Replicas1PGUs = x1.EPS, x1.PGUsPerEvent
	d.Replicas2EPS, d.Replicas2PGUs = get("fxoutbox b500 x2").EPS, get("fxoutbox b500 x2").PGUsPerEvent
	d.Replicas3EPS, d.Replicas3PGUs = get("fxoutbox b500 x3").EPS, get("fxoutbox b500 x3").PGUsPerEvent
	d.Replicas4EPS, d.Replicas4PGUs = get("fxoutbox b500 x4").EPS, get("fxoutbox b500 x4").PGUsPerEvent
	d.Replicas1ProcEPS, d.Replicas1ProcPGUs = x1p.EPS, x1p.PGUsPerEvent
	d.Replicas2ProcsEPS, d.Replicas2ProcsPGUs = get("fxoutbox b500 x2 procs").EPS, get("fxoutbox b500 x2 procs").PGUsPerEvent
	d.Replicas4ProcsEPS, d.Replicas4ProcsPGUs = get("fxoutbox b500 x4 procs").EPS, get("fxoutbox b500 x4 procs").PGUsPerEvent
	d.Replicas2Vs1 = medianRatio(get("fxoutbox b500 x2").series(), x1.series())
	d.Replicas3Vs1 = medianRatio(get("fxoutbox b500 x3").series(), x1.series())
	d.Replicas4Vs1 = medianRatio(get("fxoutbox b500 x4").series(), x1.series())
	d.Replicas2ProcsVs1 = medianRatio(get("fxoutbox b500 x2 procs").series(), x1p.series())
	d.Replicas4ProcsVs1 = medianRatio(get("fxoutbox b500 x4 procs").series(), x1p.series())
	d.Replicas4PGVs1 = medianRatio(get("fxoutbox b500 x4").pgSeries(), x1.pgSeries())
	d.Replicas4ProcsPGVs1 = medianRatio(get("fxoutbox b500 x4 procs").pgSeries(), x1p.pgSeries())
	d.Note = fmt.Sprintf("backlog %d events; a contender still draining after %.0f s (the seed: after %.0f s) is measured over that fixed window; its rate is constant (one batch per poll)",
		n, p.DrainCapS, p.SeedWindowS)

	l := &Limits{
		ProducerEPS:        prod.EPS,
		PublisherB500EPS:   get("publisher b500").EPS,
		PostgresEPS:        pg.EPS,
		PostgresX4EPS:      pg4.EPS,
		PostgresSyncEPS:    get("postgres b500 x1 sync").EPS,
		PostgresB50EPS:     get("postgres b50 x1").EPS,
		RelayNoPublishEPS:  get("relay no-publish b500").EPS,
		RelayNoPubDefault:  get("relay no-publish default").EPS,
		UnorderedB50EPS:    get("fxoutbox unordered b50").EPS,
		RelayOfProducer:    d.FxoutboxOfProducer,
		RelayOfPostgres:    d.FxoutboxOfPostgres,
		BestRelayOfProd:    d.BestOfProducer,
		BestRelayOfPG:      medianRatio(best.series(), pg.series()),
		B500x1OfPostgres:   d.FxoutboxB500OfPG,
		B500x4OfPostgres:   d.FxoutboxX4OfPostgres,
		B500x4OfPostgresX4: medianRatio(get("fxoutbox b500 x4").series(), pg4.series()),
	}
	return d, l, nil
}

// progress counts published events and says when the target is reached.
type progress struct {
	n      atomic.Int64
	target int64
	once   sync.Once
	done   chan struct{}
}

func newProgress(target int) *progress {
	return &progress{target: int64(target), done: make(chan struct{})}
}

func (p *progress) add(k int) {
	if p.n.Add(int64(k)) >= p.target {
		p.once.Do(func() { close(p.done) })
	}
}

// wait returns when the target is reached or after limit, with the elapsed
// time since t0 and whether the limit cut the run short.
func (p *progress) wait(ctx context.Context, t0 time.Time, limit time.Duration) (time.Duration, bool) {
	t := time.NewTimer(limit - time.Since(t0))
	defer t.Stop()
	select {
	case <-p.done:
		return time.Since(t0), false
	case <-t.C:
		return time.Since(t0), true
	case <-ctx.Done():
		return time.Since(t0), true
	}
}

func result(published int64, elapsed time.Duration, capped bool) drainRun {
	s := elapsed.Seconds()
	return drainRun{Published: published, ElapsedS: round3(s), EPS: round1(float64(published) / s), Capped: capped}
}

// acked returns how many of msgs a Publish error leaves acknowledged.
func acked(msgs int, err error) int {
	if err == nil {
		return msgs
	}
	var be *relay.BatchError
	if errors.As(err, &be) {
		return msgs - len(be.Failed)
	}
	return 0
}

// drainFx drains the backlog with fxoutbox relays: replicas relays, each
// with its own producer (as separate pods would have), all with cfg.
func (e *env) drainFx(ctx context.Context, topic, warm string, n int, cfg *relay.Config, replicas int, noPublish bool) (drainRun, error) {
	prog := newProgress(n)
	var relays []*relay.Relay
	var readers []*sdkmetric.ManualReader // exactly-once relays' metrics
	var pubs []*relay.SaramaPublisher
	defer func() {
		for _, p := range pubs {
			_ = p.Close()
		}
	}()
	for range replicas {
		var pub relay.Publisher
		if noPublish {
			pub = relay.PublisherFunc(func(_ context.Context, msgs []relay.Message) error {
				prog.add(len(msgs))
				return nil
			})
		} else {
			sp, err := relay.NewSaramaPublisher(e.brokers, producerConfig("fxoutbox"))
			if err != nil {
				return drainRun{}, err
			}
			pubs = append(pubs, sp)
			// Connect before the clock starts (the producer connects lazily).
			if err := sp.Publish(ctx, []relay.Message{{Topic: warm, Key: []byte("k"), Value: []byte(`{}`)}}); err != nil {
				return drainRun{}, fmt.Errorf("warm up producer: %w", err)
			}
			pub = relay.PublisherFunc(func(ctx context.Context, msgs []relay.Message) error {
				err := sp.Publish(ctx, msgs)
				prog.add(acked(len(msgs), err))
				return err
			})
			if cfg != nil && cfg.Delivery == relay.ExactlyOnce {
				// The relay publishes through its own transactional
				// producers: progress is counted from the table.
				pub = sp
			}
		}
		c := relay.Config{}
		if cfg != nil {
			c = *cfg
		}
		c.Table = e.table // the only setting the "default" contender changes
		if c.Progress == relay.ProgressCursor {
			c.Table = e.ctable // the table with the cursor migration
		}
		var rd *sdkmetric.ManualReader
		if c.Delivery == relay.ExactlyOnce && !noPublish {
			rd = sdkmetric.NewManualReader()
			c.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(rd))
			readers = append(readers, rd)
		}
		r, err := relay.New(e.pool, pub, &c)
		if err != nil {
			return drainRun{}, err
		}
		relays = append(relays, r)
	}
	eo := cfg != nil && cfg.Delivery == relay.ExactlyOnce && !noPublish
	if eo {
		// The progress topic exists before the clock starts, as it does
		// after a relay's first start.
		if err := e.createProgressTopic(relays[0].Config().ProgressTopic); err != nil {
			return drainRun{}, err
		}
	}
	pg0 := e.pgBackendCPU(ctx)
	t0 := time.Now()
	for _, r := range relays {
		if err := r.Start(ctx); err != nil {
			return drainRun{}, err
		}
	}
	if eo {
		stopCount := e.countPublished(ctx, n, prog)
		defer stopCount()
	}
	elapsed, capped := prog.wait(ctx, t0, e.p.drainCap())
	pgUsed := pg0.until(e.pgBackendCPU(ctx))
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	for _, r := range relays {
		if err := r.Stop(stopCtx); err != nil {
			return drainRun{}, err
		}
	}
	// A cursor relay marks nothing: runDrain checks the broker's count.
	if cfg == nil || cfg.Progress != relay.ProgressCursor {
		if err := e.checkDrained(ctx, capped); err != nil {
			return drainRun{}, err
		}
	}
	res := result(min(prog.n.Load(), int64(n)), elapsed, capped)
	res.setPG(pgUsed)
	if len(readers) > 0 {
		res.EO = &eoCounts{}
		for _, rd := range readers {
			if err := res.EO.add(rd); err != nil {
				return drainRun{}, err
			}
		}
	}
	return res, nil
}

// drainPostgres is the PostgreSQL ceiling: the classic claim and mark
// statements, by hand, with nothing published in between; syncCommit says whether
// the commits wait for their WAL flush (the relay's default does not).
func (e *env) drainPostgres(ctx context.Context, n, batch, workers int, syncCommit bool) (drainRun, error) {
	pc := e.pool.Config()
	if !syncCommit {
		pc.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return drainRun{}, err
	}
	defer pool.Close()
	claim := "SELECT id, event_id, event_type, topic, partition_key, payload, headers FROM " + ident(e.table) +
		" WHERE published_at IS NULL ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED"
	mark := "UPDATE " + ident(e.table) + " SET published_at = now() WHERE id = ANY($1)"
	var total atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	t0 := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				k, err := func() (int, error) {
					tx, err := pool.Begin(ctx)
					if err != nil {
						return 0, err
					}
					defer tx.Rollback(ctx)
					rows, err := tx.Query(ctx, claim, batch)
					if err != nil {
						return 0, err
					}
					ids := make([]int64, 0, batch)
					var (
						id                       int64
						eid                      [16]byte
						typ, topic, key          string
						payloadBytes, headersRaw []byte
					)
					for rows.Next() {
						if err := rows.Scan(&id, &eid, &typ, &topic, &key, &payloadBytes, &headersRaw); err != nil {
							return 0, err
						}
						ids = append(ids, id)
					}
					if err := rows.Err(); err != nil {
						return 0, err
					}
					if len(ids) == 0 {
						return 0, nil
					}
					if _, err := tx.Exec(ctx, mark, ids); err != nil {
						return 0, err
					}
					return len(ids), tx.Commit(ctx)
				}()
				if err != nil {
					errs <- err
					return
				}
				if k == 0 {
					return
				}
				total.Add(int64(k))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(t0)
	close(errs)
	if err := <-errs; err != nil {
		return drainRun{}, err
	}
	if total.Load() != int64(n) {
		return drainRun{}, fmt.Errorf("claimed %d events, want %d", total.Load(), n)
	}
	return result(total.Load(), elapsed, false), nil
}

// createProgressTopic creates exactly-once's progress topic as the relay
// would (one partition, compacted), when it is missing.
func (e *env) createProgressTopic(topic string) error {
	admin, err := sarama.NewClusterAdmin(e.brokers, producerConfig("fxbench-admin"))
	if err != nil {
		return err
	}
	defer admin.Close()
	compact := "compact"
	err = admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1,
		ConfigEntries: map[string]*string{"cleanup.policy": &compact}}, false)
	if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
		return fmt.Errorf("create the progress topic %s: %w", topic, err)
	}
	return nil
}

// countPublished adds to prog the rows marked published in the table
// (the backlog of n less the unpublished rows, counted on the partial
// index, which shrinks as the relay drains), read every 20ms, until the
// returned stop is called: an exactly-once relay publishes through its own
// producers, so no publisher counts for it.
func (e *env) countPublished(ctx context.Context, n int, prog *progress) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		var last int64
		for ctx.Err() == nil {
			var left int64
			if err := e.pool.QueryRow(ctx, "SELECT count(*) FROM "+ident(e.table)+" WHERE published_at IS NULL").Scan(&left); err == nil && int64(n)-left > last {
				prog.add(int(int64(n) - left - last))
				last = int64(n) - left
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	return func() { cancel(); <-done }
}
