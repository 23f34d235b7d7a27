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

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/migrations"
)

// Soak is the "soak" section (not in the default run: BENCH_ONLY=soak):
// writers at Rate events/s for DurationS with one cursor relay at its
// defaults but Retention (1 minute), on a cluster of its own with
// autovacuum at its defaults; the size of the outbox table over time and
// the rows the relay deleted. The table is partitioned
// (migrations.Partitioned, one partition a minute), so that retention
// drops partitions; BENCH_SOAK_TABLE=plain soaks the ordinary cursor table
// (retention by DELETE) for comparison, and BENCH_SOAK_PROGRESS=marks the
// marks relay on the ordinary table.
type Soak struct {
	Command      string `json:"command"`
	StartedAt    string `json:"started_at"`
	LoadAvgStart string `json:"loadavg_start"`
	LoadAvgEnd   string `json:"loadavg_end"`
	Note         string `json:"note"`
	Progress     string `json:"progress"`
	// Layout is "partitioned" (PartitionS a partition) or "plain".
	Layout     string  `json:"layout"`
	PartitionS float64 `json:"partition_interval_s,omitempty"`
	Rate       int     `json:"rate_eps"`
	Achieved   float64 `json:"achieved_eps"`
	DurationS  float64 `json:"duration_s"`
	RetentionS float64 `json:"retention_s"`
	Events     int64   `json:"events"`
	Delivered  int64   `json:"delivered"`

	// TableGrowth is the largest size of the table (heap, indexes and
	// TOAST of every partition: pg_total_relation_size summed over
	// pg_partition_tree) over its size at minute 2.
	TableGrowth float64 `json:"table_growth"`
	SizeAt2MinB int64   `json:"size_at_2min_bytes"`
	MaxSizeB    int64   `json:"max_size_bytes"`
	// RelayDeletes counts the rows deleted from the table over the soak,
	// in every partition, dropped ones included: a row trigger on the
	// table (cloned onto each partition) counts them in a sequence.
	RelayDeletes int64 `json:"relay_deletes"`
	// Autovacuums of the table's partitions (of those still there at the
	// end, and of the dropped ones as last sampled).
	Autovacuums int64 `json:"autovacuums"`
	// PartitionsDropped counts the partitions retired over the soak.
	PartitionsDropped int          `json:"partitions_dropped"`
	Samples           []SoakSample `json:"samples"`
}

// SoakSample is one reading of the table during the soak.
type SoakSample struct {
	AtS     float64 `json:"at_s"`
	Bytes   int64   `json:"total_bytes"`
	LiveTup int64   `json:"n_live_tup"`
	DeadTup int64   `json:"n_dead_tup"`
	// Deleted is the rows deleted so far (the trigger's count).
	Deleted int64 `json:"deleted"`
	// Partitions is the number of the table's partitions (1: plain).
	Partitions int `json:"partitions"`
}

// soakTable is the partitioned table of the soak (partitioned layout).
var soakTable = outbox.Table{Schema: schema, Name: "soak_event"}

// soakDeletes is the sequence that counts the rows deleted from the soak's
// table: sequences are not transactional and leave no dead tuples, and the
// trigger runs only on a DELETE, so the inserts' cost is unchanged.
const soakDeletes = schema + ".soak_deletes"

// countDeletes puts the counting trigger on t (a partitioned table's row
// trigger is cloned onto every partition, present and future).
func countDeletes(ctx context.Context, db *pgxpool.Pool, t outbox.Table) error {
	for _, q := range []string{
		"CREATE SEQUENCE " + soakDeletes + " MINVALUE 0 START 0",
		`CREATE FUNCTION ` + schema + `.soak_count_delete() RETURNS trigger LANGUAGE plpgsql AS
			$$BEGIN PERFORM nextval('` + soakDeletes + `'); RETURN NULL; END$$`,
		"CREATE TRIGGER soak_count_delete AFTER DELETE ON " + ident(t) + " FOR EACH ROW EXECUTE FUNCTION " + schema + ".soak_count_delete()",
	} {
		if _, err := db.Exec(ctx, q); err != nil {
			return fmt.Errorf("soak: count deletes: %s: %w", firstLine(q), err)
		}
	}
	return nil
}

