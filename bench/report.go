package main

import (
	"fmt"
	"io"
	"strings"
)

type results struct {
	Schema    int       `json:"schema"`
	Command   string    `json:"command"`
	StartedAt string    `json:"started_at"`
	DurationS float64   `json:"duration_s"`
	Broker    string    `json:"broker"`
	Machine   Machine   `json:"machine"`
	Params    params    `json:"params"`
	Library   Library   `json:"library"`
	Drain     *Drain    `json:"drain,omitempty"`
	Limits    *Limits   `json:"limits,omitempty"`
	Latency   *Latency  `json:"latency,omitempty"`
	Write     *Write    `json:"write,omitempty"`
	Inbox     *Inbox    `json:"inbox,omitempty"`
	Profile   []Profile `json:"relay_profile,omitempty"`
	Wal       *Wal      `json:"wal,omitempty"`
	Cost      *Cost     `json:"cost,omitempty"`
	Soak      *Soak     `json:"soak,omitempty"`
	Targets   []Target  `json:"targets"`
}

// Target is one of the goals, checked against this run.
type Target struct {
	Name  string  `json:"name"`
	Goal  string  `json:"goal"`
	Value float64 `json:"value"`
	Unit  string  `json:"unit"`
	Met   bool    `json:"met"`
	Gap   string  `json:"gap,omitempty"`
}

