package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
)

// full is the part of results.json the markdown tables need.
type full struct {
	Command   string  `json:"command"`
	StartedAt string  `json:"started_at"`
	DurationS float64 `json:"duration_s"`
	Broker    string  `json:"broker"`
	Machine   struct {
		NProc        int     `json:"nproc"`
		CPU          string  `json:"cpu"`
		MemoryGiB    float64 `json:"memory_gib"`
		Kernel       string  `json:"kernel"`
		Go           string  `json:"go"`
		PGVersion    string  `json:"pg_version"`
		PGSettings   string  `json:"pg_settings"`
		LoadAvgStart string  `json:"loadavg_start"`
		LoadAvgEnd   string  `json:"loadavg_end"`
	} `json:"machine"`
	Params struct {
		Backlog     int     `json:"drain_backlog_events"`
		Payload     int     `json:"payload_bytes"`
		Partitions  int     `json:"partitions"`
		Keys        int     `json:"distinct_keys"`
		DrainRounds int     `json:"drain_rounds"`
		DrainCapS   float64 `json:"drain_cap_s"`
		SeedWindowS float64 `json:"seed_window_s"`
		LatRounds   int     `json:"latency_rounds"`
		LatDurS     float64 `json:"latency_duration_s"`
		LatWriters  int     `json:"latency_writers"`
		WriteRounds int     `json:"write_rounds"`
		WriteDurS   float64 `json:"write_duration_s"`
	} `json:"params"`
	Library struct {
		Commit string   `json:"commit"`
		Dirty  bool     `json:"dirty"`
		Deps   []string `json:"deps"`
	} `json:"library"`
	Drain *struct {
		Contenders []struct {
			Name   string  `json:"name"`
			Desc   string  `json:"desc"`
			Kind   string  `json:"kind"`
			EPS    float64 `json:"median_eps"`
			Rounds []struct {
				EPS    float64 `json:"eps"`
				Capped bool    `json:"capped"`
				CPU    *struct {
					Busy     float64 `json:"machine_busy"`
					Bench    float64 `json:"bench_cores"`
					Broker   float64 `json:"jvm_broker_cores"`
					Postgres float64 `json:"postgres_and_rest_cores"`
				} `json:"cpu"`
			} `json:"rounds"`
		} `json:"contenders"`
	} `json:"drain"`
	Limits  map[string]float64 `json:"limits"`
	Latency *struct {
		Series []struct {
			Contender string  `json:"contender"`
			Desc      string  `json:"desc"`
			Rate      int     `json:"offered_eps"`
			P50       float64 `json:"p50_ms"`
			P99       float64 `json:"p99_ms"`
			P999      float64 `json:"p999_ms"`
			Achieved  float64 `json:"achieved_eps"`
			Saturated bool    `json:"saturated"`
			Short     bool    `json:"writers_short"`
		} `json:"series"`
	} `json:"latency"`
	Write *struct {
		Series []struct {
			Variant string  `json:"variant"`
			Desc    string  `json:"desc"`
			Writers int     `json:"writers"`
			Kind    string  `json:"kind"`
			TPS     float64 `json:"tps"`
			P50     float64 `json:"p50_ms"`
			P99     float64 `json:"p99_ms"`
		} `json:"series"`
	} `json:"write"`
	Targets []struct {
		Name  string  `json:"name"`
		Goal  string  `json:"goal"`
		Value float64 `json:"value"`
		Unit  string  `json:"unit"`
		Met   bool    `json:"met"`
		Gap   string  `json:"gap"`
	} `json:"targets"`
	Profile []struct {
		Config  string  `json:"config"`
		EPS     float64 `json:"eps"`
		Batches int     `json:"batches"`
		Steps   []struct {
			Step  string  `json:"step"`
			Share float64 `json:"share"`
			AvgMS float64 `json:"avg_ms"`
		} `json:"steps"`
	} `json:"relay_profile"`
}

