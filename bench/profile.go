package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox/relay"
)

// Profile splits one relay's drain time into its steps: each SQL statement
// (round trip, as the client sees it) and the publish call. It answers
// "where the time goes" for the drain figures. BENCH_ONLY=profile runs it.
type Profile struct {
	Config   string         `json:"config"`
	EPS      float64        `json:"eps"`
	Batches  int            `json:"batches"`
	WallS    float64        `json:"wall_s"`
	Steps    []ProfileStep  `json:"steps"`
	PerBatch map[string]any `json:"per_batch_ms"`
}

// ProfileStep is one kind of statement or the publish call.
type ProfileStep struct {
	Step    string  `json:"step"`
	Calls   int     `json:"calls"`
	TotalS  float64 `json:"total_s"`
	Share   float64 `json:"share"`
	AvgMS   float64 `json:"avg_ms"`
	PerCall string  `json:"-"`
}

type stepTracer struct {
	mu    sync.Mutex
	start map[*pgx.Conn]time.Time
	sql   map[*pgx.Conn]string
	total map[string]time.Duration
	calls map[string]int
}

func newStepTracer() *stepTracer {
	return &stepTracer{start: map[*pgx.Conn]time.Time{}, sql: map[*pgx.Conn]string{}, total: map[string]time.Duration{}, calls: map[string]int{}}
}

func stepName(sql string) string {
	s := strings.ToLower(strings.TrimSpace(sql))
	switch {
	case s == "begin" || strings.HasPrefix(s, "begin "):
		return "BEGIN"
	case s == "commit":
		return "COMMIT"
	case s == "rollback":
		return "ROLLBACK"
	case strings.Contains(s, "set_config"):
		return "set_config (transaction bound)"
	case strings.Contains(s, "pg_try_advisory_xact_lock"):
		return "lock lanes (advisory locks)"
	case strings.Contains(s, "group by lane"):
		return "find lanes (window query)"
	case strings.HasPrefix(s, "select") && strings.Contains(s, "for update skip locked"):
		return "claim rows (SKIP LOCKED)"
	case strings.HasPrefix(s, "select") && strings.Contains(s, "any("):
		return "read locked lanes' rows"
	case strings.HasPrefix(s, "update"):
		return "mark published (UPDATE)"
	case strings.HasPrefix(s, "delete"):
		return "cleanup (DELETE)"
	}
	if len(s) > 40 {
		s = s[:40]
	}
	return s
}

func (t *stepTracer) TraceQueryStart(ctx context.Context, c *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	t.mu.Lock()
	t.start[c], t.sql[c] = time.Now(), d.SQL
	t.mu.Unlock()
	return ctx
}

func (t *stepTracer) TraceQueryEnd(ctx context.Context, c *pgx.Conn, _ pgx.TraceQueryEndData) {
	t.mu.Lock()
	defer t.mu.Unlock()
	name := stepName(t.sql[c])
	t.total[name] += time.Since(t.start[c])
	t.calls[name]++
}

// Batches sent with SendBatch: the relay's bound+claim may be pipelined.
func (t *stepTracer) TraceBatchStart(ctx context.Context, c *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	t.mu.Lock()
	t.start[c] = time.Now()
	t.mu.Unlock()
	return ctx
}
func (t *stepTracer) TraceBatchQuery(ctx context.Context, c *pgx.Conn, d pgx.TraceBatchQueryData) {
	t.mu.Lock()
	t.sql[c] = d.SQL
	t.mu.Unlock()
}
func (t *stepTracer) TraceBatchEnd(ctx context.Context, c *pgx.Conn, _ pgx.TraceBatchEndData) {
	t.mu.Lock()
	defer t.mu.Unlock()
	name := "pipelined: " + stepName(t.sql[c])
	t.total[name] += time.Since(t.start[c])
	t.calls[name]++
}