// soakLeaves selects (relid) the tables that hold the rows of table $1:
// its partitions, or the table itself when it is not partitioned
// (pg_partition_tree then returns nothing).
const soakLeaves = "(SELECT relid FROM pg_partition_tree($1::regclass) WHERE isleaf" +
	" UNION ALL SELECT $1::regclass WHERE NOT EXISTS (SELECT FROM pg_partition_tree($1::regclass)))"

// soakStats is one reading of the table's partitions (the table itself
// when it is not partitioned): their total size, tuples, deletes counted
// and autovacuums by partition.
func soakStats(ctx context.Context, db *pgxpool.Pool, t outbox.Table, s *SoakSample, av map[string]int64) error {
	rows, err := db.Query(ctx, `SELECT p.relid::regclass::text, pg_total_relation_size(p.relid),
			coalesce(st.n_live_tup, 0), coalesce(st.n_dead_tup, 0), coalesce(st.autovacuum_count, 0)
		FROM `+soakLeaves+` AS p LEFT JOIN pg_stat_user_tables AS st ON st.relid = p.relid`, ident(t))
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var size, live, dead, avc int64
		if err := rows.Scan(&name, &size, &live, &dead, &avc); err != nil {
			return err
		}
		s.Bytes += size
		s.LiveTup += live
		s.DeadTup += dead
		s.Partitions++
		av[name] = max(av[name], avc)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	return db.QueryRow(ctx, "SELECT CASE WHEN is_called THEN last_value + 1 ELSE 0 END FROM "+soakDeletes).Scan(&s.Deleted)
}