func evaluateTargets(r *results) []Target {
	var ts []Target
	atLeast := func(name, goal string, v, want float64, unit string) {
		t := Target{Name: name, Goal: goal, Value: v, Unit: unit, Met: v >= want}
		if !t.Met && want > 0 {
			t.Gap = fmt.Sprintf("%.0f%% short (%.3g of %.3g)", 100*(1-v/want), v, want)
		}
		ts = append(ts, t)
	}
	atMost := func(name, goal string, v, want float64, unit string) {
		t := Target{Name: name, Goal: goal, Value: v, Unit: unit, Met: v <= want && v > 0}
		if !t.Met && v > 0 {
			t.Gap = fmt.Sprintf("%.1fx over (%.3g vs %.3g)", v/want, v, want)
		}
		ts = append(ts, t)
	}
	if d := r.Drain; d != nil && d.FxoutboxEPS > 0 {
		atLeast("drain: default vs seed", ">= 200x the seed's relay", d.FxoutboxVsSeed, 200, "x")
		atLeast("drain: b500 x1 vs seed", ">= 200x the seed's relay", medianRatio(seriesOf(d, "fxoutbox b500 x1"), seriesOf(d, "seed relay")), 200, "x")
		atLeast("drain: default vs watermill", ">= 5x watermill at its best batch", d.FxoutboxVsWatermill, 5, "x")
		atLeast("drain: b500 x1 vs watermill", ">= 5x watermill at its best batch", medianRatio(seriesOf(d, "fxoutbox b500 x1"), seriesOf(d, bestWM(d))), 5, "x")
		atLeast("drain: default of PG ceiling", ">= 50% of claim+mark (1 relay)", d.FxoutboxOfPostgres, 0.5, "fraction")
		atLeast("drain: b500 x1 of PG ceiling", ">= 50% of claim+mark (1 relay, both batch 500)", d.FxoutboxB500OfPG, 0.5, "fraction")
		atLeast("drain: b500 x4 of PG ceiling", ">= 75% of claim+mark (4 replicas)", d.FxoutboxX4OfPostgres, 0.75, "fraction")
	}
	if l := r.Latency; l != nil && l.Replicas1P50 > 0 {
		atMost("latency: 3 relay processes p50 vs 1", "<= 1.5x one relay process's (1k/s, Listen)", l.Replicas3P50Vs1, 1.5, "x")
		atMost("latency: 3 relay processes p99 vs 1", "<= 1.5x one relay process's (1k/s, Listen)", l.Replicas3P99Vs1, 1.5, "x")
	}
	if d := r.Drain; d != nil && d.Replicas1EPS > 0 {
		atLeast("drain: 2 relays vs 1", ">= 1x one relay (b500, one process)", d.Replicas2Vs1, 1, "x")
		atLeast("drain: 4 relays vs 1", ">= 1x one relay (b500, one process)", d.Replicas4Vs1, 1, "x")
		if d.Replicas1ProcEPS > 0 {
			atLeast("drain: 2 relay processes vs 1", ">= 1x one relay process (b500)", d.Replicas2ProcsVs1, 1, "x")
			atLeast("drain: 4 relay processes vs 1", ">= 1x one relay process (b500)", d.Replicas4ProcsVs1, 1, "x")
		}
		if d.Replicas4PGVs1 > 0 {
			atMost("drain: PostgreSQL CPU/event, 4 relays vs 1", "<= 1.2x one relay's (b500, one process)", d.Replicas4PGVs1, 1.2, "x")
		}
		if d.Replicas4ProcsPGVs1 > 0 {
			atMost("drain: PostgreSQL CPU/event, 4 relay processes vs 1", "<= 1.2x one relay process's (b500)", d.Replicas4ProcsPGVs1, 1.2, "x")
		}
	}
	if l := r.Latency; l != nil && l.P50 > 0 {
		atMost("latency: p50 at 1k/s (wake)", "<= 10 ms", l.P50, 10, "ms")
		atMost("latency: p99 at 1k/s (wake)", "<= 50 ms", l.P99, 50, "ms")
	}
	if w := r.Write; w != nil && w.RawInsertTPS > 0 {
		atLeast("write: outbox1 vs rawinsert (16 writers)", ">= 90% of the hand-written INSERT", w.Outbox1VsRaw, 0.9, "fraction")
		ts = append(ts, Target{Name: "write: NOTIFY cost (16 writers)", Goal: "not the default (measured for reference)",
			Value: w.NotifyVsOutbox1, Unit: "fraction of outbox1", Met: true})
	}
	ts = append(ts, inboxTargets(r.Inbox)...)
	if x := r.Cost; x != nil && x.CursorRelayPGUs > 0 {
		atMost("cost: cursor relay PostgreSQL CPU/event", "<= 70 µs (Debezium's outbox connector; 1k/s)", x.CursorRelayPGUs, 70, "µs")
		// Zero is a value here (a relay that adds no WAL, no dead tuple).
		atMost0 := func(name, goal string, v, want float64, unit string) {
			t := Target{Name: name, Goal: goal, Value: v, Unit: unit, Met: v <= want}
			if !t.Met {
				t.Gap = fmt.Sprintf("%.1fx over (%.3g vs %.3g)", v/want, v, want)
			}
			ts = append(ts, t)
		}
		atMost0("cost: cursor relay WAL/event of the insert's", "<= 0.1x the INSERT's WAL (1k/s)", x.CursorRelayWalOfInsrt, 0.1, "x")
		atMost0("cost: cursor dead tuples/event", "<= 0.01 (n_dead_tup growth, before vacuum)", x.CursorDeadTuples, 0.01, "per event")
	}
	if d := r.Drain; d != nil && d.CursorVsMarks > 0 {
		atLeast("drain: cursor vs marks", ">= 1.5x (1 relay, defaults, same backlog)", d.CursorVsMarks, 1.5, "x")
	}
	// The eos targets are Apache Kafka's: an in-memory broker's figures are
	// reported (results.json) but not judged.
	kafka := r.Broker == "apache-kafka"
	if d := r.Drain; d != nil && d.EOVsALO > 0 && kafka {
		atLeast("eos: drain exactly-once vs at-least-once", ">= 0.85x (1 relay, defaults; Apache Kafka with KAFKA_BROKERS)", d.EOVsALO, 0.85, "x")
	}
	if d := r.Drain; d != nil && d.EO2VsALO2 > 0 && kafka {
		atLeast("eos: drain exactly-once vs at-least-once, 2 relays", ">= 0.85x (b500; Apache Kafka with KAFKA_BROKERS)", d.EO2VsALO2, 0.85, "x")
	}
	if d := r.Drain; d != nil && d.StreamEOVsALO > 0 {
		atLeast("eos: stream drain exactly-once vs at-least-once", ">= 0.85x (1 relay, defaults, a backlog decoded from the WAL)", d.StreamEOVsALO, 0.85, "x")
	}
	if l := r.Latency; l != nil && l.EOP50 > 0 && kafka {
		atMost("eos: exactly-once p50 at 1k/s", "<= 8 ms (read committed; Apache Kafka with KAFKA_BROKERS)", l.EOP50, 8, "ms")
	}
	if l := r.Latency; l != nil && l.CursorP50 > 0 {
		atMost("latency: cursor p50 at 1k/s (wake)", "<= 5 ms", l.CursorP50, 5, "ms")
		atMost("latency: cursor p99 at 1k/s (wake)", "<= 25 ms", l.CursorP99, 25, "ms")
	}
	if l := r.Latency; l != nil && l.CursorOpenTxP99Vs > 0 {
		// "Unchanged" within the noise of one run on a shared machine.
		atMost("latency: cursor p99 with a transaction open, vs without", "<= 1.25x (unchanged; 1k/s, 60 s)", l.CursorOpenTxP99Vs, 1.25, "x")
		ts = append(ts, Target{Name: "latency: the open transaction's events delivered after its commit", Goal: "all, every run",
			Value: float64(l.OpenTxHeldLost), Unit: "runs lost", Met: l.OpenTxHeldLost == 0})
	}
	if x := r.Soak; x != nil && x.TableGrowth > 0 {
		atMost("soak: table growth (10 min at 2k/s, Retention 1 min)", "<= 2.0x the size at minute 2", x.TableGrowth, 2, "x")
		ts = append(ts, Target{Name: "soak: rows the relay deleted", Goal: "0 (retention without DELETE)", Value: float64(x.RelayDeletes), Unit: "rows", Met: x.RelayDeletes == 0})
	}
	if x := r.Wal; x != nil && x.LatencyP50 > 0 {
		atMost("wal: stream p50 at 1k/s", "<= 5 ms (writers in another process)", x.LatencyP50, 5, "ms")
		atMost("wal: stream p99 at 1k/s", "<= 25 ms (writers in another process)", x.LatencyP99, 25, "ms")
		atLeast("wal: max rate stream vs poll", ">= 2x the polling relay's (lag < 1 s)", x.MaxRateVsPoll, 2, "x")
		atMost("wal: PostgreSQL CPU/event vs poll", "<= 0.5x the polling relay's (1k/s)", x.PGCPUVsPoll, 0.5, "x")
		ts = append(ts, Target{Name: "wal: wal_level=logical cost, writes", Goal: "nothing significant (measured: logical/replica)",
			Value: x.LevelCostWriteRatio, Unit: "x", Met: x.LevelCostWriteRatio >= 0.9})
		ts = append(ts, Target{Name: "wal: wal_level=logical cost, polling drain", Goal: "nothing significant (measured: logical/replica)",
			Value: x.LevelCostDrainRatio, Unit: "x", Met: x.LevelCostDrainRatio >= 0.9})
	}
	return ts
}

