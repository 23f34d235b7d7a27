package inbox_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox/inbox"
	"github.com/fxoutbox/outbox/unitofwork"
)

// Records of distinct keys run in parallel up to Concurrency whatever the
// keys hash to: four keys that a hash-to-worker dispatch would put on one
// worker (one at a time) are all in their handlers at once.
func TestDistinctKeysRunInParallelWhateverTheirHash(t *testing.T) {
	t.Parallel()
	const conc = 4
	var keys []string
	for i := 0; len(keys) < conc; i++ {
		k := fmt.Sprintf("key-%d", i)
		h := fnv.New32a()
		h.Write([]byte(k))
		if h.Sum32()%conc == 0 {
			keys = append(keys, k)
		}
	}
	e := newEnv(t, 1)
	var evs []ev
	for _, k := range keys {
		evs = append(evs, ev{Key: k})
	}
	recs := e.produce(evs...)
	var (
		inFlight, most atomic.Int32
		all            = make(chan struct{})
		allOnce        sync.Once
	)
	effect := e.effect("d")
	cfg := e.config(group(), func(ctx context.Context, tx unitofwork.Tx, m *inbox.Message) error {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for {
			if m := most.Load(); n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		if n == conc {
			allOnce.Do(func() { close(all) })
		}
		select { // wait for the others, but not forever: a failure, not a hang
		case <-all:
		case <-time.After(5 * time.Second):
		case <-ctx.Done():
			return ctx.Err()
		}
		return effect(ctx, tx, m)
	})
	cfg.Concurrency = conc
	e.start(cfg)
	e.waitEffects(len(recs))
	e.checkOnce(recs)
	if got := most.Load(); got != conc {
		t.Fatalf("at most %d of %d records of distinct keys were in progress at once, want %d", got, conc, conc)
	}
}

// sqlLog records the statements connections send, alone or in batches.
type sqlLog struct {
	mu      sync.Mutex
	alone   []string
	batches [][]string
}

func (l *sqlLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.alone = append(l.alone, d.SQL)
	return ctx
}
func (l *sqlLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (l *sqlLog) TraceBatchStart(ctx context.Context, c *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	var sqls []string
	for _, q := range d.Batch.QueuedQueries {
		sqls = append(sqls, q.SQL)
	}
	l.batches = append(l.batches, sqls)
	return ctx
}
func (l *sqlLog) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (l *sqlLog) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// The inbox row costs no round trip of its own: it goes to the database in
// one batch with BEGIN, so applying a record with a one-statement handler
// takes three round trips (BEGIN and the inbox row; the handler's INSERT;
// COMMIT), as the same transaction without dedupe does.
func TestInboxRowSharesTheRoundTripOfBegin(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	pc := e.pool.Config()
	log := &sqlLog{}
	pc.ConnConfig.Tracer = log
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	uow, err := unitofwork.New(pool, &unitofwork.Config{Table: e.table})
	if err != nil {
		t.Fatal(err)
	}
	recs := e.produce(events(5, 2)...)
	c, err := inbox.New(pool, uow, e.config(group(), e.effect("r")))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	e.waitEffects(len(recs))
	stop(t, c)
	e.checkOnce(recs)

	log.mu.Lock()
	defer log.mu.Unlock()
	isBegin := func(q string) bool { return strings.HasPrefix(strings.ToLower(q), "begin") }
	isInbox := func(q string) bool {
		return strings.Contains(q, e.inbox.Schema) && strings.Contains(q, "ON CONFLICT DO NOTHING")
	}
	effects, commits := 0, 0
	for _, q := range log.alone {
		switch {
		case isBegin(q), isInbox(q):
			t.Errorf("sent on its own, in a round trip of its own: %q", q)
		case strings.Contains(q, e.effects):
			effects++
		case strings.EqualFold(q, "commit"):
			commits++
		}
	}
	pairs := 0
	for _, b := range log.batches {
		if len(b) == 2 && isBegin(b[0]) && isInbox(b[1]) {
			pairs++
		} else {
			t.Errorf("unexpected batch %q", b)
		}
	}
	if pairs != len(recs) || effects != len(recs) || commits != len(recs) {
		t.Errorf("for %d records: %d batches of BEGIN and the inbox row, %d handler statements, %d commits; want %d of each",
			len(recs), pairs, effects, commits, len(recs))
	}
}