func runSoak(ctx context.Context, e *env) (*Soak, error) {
	res := &Soak{StartedAt: time.Now().UTC().Format(time.RFC3339), LoadAvgStart: loadavg(), Progress: "cursor", Rate: 2000,
		DurationS: 600, RetentionS: 60, Layout: "partitioned", PartitionS: 60, Command: "cd bench && BENCH_ONLY=soak go run ."}
	if s := os.Getenv("BENCH_SOAK_PROGRESS"); s != "" {
		res.Progress = s // marks: the same soak with the marks relay (mode poll)
	}
	if s := os.Getenv("BENCH_SOAK_TABLE"); s != "" {
		if s != "plain" && s != "partitioned" {
			return nil, fmt.Errorf("BENCH_SOAK_TABLE=%q: want partitioned (the default) or plain (the ordinary cursor table, retention by DELETE)", s)
		}
		res.Layout = s
	}
	if res.Progress == "marks" {
		res.Layout = "plain" // a marks relay refuses a partitioned table
	}
	if res.Layout == "plain" {
		res.PartitionS = 0
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
	var more []string
	if res.Layout == "partitioned" {
		// A partition a minute: rows live between Retention and Retention
		// plus one interval (docs/partitions.md, "The interval").
		table = soakTable
		if err := migrations.Partitioned.WithInterval(time.Duration(res.PartitionS)*time.Second).Up(ctx, c.e.pool, table); err != nil {
			return nil, fmt.Errorf("soak: create the partitioned table: %w", err)
		}
		more = append(more, "FXBENCH_TABLE="+table.Name)
	} else if err := c.e.truncate(ctx, table); err != nil { // start empty: the size at minute 2 is two minutes of writes
		return nil, err
	}
	if err := countDeletes(ctx, c.e.pool, table); err != nil {
		return nil, err
	}
	r, err := c.startRelay(ctx, mode, warm, "", append(more, fmt.Sprintf("FXBENCH_RETENTION=%gs", res.RetentionS))...)
	if err != nil {
		return nil, err
	}
	w, err := e.startWriterProc(ctx, c.url, topic, "FXBENCH_TABLE="+table.Name)
	if err != nil {
		_ = r.stop(ctx)
		return nil, err
	}
	av := map[string]int64{} // autovacuums by partition, dropped ones as last seen
	var avMu sync.Mutex
	sample := func(at time.Duration) (SoakSample, error) {
		s := SoakSample{AtS: round1(at.Seconds())}
		avMu.Lock()
		defer avMu.Unlock()
		return s, soakStats(ctx, c.e.pool, table, &s, av)
	}
	var av0 int64
	if _, err := sample(0); err != nil {
		return nil, err
	}
	for _, n := range av {
		av0 += n
	}
	var partitions0 []string
	if err := c.e.pool.QueryRow(ctx, "SELECT array_agg(relid::regclass::text) FROM "+soakLeaves+" AS p", ident(table)).Scan(&partitions0); err != nil {
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
				log.Printf("soak: %4.0f s  %7.1f MB in %2d partitions  live %8d  dead %8d  deleted %8d", s.AtS, float64(s.Bytes)/1e6, s.Partitions, s.LiveTup, s.DeadTup, s.Deleted)
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
	if _, err := c.e.pool.Exec(ctx, "SELECT pg_stat_clear_snapshot()"); err != nil {
		return nil, err
	}
	end, err := sample(time.Since(t0))
	if err != nil {
		return nil, err
	}
	res.RelayDeletes = end.Deleted
	for _, n := range av {
		res.Autovacuums += n
	}
	res.Autovacuums -= av0
	// Partitions made at the start, or by the relay, and gone at the end.
	made := map[string]bool{}
	for _, p := range partitions0 {
		made[p] = true
	}
	for p := range av {
		made[p] = true
	}
	var left []string
	if err := c.e.pool.QueryRow(ctx, "SELECT array_agg(relid::regclass::text) FROM "+soakLeaves+" AS p", ident(table)).Scan(&left); err != nil {
		return nil, err
	}
	for _, p := range left {
		delete(made, p)
	}
	res.PartitionsDropped = len(made)
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
	layout := "the ordinary cursor table (migrations.Outbox.Up + Cursor.Up), emptied: retention is Cleanup's DELETE (CleanupBatch 1000, repeated while full)"
	if res.Layout == "partitioned" {
		layout = fmt.Sprintf("a table made by migrations.Partitioned with one partition per %.0f s (the previous, the current and 7 ahead at the start): retention is the relay's partition upkeep (partitions made ahead, retired ones detached and dropped)", res.PartitionS)
	}
	res.Note = fmt.Sprintf("A throwaway cluster started by scripts/pg.sh (wal_level=logical), autovacuum at its defaults. Table: %s. The %s relay (%s progress, fxoutbox defaults but Retention %.0f s: CleanupInterval 1 min; Listen) in a process of its own; %d writers in another, one event per transaction at %d/s for %.0f s, into an empty table. "+
		"Size: pg_total_relation_size summed over pg_partition_tree (every partition's heap, indexes and TOAST; the table's own when it is not partitioned) every 10 s; table_growth = the largest / the first sample at or after 120 s. relay_deletes: rows deleted from the table or any of its partitions (dropped ones included) over the soak, counted by an AFTER DELETE row trigger into a sequence (nothing else deletes from it), read after the relay process exited.",
		layout, mode, res.Progress, res.RetentionS, e.p.LatWriters, res.Rate, res.DurationS)
	return res, nil
}

// printSoak prints the section's report.
func printSoak(w io.Writer, x *Soak, line string) {
	if x == nil {
		return
	}
	fmt.Fprintf(w, "%s\nSOAK  (%s progress, %s table, %d/s for %.0f s, Retention %.0f s; load %s -> %s)\n", line, x.Progress, x.Layout, x.Rate, x.DurationS, x.RetentionS, x.LoadAvgStart, x.LoadAvgEnd)
	fmt.Fprintf(w, "   events %d (%.0f/s), delivered %d; table %.1f MB at 2 min, at most %.1f MB: growth %.2fx; rows the relay deleted %d; partitions dropped %d; autovacuums %d\n",
		x.Events, x.Achieved, x.Delivered, float64(x.SizeAt2MinB)/1e6, float64(x.MaxSizeB)/1e6, x.TableGrowth, x.RelayDeletes, x.PartitionsDropped, x.Autovacuums)
}
