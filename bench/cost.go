package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"strconv"
	"time"

	"github.com/fxoutbox/outbox"
)

// Cost is the "cost" section: what delivering an event costs PostgreSQL
// with marks progress (an UPDATE per event) and with cursor progress (the
// lanes' positions, once per batch), side by side in one run on a cluster
// of the section's own, set up as the wal section's.
type Cost struct {
	Command      string  `json:"command"`
	StartedAt    string  `json:"started_at"`
	LoadAvgStart string  `json:"loadavg_start"`
	LoadAvgEnd   string  `json:"loadavg_end"`
	Note         string  `json:"note"`
	Rate         int     `json:"rate_eps"`
	Writers      int     `json:"writers"`
	Rounds       int     `json:"rounds"`
	DurationS    float64 `json:"run_duration_s"`

	// PostgreSQL CPU of the relay's own backends per event (medians).
	MarksRelayPGUs  float64 `json:"marks_relay_pg_us_per_event"`
	CursorRelayPGUs float64 `json:"cursor_relay_pg_us_per_event"`
	CursorVsMarksPG float64 `json:"cursor_vs_marks_pg_cpu"`
	// Per batch, and the events per batch.
	MarksRelayPGUsPerBatch  float64 `json:"marks_relay_pg_us_per_batch"`
	CursorRelayPGUsPerBatch float64 `json:"cursor_relay_pg_us_per_batch"`
	MarksEventsPerBatch     float64 `json:"marks_events_per_batch"`
	CursorEventsPerBatch    float64 `json:"cursor_events_per_batch"`

	// WAL per event: the writers alone (the outbox INSERT and its commit,
	// on the marks table and on the cursor table, which has the txid
	// column and its index), and what each relay adds (WAL per event of a
	// run with the relay minus that of the writers alone on its table;
	// medians).
	InsertWal             float64 `json:"insert_wal_bytes_per_event"`
	CursorTableInsertWal  float64 `json:"cursor_table_insert_wal_bytes_per_event"`
	MarksRelayWal         float64 `json:"marks_relay_wal_bytes_per_event"`
	CursorRelayWal        float64 `json:"cursor_relay_wal_bytes_per_event"`
	CursorRelayWalOfInsrt float64 `json:"cursor_relay_wal_of_insert"`
	MarksRelayWalOfInsert float64 `json:"marks_relay_wal_of_insert"`

	// Growth of the outbox table's n_dead_tup over a run, per event
	// (autovacuum off on the table).
	MarksDeadTuples  float64 `json:"marks_dead_tuples_per_event"`
	CursorDeadTuples float64 `json:"cursor_dead_tuples_per_event"`

	// Commit-to-consumer latency of the runs (relay in a process of its
	// own, Listen; writers in another with the Notifier).
	MarksP50  float64 `json:"marks_p50_ms"`
	MarksP99  float64 `json:"marks_p99_ms"`
	CursorP50 float64 `json:"cursor_p50_ms"`
	CursorP99 float64 `json:"cursor_p99_ms"`

	// The soak section's figures, when it ran (see Soak).
	SoakTableGrowth  *float64 `json:"soak_table_growth,omitempty"`
	SoakRelayDeletes *int64   `json:"soak_relay_deletes,omitempty"`

	Runs []CostRun `json:"runs"`
}

// CostRun is one run of the cost section.
type CostRun struct {
	Round int `json:"round"`
	WalLatRun
	DeadTuplesPerEvent float64 `json:"dead_tuples_per_event"`
}

// costModes are the section's runs: the writers alone on each table, and
// each relay.
var costModes = []string{"writers", "poll", "writers-cursor", "cursor"}

func (p params) cost() (rounds int, d time.Duration) {
	rounds, d = 3, 10*time.Second
	if p.Quick {
		rounds, d = 2, 4*time.Second
	}
	if n, err := strconv.Atoi(os.Getenv("BENCH_ROUNDS")); err == nil && n > 0 {
		rounds = n
	}
	return rounds, d
}

