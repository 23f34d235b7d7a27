package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"strconv"
	"sync"
	"time"
)

// Soak is the "soak" section (not in the default run: BENCH_ONLY=soak):
// writers at Rate events/s for DurationS with one cursor relay at its
// defaults but Retention (1 minute), on a cluster of its own with
// autovacuum at its defaults; the size of the outbox table over time and
// the rows the relay deleted.
type Soak struct {
	Command      string  `json:"command"`
	StartedAt    string  `json:"started_at"`
	LoadAvgStart string  `json:"loadavg_start"`
	LoadAvgEnd   string  `json:"loadavg_end"`
	Note         string  `json:"note"`
	Progress     string  `json:"progress"`
	Rate         int     `json:"rate_eps"`
	Achieved     float64 `json:"achieved_eps"`
	DurationS    float64 `json:"duration_s"`
	RetentionS   float64 `json:"retention_s"`
	Events       int64   `json:"events"`
	Delivered    int64   `json:"delivered"`

	// TableGrowth is the largest size of the table (heap, indexes and
	// TOAST: pg_total_relation_size) over its size at minute 2.
	TableGrowth  float64      `json:"table_growth"`
	SizeAt2MinB  int64        `json:"size_at_2min_bytes"`
	MaxSizeB     int64        `json:"max_size_bytes"`
	RelayDeletes int64        `json:"relay_deletes"`
	Autovacuums  int64        `json:"autovacuums"`
	Samples      []SoakSample `json:"samples"`
}

// SoakSample is one reading of the table during the soak.
type SoakSample struct {
	AtS     float64 `json:"at_s"`
	Bytes   int64   `json:"total_bytes"`
	LiveTup int64   `json:"n_live_tup"`
	DeadTup int64   `json:"n_dead_tup"`
	Deleted int64   `json:"n_tup_del"`
}