// writeMarkdown renders the tables of docs/benchmarks.md from results.json.
func writeMarkdown(w io.Writer, raw []byte) error {
	var r full
	if err := json.Unmarshal(raw, &r); err != nil {
		return err
	}
	m := r.Machine
	fmt.Fprintf(w, "Run `%s` on %s (%.0f s). Machine: %d x %s, %.1f GiB RAM, %s; %s (%s); Go %s; broker: %s. Load average %s at the start, %s at the end.\n",
		r.Command, r.StartedAt, r.DurationS, m.NProc, m.CPU, m.MemoryGiB, m.Kernel, m.PGVersion, m.PGSettings, strings.TrimPrefix(m.Go, "go"), r.Broker, m.LoadAvgStart, m.LoadAvgEnd)
	fmt.Fprintf(w, "fxoutbox at commit %s", r.Library.Commit)
	if r.Library.Dirty {
		fmt.Fprintf(w, " (with uncommitted changes in relay/ or unitofwork/)")
	}
	fmt.Fprintf(w, "; %s.\n\n", strings.Join(r.Library.Deps, ", "))
	if d := r.Drain; d != nil {
		p := r.Params
		fmt.Fprintf(w, "### 1. Drain: %d events x %d B, %d partitions, %d keys (median of %d rounds)\n\n", p.Backlog, p.Payload, p.Partitions, p.Keys, p.DrainRounds)
		fmt.Fprintf(w, "| contender | events/s | rounds | CPU (median round): busy; bench / JVM broker / PostgreSQL+rest cores | what |\n|---|---:|---|---|---|\n")
		for _, c := range d.Contenders {
			var rs []string
			var busy []float64
			cpu := map[float64]string{}
			for _, x := range c.Rounds {
				s := fmt.Sprintf("%.0f", x.EPS)
				if x.Capped {
					s += "\\*"
				}
				rs = append(rs, s)
				if u := x.CPU; u != nil {
					busy = append(busy, u.Busy)
					cpu[u.Busy] = fmt.Sprintf("%.0f%%; %.2f / %.2f / %.2f", 100*u.Busy, u.Bench, u.Broker, u.Postgres)
				}
			}
			cpuCell := ""
			if len(busy) > 0 {
				slices.Sort(busy)
				cpuCell = cpu[busy[len(busy)/2]]
			}
			name := c.Name
			if c.Kind == "contender" && strings.HasPrefix(c.Name, "fxoutbox") {
				name = "**" + name + "**"
			}
			fmt.Fprintf(w, "| %s | %.0f | %s | %s | %s (%s) |\n", name, c.EPS, strings.Join(rs, ", "), cpuCell, c.Desc, c.Kind)
		}
		fmt.Fprintf(w, "\n\\* measured over a fixed window (%.0f s; the seed: %.0f s) instead of to the end of the backlog: the contender's rate is constant.\n\n", p.DrainCapS, p.SeedWindowS)
	}
	if l := r.Limits; l != nil {
		fmt.Fprintf(w, "### 4. Limits and the relay as a fraction of them\n\n| figure | value |\n|---|---:|\n")
		rows := []struct{ k, label, f string }{
			{"producer_eps", "producer ceiling: sarama AsyncProducer alone, same config, events/s", "%.0f"},
			{"publisher_b500_eps", "relay.SaramaPublisher alone, batches of 500, events/s", "%.0f"},
			{"postgres_eps", "PostgreSQL ceiling: claim+mark by hand, batch 500, 1 worker, asynchronous commit (as the relay), events/s", "%.0f"},
			{"postgres_sync_eps", "PostgreSQL claim+mark, batch 500, 1 worker, synchronous commit, events/s", "%.0f"},
			{"postgres_x4_eps", "PostgreSQL claim+mark, batch 500, 4 workers, events/s", "%.0f"},
			{"postgres_b50_eps", "PostgreSQL claim+mark, batch 50, 1 worker, events/s", "%.0f"},
			{"relay_nopublish_default_eps", "relay (defaults) with a no-op publisher, events/s", "%.0f"},
			{"relay_nopublish_eps", "relay (batch 500) with a no-op publisher, events/s", "%.0f"},
			{"relay_of_producer", "fxoutbox default / producer ceiling", "%.3f"},
			{"relay_of_postgres", "fxoutbox default / PostgreSQL ceiling", "%.3f"},
			{"b500_x1_of_postgres", "fxoutbox batch 500, 1 relay / PostgreSQL ceiling", "%.3f"},
			{"b500_x4_of_postgres", "fxoutbox batch 500, 4 relays / PostgreSQL ceiling (1 worker)", "%.3f"},
			{"b500_x4_of_postgres_x4", "fxoutbox batch 500, 4 relays / PostgreSQL with 4 workers", "%.3f"},
			{"best_relay_of_producer", "best fxoutbox config / producer ceiling", "%.3f"},
		}
		for _, x := range rows {
			if v, ok := l[x.k]; ok && v != 0 {
				fmt.Fprintf(w, "| %s | "+x.f+" |\n", x.label, v)
			}
		}
		fmt.Fprintln(w)
	}
	if lt := r.Latency; lt != nil {
		p := r.Params
		fmt.Fprintf(w, "### 2. Steady latency, commit to consumer (%d writers, %.0f s per run, median of %d rounds)\n\n", p.LatWriters, p.LatDurS, p.LatRounds)
		fmt.Fprintf(w, "| contender | offered/s | achieved/s | p50 ms | p99 ms | p99.9 ms | setup |\n|---|---:|---:|---:|---:|---:|---|\n")
		for _, s := range lt.Series {
			sat, short := "", ""
			if s.Saturated {
				sat = " (fell behind)"
			}
			if s.Short {
				short = "\u2020"
			}
			fmt.Fprintf(w, "| %s%s | %d | %.0f%s | %.1f | %.1f | %.1f | %s |\n", s.Contender, sat, s.Rate, s.Achieved, short, s.P50, s.P99, s.P999, s.Desc)
		}
		fmt.Fprintf(w, "\n\u2020 the writers committed under 90%% of the offered rate on this machine. \"fell behind\": events were still unpublished more than 1 s after the last commit (its percentiles cover what arrived within the grace period).\n\n")
	}
	if wr := r.Write; wr != nil {
		p := r.Params
		fmt.Fprintf(w, "### 3. Write overhead (%.0f s closed loop per run, median of %d rounds)\n\n", p.WriteDurS, p.WriteRounds)
		fmt.Fprintf(w, "| variant | writers | tx/s | p50 ms | p99 ms | what |\n|---|---:|---:|---:|---:|---|\n")
		for _, s := range wr.Series {
			fmt.Fprintf(w, "| %s | %d | %.0f | %.2f | %.2f | %s |\n", s.Variant, s.Writers, s.TPS, s.P50, s.P99, s.Desc)
		}
		fmt.Fprintln(w)
	}
	if len(r.Profile) > 0 {
		fmt.Fprintf(w, "### Where the relay's time goes (one relay, RunOnce in a loop, client-side time per step)\n\n")
		fmt.Fprintf(w, "| step |")
		for _, p := range r.Profile {
			fmt.Fprintf(w, " %s: %.0f ev/s |", p.Config, p.EPS)
		}
		fmt.Fprintf(w, "\n|---|")
		for range r.Profile {
			fmt.Fprintf(w, "---:|")
		}
		fmt.Fprintln(w)
		var order []string
		seen := map[string]bool{}
		for _, p := range r.Profile {
			for _, s := range p.Steps {
				if !seen[s.Step] {
					seen[s.Step] = true
					order = append(order, s.Step)
				}
			}
		}
		for _, step := range order {
			fmt.Fprintf(w, "| %s |", step)
			for _, p := range r.Profile {
				cell := " |"
				for _, s := range p.Steps {
					if s.Step == step {
						cell = fmt.Sprintf(" %.0f%% (%.2f ms) |", 100*s.Share, s.AvgMS)
					}
				}
				fmt.Fprint(w, cell)
			}
			fmt.Fprintln(w)
		}
		fmt.Fprintln(w)
	}
	if len(r.Targets) > 0 {
		fmt.Fprintf(w, "### Targets in this run\n\n| target | goal | value | met |\n|---|---|---:|---|\n")
		for _, t := range r.Targets {
			met := "yes"
			if !t.Met {
				met = "**no**: " + t.Gap
			}
			fmt.Fprintf(w, "| %s | %s | %.3g %s | %s |\n", t.Name, t.Goal, t.Value, t.Unit, met)
		}
		fmt.Fprintln(w)
	}
	return nil
}