// costReset makes a table ready for the next run, the same for every run
// and both tables: emptied (the cursor table's positions too: the relay's
// first claim creates them at the current snapshot), then 100,000 rows
// written already published (a table in service, without the free space
// an UPDATE and a VACUUM would leave: INSERTs reusing it would write
// full-page images that appending ones do not), vacuumed and analyzed.
// None of it is measured.
func (c *walCluster) costReset(ctx context.Context, t outbox.Table) error {
	return c.e.preload(ctx, t, "fxbench.published", 100_000, true)
}

func runCost(ctx context.Context, e *env) (*Cost, error) {
	rounds, d := e.p.cost()
	res := &Cost{StartedAt: time.Now().UTC().Format(time.RFC3339), LoadAvgStart: loadavg(), Rate: 1000, Writers: e.p.LatWriters,
		Rounds: rounds, DurationS: d.Seconds(), Command: "cd bench && BENCH_ONLY=cost go run ."}
	if e.p.Quick {
		res.Command = "cd bench && BENCH_QUICK=1 BENCH_ONLY=cost go run ."
	}
	warm, err := e.newTopic("costwarm")
	if err != nil {
		return nil, err
	}
	defer e.dropTopic(warm)
	c, err := e.startCluster(ctx, "cost", "logical")
	if err != nil {
		return nil, fmt.Errorf("start the cost cluster: %w", err)
	}
	defer c.stop()
	for _, t := range []outbox.Table{c.e.table, c.e.ctable} {
		if _, err := c.e.pool.Exec(ctx, "ALTER TABLE "+ident(t)+" SET (autovacuum_enabled = off)"); err != nil {
			return nil, err
		}
	}
	for round := range rounds {
		for i := range costModes {
			// The modes rotate round by round, so that machine noise
			// and the order's effects hit every mode.
			mode := costModes[(i+round)%len(costModes)]
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			if err := c.costReset(ctx, c.e.tableOf(mode)); err != nil {
				return nil, err
			}
			run, dead, err := c.rateRound(ctx, rateSpec{mode: mode, warm: warm, rate: res.Rate, d: d, deadTuples: true})
			if err != nil {
				return nil, fmt.Errorf("cost %s: %w", mode, err)
			}
			res.Runs = append(res.Runs, CostRun{Round: round + 1, WalLatRun: run, DeadTuplesPerEvent: round3(dead)})
			log.Printf("cost: round %d/%d  %-14s @%d/s (%.0f/s achieved, n=%d, missing %d)  relay PostgreSQL %6.1f µs/event (%.1f events, %.0f µs per batch)  WAL %6.1f B/event  dead tuples %.3f/event  p50 %.2f p99 %.2f ms",
				round+1, rounds, mode, run.Rate, run.Achieved, run.Events, run.Missing, run.RelayPGUs, run.EventsPerBatch, run.RelayPGUsPerBatch, run.WalBytesPerEvent, dead, run.P50, run.P99)
		}
	}
	pick := func(mode string, f func(CostRun) float64) float64 {
		var xs []float64
		for _, r := range res.Runs {
			if r.Mode == mode {
				xs = append(xs, f(r))
			}
		}
		return median(xs)
	}
	pg := func(r CostRun) float64 { return r.RelayPGUs }
	wal := func(r CostRun) float64 { return r.WalBytesPerEvent }
	res.MarksRelayPGUs, res.CursorRelayPGUs = round2(pick("poll", pg)), round2(pick("cursor", pg))
	res.CursorVsMarksPG = ratio(res.CursorRelayPGUs, res.MarksRelayPGUs)
	res.MarksRelayPGUsPerBatch = round1(pick("poll", func(r CostRun) float64 { return r.RelayPGUsPerBatch }))
	res.CursorRelayPGUsPerBatch = round1(pick("cursor", func(r CostRun) float64 { return r.RelayPGUsPerBatch }))
	res.MarksEventsPerBatch = round2(pick("poll", func(r CostRun) float64 { return r.EventsPerBatch }))
	res.CursorEventsPerBatch = round2(pick("cursor", func(r CostRun) float64 { return r.EventsPerBatch }))
	res.InsertWal, res.CursorTableInsertWal = round1(pick("writers", wal)), round1(pick("writers-cursor", wal))
	res.MarksRelayWal = round1(pick("poll", wal) - res.InsertWal)
	res.CursorRelayWal = round1(pick("cursor", wal) - res.CursorTableInsertWal)
	if res.InsertWal > 0 {
		res.MarksRelayWalOfInsert = round3(res.MarksRelayWal / res.InsertWal)
		res.CursorRelayWalOfInsrt = round3(res.CursorRelayWal / res.InsertWal)
	}
	dead := func(r CostRun) float64 { return r.DeadTuplesPerEvent }
	res.MarksDeadTuples, res.CursorDeadTuples = round3(pick("poll", dead)), round3(pick("cursor", dead))
	res.MarksP50, res.MarksP99 = round2(pick("poll", func(r CostRun) float64 { return r.P50 })), round2(pick("poll", func(r CostRun) float64 { return r.P99 }))
	res.CursorP50, res.CursorP99 = round2(pick("cursor", func(r CostRun) float64 { return r.P50 })), round2(pick("cursor", func(r CostRun) float64 { return r.P99 }))
	res.LoadAvgEnd = loadavg()
	res.Note = fmt.Sprintf("A throwaway cluster started by scripts/pg.sh (wal_level=logical, as the wal section's), with two outbox tables: the marks relay's (fxbench.outbox_event) and the cursor relay's (fxbench.cursor_event, with migrations.Cursor.Up), autovacuum off on both. "+
		"Each run: writers in a process of their own (unitofwork with the Notifier, %d writers, one event per transaction, %d/s for %.0f s), and the polling relay at its defaults with Listen in another, with marks (poll) or cursor progress (cursor), or no relay (writers, writers-cursor); modes rotating round by round, %d round(s), medians. "+
		"Before each run (not measured): the run's table emptied (the cursor table's positions too: the relay creates them at its first claim, at the current snapshot), 100,000 rows written already published, VACUUM ANALYZE; a CHECKPOINT. "+
		"Relay PostgreSQL CPU: user+system from /proc of the relay's backends, from before the writes until the relay delivered the last event (marks: marked it; cursor: its backends out of any transaction after the consumer got the last event). "+
		"WAL: pg_current_wal_lsn over the same span, per event committed; the relay's = the run's minus the writers alone on the same table. "+
		"Dead tuples: pg_stat_user_tables.n_dead_tup of the table before the run and after the relay and writer processes exited (a backend flushes its statistics when it exits; the reading session calls pg_stat_force_next_flush() and pg_stat_clear_snapshot()), per event.",
		e.p.LatWriters, res.Rate, d.Seconds(), rounds)
	return res, nil
}