func seriesOf(d *Drain, name string) []float64 {
	for _, c := range d.Contenders {
		if c.Name == name {
			return c.series()
		}
	}
	return nil
}

func bestWM(d *Drain) string {
	if d.WatermillB1000EPS > d.WatermillDefaultEPS {
		return "watermill b1000"
	}
	return "watermill b100"
}

func printReport(w io.Writer, r *results) {
	line := strings.Repeat("-", 96)
	fmt.Fprintf(w, "\n%s\nfxoutbox benchmark  (%s)\n", line, r.Command)
	m := r.Machine
	fmt.Fprintf(w, "machine: %d x %s, %.1f GiB, %s, %s; %s\n", m.NProc, m.CPU, m.MemoryGiB, m.Kernel, m.GoVersion, m.PGVersion)
	fmt.Fprintf(w, "broker:  %s; PostgreSQL settings: %s; load avg %s -> %s\n%s\n", r.Broker, m.PGSettings, m.LoadAvgStart, m.LoadAvgEnd, line)
	if d := r.Drain; d != nil {
		fmt.Fprintf(w, "1. DRAIN  %d events x %d B, %d partitions; median of %d rounds\n", r.Params.Backlog, r.Params.PayloadBytes, r.Params.Partitions, r.Params.DrainRounds)
		fmt.Fprintf(w, "   %-24s %12s  %s\n", "contender", "events/s", "rounds")
		for _, c := range d.Contenders {
			var rs []string
			for _, x := range c.Rounds {
				s := fmt.Sprintf("%.0f", x.EPS)
				if x.Capped {
					s += "*"
				}
				rs = append(rs, s)
			}
			pg := ""
			if c.PGUsPerEvent > 0 {
				pg = fmt.Sprintf("  PostgreSQL %.1f µs/event", c.PGUsPerEvent)
			}
			fmt.Fprintf(w, "   %-24s %12.0f  %s   [%s]%s\n", c.Name, c.EPS, strings.Join(rs, " "), c.Kind, pg)
		}
		fmt.Fprintf(w, "   (* = measured over a fixed window)\n")
		if d.Replicas1EPS > 0 {
			fmt.Fprintf(w, "   replicas (b500, vs 1 relay, paired rounds): in one process x2 %.2f, x3 %.2f, x4 %.2f; separate processes x2 %.2f, x4 %.2f;"+
				" PostgreSQL CPU per event x4/x1 %.2f (in one process), %.2f (processes)\n",
				d.Replicas2Vs1, d.Replicas3Vs1, d.Replicas4Vs1, d.Replicas2ProcsVs1, d.Replicas4ProcsVs1, d.Replicas4PGVs1, d.Replicas4ProcsPGVs1)
		}
		fmt.Fprintf(w, "   fxoutbox default: %.0fx seed, %.1fx watermill (%s), %.0f%% of PG ceiling, %.0f%% of producer ceiling\n",
			d.FxoutboxVsSeed, d.FxoutboxVsWatermill, d.WatermillBestConfig, 100*d.FxoutboxOfPostgres, 100*d.FxoutboxOfProducer)
		fmt.Fprintf(w, "   fxoutbox best (%s): %.0fx seed, %.1fx watermill, %.0f%% of producer ceiling; b500 x1 %.0f%% / x4 %.0f%% of PG ceiling\n",
			d.FxoutboxBestConfig, d.BestVsSeed, d.BestVsWatermill, 100*d.BestOfProducer, 100*d.FxoutboxB500OfPG, 100*d.FxoutboxX4OfPostgres)
	}
	if l := r.Limits; l != nil {
		fmt.Fprintf(w, "4. LIMITS  producer %.0f ev/s; PostgreSQL claim+mark (no publishing, asynchronous commit) b500 x1 %.0f, x4 %.0f; synchronous commit b500 x1 %.0f\n",
			l.ProducerEPS, l.PostgresEPS, l.PostgresX4EPS, l.PostgresSyncEPS)
		if r.Params.Diagnostics {
			fmt.Fprintf(w, "   publisher alone in batches of 500 %.0f; PostgreSQL claim+mark b50 x1 %.0f; relay without publishing: b500 %.0f, defaults %.0f; relay unordered b50 %.0f\n",
				l.PublisherB500EPS, l.PostgresB50EPS, l.RelayNoPublishEPS, l.RelayNoPubDefault, l.UnorderedB50EPS)
		}
		fmt.Fprintf(w, "   fxoutbox default = %.1f%% of producer, %.1f%% of PostgreSQL; best = %.1f%% / %.1f%%; b500 x4 = %.0f%% of PostgreSQL x4\n",
			100*l.RelayOfProducer, 100*l.RelayOfPostgres, 100*l.BestRelayOfProd, 100*l.BestRelayOfPG, 100*l.B500x4OfPostgresX4)
	}
	if l := r.Latency; l != nil {
		fmt.Fprintf(w, "%s\n2. LATENCY  commit-to-consumer, ms (median of rounds)\n", line)
		fmt.Fprintf(w, "   %-18s %7s %9s %9s %9s %11s\n", "contender", "rate/s", "p50", "p99", "p99.9", "achieved/s")
		for _, s := range l.Series {
			sat := ""
			if s.Saturated {
				sat = "  saturated (publishing fell behind)"
			}
			if s.WritersShort {
				sat += "  (writers below the offered rate)"
			}
			fmt.Fprintf(w, "   %-18s %7d %9.1f %9.1f %9.1f %11.0f%s\n", s.Contender, s.Rate, s.P50, s.P99, s.P999, s.Achieved, sat)
		}
	}
	if x := r.Write; x != nil {
		fmt.Fprintf(w, "%s\n3. WRITE  business transactions/s and latency (median of rounds)\n", line)
		fmt.Fprintf(w, "   %-22s %7s %10s %8s %8s\n", "variant", "writers", "tx/s", "p50 ms", "p99 ms")
		for _, s := range x.Series {
			fmt.Fprintf(w, "   %-22s %7d %10.0f %8.2f %8.2f\n", s.Variant, s.Writers, s.TPS, s.P50, s.P99)
		}
		fmt.Fprintf(w, "   16 writers: outbox1/rawinsert %.3f, outbox1/plain %.3f, rawinsert/plain %.3f, outbox10/rawinsert10 %.3f, outbox0/plain %.3f\n",
			x.Outbox1VsRaw, x.Outbox1VsPlain, x.RawVsPlain, x.Outbox10VsRaw, x.Outbox0VsPlain)
		fmt.Fprintf(w, "   16 writers: NOTIFY in every transaction/outbox1 %.3f, coalesced Notifier after commit/outbox1 %.3f; 1 writer: outbox1/rawinsert %.3f\n",
			x.NotifyVsOutbox1, x.NotifierVsOut1, x.Outbox1VsRaw1W)
		if r.Params.Diagnostics {
			fmt.Fprintf(w, "   where the time goes (vs rawinsert): no secondary indexes %.3f, 18-byte payload %.3f, one round trip fewer %.3f\n",
				x.Diagnostics["rawinsert_noindex_vs_rawinsert"], x.Diagnostics["rawinsert_smallrow_vs_rawinsert"], x.Diagnostics["rawinsert_pipelined_vs_rawinsert"])
		}
	}
	printInbox(w, r.Inbox, line)
	printWal(w, r.Wal, line)
	printCost(w, r.Cost, line)
	printSoak(w, r.Soak, line)
	fmt.Fprintf(w, "%s\nTARGETS\n", line)
	for _, t := range r.Targets {
		mark := "MET "
		if !t.Met {
			mark = "MISS"
		}
		fmt.Fprintf(w, "   [%s] %-42s %-48s value %.3g %s %s\n", mark, t.Name, t.Goal, t.Value, t.Unit, t.Gap)
	}
	fmt.Fprintln(w, line)
}

// linkSoak copies the soak section's figures into the cost section
// (cost.soak_table_growth, cost.soak_relay_deletes), when both are there.
func (r *results) linkSoak() {
	if r.Cost == nil || r.Soak == nil {
		return
	}
	g, d := r.Soak.TableGrowth, r.Soak.RelayDeletes
	r.Cost.SoakTableGrowth, r.Cost.SoakRelayDeletes = &g, &d
}