func runSoak(ctx context.Context, e *env) (*Soak, error) {
	res := &Soak{StartedAt: time.Now().UTC().Format(time.RFC3339), LoadAvgStart: loadavg(), Progress: "cursor", Rate: 2000,
		DurationS: 600, RetentionS: 60, Command: "cd bench && BENCH_ONLY=soak go run ."}
	if s := os.Getenv("BENCH_SOAK_PROGRESS"); s != "" {
		res.Progress = s // marks: the same soak with the marks relay (mode poll)
	}
	if n, err := strconv.Atoi(os.Getenv("BENCH_SOAK_S")); err == nil && n > 0 {
		res.DurationS = float64(n) // a shorter soak, while developing: not the figure
	}
	if n, err := strconv.Atoi(os.Getenv("BENCH_SOAK_RATE")); err == nil && n > 0 {
		res.Rate = n
	}
	mode := "cursor"
	if res.Progress == "marks" {
		mode = "poll"
	}
	warm, err := e.newTopic("soakwarm")
	if err != nil {
		return nil, err
	}
	defer e.dropTopic(warm)
	topic, err := e.newTopic("soak")
	if err != nil {
		return nil, err
	}
	defer e.dropTopic(topic)
	c, err := e.startCluster(ctx, "soak", "logical")
	if err != nil {
		return nil, fmt.Errorf("start the soak cluster: %w", err)
	}
	defer c.stop()
	table := c.e.tableOf(mode)
	// Start empty: the size at minute 2 is two minutes of writes.
	if err := c.e.truncate(ctx, table); err != nil {
		return nil, err
	}
	r, err := c.startRelay(ctx, mode, warm, "", fmt.Sprintf("FXBENCH_RETENTION=%gs", res.RetentionS))
	if err != nil {
		return nil, err
	}
	w, err := e.startWriterProc(ctx, c.url, topic, "FXBENCH_TABLE="+table.Name)
	if err != nil {
		_ = r.stop(ctx)
		return nil, err
	}
	sample := func(at time.Duration) (SoakSample, error) {
		s := SoakSample{AtS: round1(at.Seconds())}
		err := c.e.pool.QueryRow(ctx, `SELECT pg_total_relation_size($1::regclass), n_live_tup, n_dead_tup, n_tup_del
			FROM pg_stat_user_tables WHERE relid = $1::regclass`, ident(table)).Scan(&s.Bytes, &s.LiveTup, &s.DeadTup, &s.Deleted)
		return s, err
	}
	var del0, av0 int64
	if err := c.e.pool.QueryRow(ctx, "SELECT n_tup_del, autovacuum_count FROM pg_stat_user_tables WHERE relid = $1::regclass", ident(table)).Scan(&del0, &av0); err != nil {
		return nil, err
	}
	t0 := time.Now()
	var mu sync.Mutex
	sctx, stopSampling := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(10 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-t.C:
			}
			s, err := sample(time.Since(t0))
			if err != nil {
				log.Printf("soak: sample: %v", err)
				continue
			}
			mu.Lock()
			res.Samples = append(res.Samples, s)
			mu.Unlock()
			if int(s.AtS)%60 < 10 {
				log.Printf("soak: %4.0f s  %7.1f MB  live %8d  dead %8d  deleted %8d", s.AtS, float64(s.Bytes)/1e6, s.LiveTup, s.DeadTup, s.Deleted-del0)
			}
		}
	}()
	wr, werr := w.run(res.Rate, time.Duration(res.DurationS*float64(time.Second)), 1, e.p.LatWriters, false)
	stopSampling()
	wg.Wait()
	res.Events, res.Achieved = wr.events, round1(wr.achieved)
	if werr == nil {
		// Let the relay deliver the tail.
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			if n, err := e.topicCount(topic); err == nil && n >= wr.events {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	_ = w.stop()
	rerr := r.stop(ctx)
	if werr != nil {
		return nil, werr
	}
	if rerr != nil {
		return nil, rerr
	}
	if res.Delivered, err = e.topicCount(topic); err != nil {
		return nil, err
	}
	// The relay's backends flushed their statistics when they exited.
	var del1, av1 int64
	if _, err := c.e.pool.Exec(ctx, "SELECT pg_stat_clear_snapshot()"); err != nil {
		return nil, err
	}
	if err := c.e.pool.QueryRow(ctx, "SELECT n_tup_del, autovacuum_count FROM pg_stat_user_tables WHERE relid = $1::regclass", ident(table)).Scan(&del1, &av1); err != nil {
		return nil, err
	}
	res.RelayDeletes, res.Autovacuums = del1-del0, av1-av0
	for _, s := range res.Samples {
		if res.SizeAt2MinB == 0 && s.AtS >= 120 {
			res.SizeAt2MinB = s.Bytes
		}
		res.MaxSizeB = max(res.MaxSizeB, s.Bytes)
	}
	if res.SizeAt2MinB > 0 {
		res.TableGrowth = round2(float64(res.MaxSizeB) / float64(res.SizeAt2MinB))
	}
	res.LoadAvgEnd = loadavg()
	res.Note = fmt.Sprintf("A throwaway cluster started by scripts/pg.sh (wal_level=logical), autovacuum at its defaults. The %s relay (%s progress, fxoutbox defaults but Retention %.0f s: CleanupInterval 1 min, CleanupBatch 1000, repeated while full; Listen) in a process of its own; %d writers in another, one event per transaction at %d/s for %.0f s, into an empty table. "+
		"Size: pg_total_relation_size of the table every 10 s; table_growth = the largest / the first sample at or after 120 s. relay_deletes: n_tup_del of the table over the soak (nothing else deletes from it), read after the relay process exited.",
		mode, res.Progress, res.RetentionS, e.p.LatWriters, res.Rate, res.DurationS)
	return res, nil
}

// printSoak prints the section's report.
func printSoak(w io.Writer, x *Soak, line string) {
	if x == nil {
		return
	}
	fmt.Fprintf(w, "%s\nSOAK  (%s progress, %d/s for %.0f s, Retention %.0f s; load %s -> %s)\n", line, x.Progress, x.Rate, x.DurationS, x.RetentionS, x.LoadAvgStart, x.LoadAvgEnd)
	fmt.Fprintf(w, "   events %d (%.0f/s), delivered %d; table %.1f MB at 2 min, at most %.1f MB: growth %.2fx; rows the relay deleted %d; autovacuums %d\n",
		x.Events, x.Achieved, x.Delivered, float64(x.SizeAt2MinB)/1e6, float64(x.MaxSizeB)/1e6, x.TableGrowth, x.RelayDeletes, x.Autovacuums)
}
