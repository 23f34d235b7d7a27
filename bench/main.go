// Command bench measures fxoutbox side by side with a Go transcription of the
// seed's NestJS relay and with watermill's Forwarder, on one PostgreSQL and
// one Kafka-protocol broker, in one run, alternating the contenders round by
// round and reporting medians.
//
//	cd bench && go run .            # full run (about 10-15 minutes on 2 cores)
//	BENCH_QUICK=1 go run .          # quick run (under 2 minutes)
//
// It needs DATABASE_URL (make bench starts scripts/pg.sh). Without
// KAFKA_BROKERS it starts an in-memory broker (kfake) in this process; with
// it, it uses that broker (and reports "apache-kafka").
//
// Results: a table on stdout and results.json (BENCH_OUT to change the
// path). `go run ./chart` turns results.json into ../docs/benchmarks.png.
//
// Environment knobs (all optional): BENCH_QUICK, BENCH_ROUNDS,
// BENCH_BACKLOG, BENCH_ONLY (comma list of drain,latency,write,limits,inbox,
// profile,wal,cost,soak; a partial run merges its sections into the results
// file; soak, 10 minutes, runs only when named), BENCH_SOAK_S,
// BENCH_SOAK_RATE, BENCH_SOAK_PROGRESS (a shorter, slower or marks soak),
// BENCH_OUT, BENCH_CPUPROFILE (a pprof CPU profile of the whole run),
// BENCH_LAT_WRITERS, BENCH_BROKER_KIND (the label of a KAFKA_BROKERS broker
// that is not Apache Kafka).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"regexp"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"
)

// params sizes a run.
type params struct {
	Quick        bool    `json:"quick"`
	Backlog      int     `json:"drain_backlog_events"`
	PayloadBytes int     `json:"payload_bytes"`
	Partitions   int     `json:"partitions"`
	Keys         int     `json:"distinct_keys"`
	DrainRounds  int     `json:"drain_rounds"`
	DrainCapS    float64 `json:"drain_cap_s"`
	SeedWindowS  float64 `json:"seed_window_s"`
	LatRounds    int     `json:"latency_rounds"`
	LatDurationS float64 `json:"latency_duration_s"`
	// LatWarmupS is written at the offered rate before the measured
	// LatDurationS and left out of the percentiles (its worst wait is
	// reported as warmup_max_ms): a relay's first second pays for its
	// start (new sessions, the new topic's metadata, the consumer's first
	// fetches), which a latency at a rate is not about.
	LatWarmupS    float64 `json:"latency_warmup_s"`
	LatRates      []int   `json:"latency_rates"`
	LatWriters    int     `json:"latency_writers"`
	WriteRounds   int     `json:"write_rounds"`
	WriteDuration float64 `json:"write_duration_s"`
	WriteWriters  []int   `json:"write_writers"`
	Diagnostics   bool    `json:"write_diagnostics"`

	only map[string]bool
	// walStatements (BENCH_WAL_STATEMENTS) loads pg_stat_statements in the
	// wal section's cluster and reports the relays' statements.
	walStatements bool
	// contenders, from BENCH_CONTENDERS (a regular expression), limits the
	// drain to the contenders whose names match: for tuning, not for
	// recorded results.
	contenders *regexp.Regexp
}

func (p params) drainCap() time.Duration   { return dur(p.DrainCapS) }
func (p params) seedWindow() time.Duration { return dur(p.SeedWindowS) }
func (p params) latDuration() time.Duration {
	return dur(p.LatDurationS)
}
func (p params) latWarmup() time.Duration     { return dur(p.LatWarmupS) }
func (p params) writeDuration() time.Duration { return dur(p.WriteDuration) }
func dur(s float64) time.Duration             { return time.Duration(s * float64(time.Second)) }

func (p params) runs(section string) bool { return len(p.only) == 0 || p.only[section] }

func loadParams() params {
	p := params{
		Backlog:       100_000,
		PayloadBytes:  256,
		Partitions:    12,
		Keys:          10_000,
		DrainRounds:   3,
		DrainCapS:     60,
		SeedWindowS:   5,
		LatRounds:     3,
		LatDurationS:  10,
		LatWarmupS:    1,
		LatRates:      []int{1000, 5000},
		LatWriters:    32,
		WriteRounds:   5,
		WriteDuration: 4,
		WriteWriters:  []int{1, 16},
		Diagnostics:   true,
	}
	if truthy(os.Getenv("BENCH_QUICK")) {
		p.Quick = true
		p.Backlog = 20_000
		p.DrainRounds = 2
		p.DrainCapS = 4
		p.SeedWindowS = 2
		p.LatRounds = 1
		p.LatDurationS = 3
		p.WriteRounds = 2
		p.WriteDuration = 1
		p.Diagnostics = false
	}
	if n, err := strconv.Atoi(os.Getenv("BENCH_LAT_WRITERS")); err == nil && n > 0 {
		p.LatWriters = n
	}
	if n, err := strconv.Atoi(os.Getenv("BENCH_ROUNDS")); err == nil && n > 0 {
		p.DrainRounds, p.LatRounds, p.WriteRounds = n, n, n
	}
	if n, err := strconv.Atoi(os.Getenv("BENCH_BACKLOG")); err == nil && n > 0 {
		p.Backlog = n
	}
	p.walStatements = truthy(os.Getenv("BENCH_WAL_STATEMENTS"))
	if s := os.Getenv("BENCH_CONTENDERS"); s != "" {
		p.contenders = regexp.MustCompile(s)
	}
	if s := os.Getenv("BENCH_ONLY"); s != "" {
		p.only = map[string]bool{}
		for _, x := range strings.Split(s, ",") {
			p.only[strings.TrimSpace(x)] = true
		}
	}
	return p
}