func runProfile(ctx context.Context, e *env, w io.Writer) ([]Profile, error) {
	var out []Profile
	for _, v := range []struct {
		name string
		cfg  relay.Config
	}{
		{"batch 50 (the default claim when keeping up), per-key lanes", relay.Config{}},
		{"batch 500, per-key lanes", relay.Config{BatchSize: 500}},
		{"batch 50, unordered", relay.Config{Ordering: relay.Unordered}},
		{"batch 500, unordered", relay.Config{BatchSize: 500, Ordering: relay.Unordered}},
	} {
		p, err := e.profileRelay(ctx, v.name, v.cfg)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
		fmt.Fprintf(w, "\nrelay %s: %.0f events/s, %d batches in %.2f s\n", p.Config, p.EPS, p.Batches, p.WallS)
		for _, s := range p.Steps {
			fmt.Fprintf(w, "   %-36s %6d calls %8.3f ms avg %6.1f%%\n", s.Step, s.Calls, s.AvgMS, 100*s.Share)
		}
	}
	return out, nil
}

func (e *env) profileRelay(ctx context.Context, name string, cfg relay.Config) (Profile, error) {
	n := e.p.Backlog
	topic, err := e.newTopic("profile")
	if err != nil {
		return Profile{}, err
	}
	defer e.dropTopic(topic)
	if err := e.preloadOutbox(ctx, topic, n); err != nil {
		return Profile{}, err
	}
	tr := newStepTracer()
	pc := e.pool.Config()
	pc.ConnConfig.Tracer = tr
	pc.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return Profile{}, err
	}
	defer pool.Close()
	sp, err := relay.NewSaramaPublisher(e.brokers, producerConfig("fxoutbox"))
	if err != nil {
		return Profile{}, err
	}
	defer sp.Close()
	if err := sp.Publish(ctx, []relay.Message{{Topic: topic, Key: []byte("warm"), Value: []byte(`{}`)}}); err != nil {
		return Profile{}, err
	}
	var pubTotal time.Duration
	var pubCalls int
	pub := relay.PublisherFunc(func(ctx context.Context, msgs []relay.Message) error {
		t := time.Now()
		err := sp.Publish(ctx, msgs)
		pubTotal += time.Since(t)
		pubCalls++
		return err
	})
	cfg.Table = e.table
	r, err := relay.New(pool, pub, &cfg)
	if err != nil {
		return Profile{}, err
	}
	// Reset what the warm-up and pool start recorded.
	tr.mu.Lock()
	tr.total, tr.calls = map[string]time.Duration{}, map[string]int{}
	tr.mu.Unlock()
	t0 := time.Now()
	done, batches := 0, 0
	for done < n {
		k, err := r.RunOnce(ctx)
		if err != nil {
			return Profile{}, err
		}
		if k == 0 {
			break
		}
		done += k
		batches++
	}
	wall := time.Since(t0)
	p := Profile{Config: name, EPS: round1(float64(done) / wall.Seconds()), Batches: batches, WallS: round3(wall.Seconds()), PerBatch: map[string]any{}}
	tr.mu.Lock()
	steps := map[string]time.Duration{"publish (Kafka, acks=all)": pubTotal}
	calls := map[string]int{"publish (Kafka, acks=all)": pubCalls}
	for k, v := range tr.total {
		steps[k], calls[k] = v, tr.calls[k]
	}
	tr.mu.Unlock()
	var accounted time.Duration
	for k, v := range steps {
		accounted += v
		p.Steps = append(p.Steps, ProfileStep{Step: k, Calls: calls[k], TotalS: round3(v.Seconds()), Share: round3(v.Seconds() / wall.Seconds()),
			AvgMS: round3(float64(v) / float64(max(1, calls[k])) / float64(time.Millisecond))})
	}
	other := wall - accounted
	p.Steps = append(p.Steps, ProfileStep{Step: "in Go between calls (rows, spans, messages)", Calls: batches, TotalS: round3(other.Seconds()),
		Share: round3(other.Seconds() / wall.Seconds()), AvgMS: round3(float64(other) / float64(max(1, batches)) / float64(time.Millisecond))})
	slices.SortFunc(p.Steps, func(a, b ProfileStep) int { return int((b.TotalS - a.TotalS) * 1e6) })
	for _, s := range p.Steps {
		p.PerBatch[s.Step] = round3(s.TotalS * 1000 / float64(max(1, batches)))
	}
	log.Printf("profile %s: %.0f events/s", name, p.EPS)
	return p, nil
}