// printCost prints the section's report.
func printCost(w io.Writer, x *Cost, line string) {
	if x == nil {
		return
	}
	fmt.Fprintf(w, "%s\nCOST OF DELIVERY  (marks vs cursor progress, @%d/s, one event per transaction, %d writers; load %s -> %s)\n", line, x.Rate, x.Writers, x.LoadAvgStart, x.LoadAvgEnd)
	fmt.Fprintf(w, "   relay PostgreSQL CPU per event: marks %.1f µs, cursor %.1f µs (ratio %.2f); per batch %.0f / %.0f µs, events per batch %.2f / %.2f\n",
		x.MarksRelayPGUs, x.CursorRelayPGUs, x.CursorVsMarksPG, x.MarksRelayPGUsPerBatch, x.CursorRelayPGUsPerBatch, x.MarksEventsPerBatch, x.CursorEventsPerBatch)
	fmt.Fprintf(w, "   WAL per event: insert %.0f B (cursor table %.0f B); the relay adds: marks %.0f B (%.2fx the insert's), cursor %.0f B (%.2fx)\n",
		x.InsertWal, x.CursorTableInsertWal, x.MarksRelayWal, x.MarksRelayWalOfInsert, x.CursorRelayWal, x.CursorRelayWalOfInsrt)
	fmt.Fprintf(w, "   dead tuples per event: marks %.3f, cursor %.3f; latency p50/p99: marks %.2f/%.2f ms, cursor %.2f/%.2f ms\n",
		x.MarksDeadTuples, x.CursorDeadTuples, x.MarksP50, x.MarksP99, x.CursorP50, x.CursorP99)
	if x.SoakTableGrowth != nil && x.SoakRelayDeletes != nil {
		fmt.Fprintf(w, "   soak: table growth %.2fx, rows the relay deleted %d\n", *x.SoakTableGrowth, *x.SoakRelayDeletes)
	}
}