func truthy(s string) bool {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "0", "false", "no", "off":
		return false
	}
	return true
}

func main() {
	log.SetFlags(log.Ltime)
	log.SetPrefix("bench: ")
	switch os.Getenv(childEnv) {
	case "relay":
		if err := runChild(); err != nil {
			log.Fatal(err)
		}
		return
	case "writer":
		if err := runWriterChild(); err != nil {
			log.Fatal(err)
		}
		return
	}
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if path := os.Getenv("BENCH_CPUPROFILE"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	p := loadParams()
	started := time.Now()
	e, err := setup(ctx, p)
	if err != nil {
		return err
	}
	defer e.close()
	res := &results{
		Schema:    1,
		Command:   command(p),
		StartedAt: started.UTC().Format(time.RFC3339),
		Broker:    e.brokerKind,
		Machine:   e.machine(ctx),
		Params:    p,
		Library:   libraryInfo(),
	}
	mode := "full"
	if p.Quick {
		mode = "quick"
	}
	log.Printf("%s run: broker %s %v, PostgreSQL %s, backlog %d x %d B, %d partitions",
		mode, e.brokerKind, e.brokers, res.Machine.PGVersion, p.Backlog, p.PayloadBytes, p.Partitions)

	if e.brokerKind != "kfake (in-memory)" {
		// A JVM broker serves its first hundred thousand records slower
		// (class loading, JIT): warm it up so the first round is not
		// penalized.
		for range 2 {
			topic, err := e.newTopic("jvmwarmup")
			if err != nil {
				return err
			}
			run, err := e.drainProducer(ctx, topic, p.Backlog)
			e.dropTopic(topic)
			if err != nil {
				return fmt.Errorf("broker warm-up: %w", err)
			}
			log.Printf("broker warm-up: %d records at %.0f events/s", run.Published, run.EPS)
		}
	}
	if p.runs("limits") || p.runs("drain") {
		if res.Drain, res.Limits, err = runDrain(ctx, e); err != nil {
			return fmt.Errorf("drain: %w", err)
		}
	}
	if p.only["profile"] || len(p.only) == 0 && p.Diagnostics {
		if res.Profile, err = runProfile(ctx, e, os.Stdout); err != nil {
			return fmt.Errorf("profile: %w", err)
		}
	}
	if p.runs("latency") {
		if res.Latency, err = runLatency(ctx, e); err != nil {
			return fmt.Errorf("latency: %w", err)
		}
	}
	if p.runs("write") {
		if res.Write, err = runWrite(ctx, e); err != nil {
			return fmt.Errorf("write: %w", err)
		}
	}
	if p.runs("inbox") {
		if res.Inbox, err = runInbox(ctx, e); err != nil {
			return fmt.Errorf("inbox: %w", err)
		}
	}
	if p.runs("wal") {
		if res.Wal, err = runWal(ctx, e); err != nil {
			if len(p.only) > 0 || ctx.Err() != nil {
				return fmt.Errorf("wal: %w", err)
			}
			log.Printf("wal: section skipped: %v", err)
		}
	}
	if p.runs("cost") {
		if res.Cost, err = runCost(ctx, e); err != nil {
			return fmt.Errorf("cost: %w", err)
		}
	}
	if p.only["soak"] { // ten minutes: only when asked for
		if res.Soak, err = runSoak(ctx, e); err != nil {
			return fmt.Errorf("soak: %w", err)
		}
	}
	res.linkSoak()
	res.Machine.LoadAvgEnd = loadavg()
	res.DurationS = round1(time.Since(started).Seconds())
	res.Targets = evaluateTargets(res)
	printReport(os.Stdout, res)
	out := os.Getenv("BENCH_OUT")
	if out == "" {
		out = "results.json"
	}
	if len(p.only) > 0 {
		// A partial run replaces its sections in the results file and
		// keeps the others.
		if res, err = mergeResults(out, res, p); err != nil {
			return err
		}
	}
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(out, append(b, '\n'), 0o644); err != nil {
		return err
	}
	log.Printf("wrote %s (%.0f s in all)", out, res.DurationS)
	return nil
}

// mergeResults returns the results in path with the sections of the
// partial run res in place of theirs, and the targets evaluated again.
func mergeResults(path string, res *results, p params) (*results, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return res, nil
	}
	if err != nil {
		return nil, err
	}
	old := &results{}
	if err := json.Unmarshal(b, old); err != nil {
		return nil, fmt.Errorf("%s: %w (move it away to start afresh)", path, err)
	}
	if p.runs("drain") || p.runs("limits") {
		old.Drain, old.Limits = res.Drain, res.Limits
	}
	if p.only["profile"] {
		old.Profile = res.Profile
	}
	if p.runs("latency") {
		old.Latency = res.Latency
	}
	if p.runs("write") {
		old.Write = res.Write
	}
	if p.runs("inbox") {
		old.Inbox = res.Inbox
	}
	if p.runs("wal") {
		old.Wal = res.Wal
	}
	if p.runs("cost") {
		old.Cost = res.Cost
	}
	if p.only["soak"] {
		old.Soak = res.Soak
	}
	old.linkSoak()
	old.Targets = evaluateTargets(old)
	return old, nil
}

func command(p params) string {
	c := "make bench"
	if p.Quick {
		c = "BENCH_QUICK=1 make bench"
	}
	if os.Getenv("KAFKA_BROKERS") != "" {
		c = "KAFKA_BROKERS=<host:port> " + c
	}
	return c
}
