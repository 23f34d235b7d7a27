package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/unitofwork"
)

// WriteRun is one variant at one writer count in one round.
type WriteRun struct {
	TPS float64 `json:"tps"`
	P50 float64 `json:"p50_ms"`
	P99 float64 `json:"p99_ms"`
	N   int     `json:"txns"`
}

// WriteSeries is the median over rounds.
type WriteSeries struct {
	Variant string     `json:"variant"`
	Desc    string     `json:"desc"`
	Writers int        `json:"writers"`
	Kind    string     `json:"kind"`
	TPS     float64    `json:"tps"`
	P50     float64    `json:"p50_ms"`
	P99     float64    `json:"p99_ms"`
	Rounds  []WriteRun `json:"rounds"`
}

func (s *WriteSeries) series() []float64 {
	out := make([]float64, len(s.Rounds))
	for i, r := range s.Rounds {
		out[i] = r.TPS
	}
	return out
}

// Write is section 3. The top-level figures are at 16 writers.
type Write struct {
	PlainTPS        float64            `json:"plain_tps"`
	Outbox0TPS      float64            `json:"outbox0_tps"`
	RawInsertTPS    float64            `json:"rawinsert_tps"`
	Outbox1TPS      float64            `json:"outbox1_tps"`
	RawInsert10     float64            `json:"rawinsert10_tps"`
	Outbox10TPS     float64            `json:"outbox10_tps"`
	NotifyTPS       float64            `json:"notify_tps"`
	NotifierTPS     float64            `json:"outbox1_notifier_tps"`
	NotifierVsOut1  float64            `json:"notifier_vs_outbox1"`
	Outbox1VsRaw    float64            `json:"outbox1_vs_rawinsert"`
	Outbox1VsPlain  float64            `json:"outbox1_vs_plain"`
	RawVsPlain      float64            `json:"rawinsert_vs_plain"`
	Outbox10VsRaw   float64            `json:"outbox10_vs_rawinsert10"`
	Outbox0VsPlain  float64            `json:"outbox0_vs_plain"`
	NotifyVsOutbox1 float64            `json:"notify_vs_outbox1"`
	Outbox1VsRaw1W  float64            `json:"outbox1_vs_rawinsert_1_writer"`
	Diagnostics     map[string]float64 `json:"diagnostics"`
	Note            string             `json:"note"`
	Series          []*WriteSeries     `json:"series"`
}

type writeVariant struct {
	name, desc, kind string
	txn              func(ctx context.Context, seq int) error
	writers          []int // nil: every writer count
}

const insertOrder = "INSERT INTO " + schema + ".orders (id, customer_id, total_cents, status) VALUES ($1, $2, $3, 'new')"

func runWrite(ctx context.Context, e *env) (*Write, error) {
	p := e.p
	topic := "order-service.order.created" // rows are never published here; no Kafka topic is needed
	uow, err := unitofwork.New(e.pool, &unitofwork.Config{Table: e.table})
	if err != nil {
		return nil, err
	}
	// fxoutbox's default write path also wakes relays in other processes:
	// a coalesced NOTIFY after the commit (at most one per 5 ms).
	notifier, err := unitofwork.NewNotifier(e.pool, e.table, 0, nil)
	if err != nil {
		return nil, err
	}
	defer notifier.Close()
	uowN, err := unitofwork.New(e.pool, &unitofwork.Config{Table: e.table, OnCommit: notifier.OnCommit})
	if err != nil {
		return nil, err
	}
	cols := "(event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, headers)"
	rawOne := func(table string) string {
		return "INSERT INTO " + table + " " + cols + " VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
	}
	var rawTen strings.Builder
	rawTen.WriteString("INSERT INTO " + ident(e.table) + " " + cols + " VALUES ")
	for i := range 10 {
		if i > 0 {
			rawTen.WriteString(", ")
		}
		b := i * 8
		fmt.Fprintf(&rawTen, "($%d, $%d, $%d, $%d, $%d, $%d, $%d, $%d)", b+1, b+2, b+3, b+4, b+5, b+6, b+7, b+8)
	}
	business := func(ctx context.Context, tx pgx.Tx, key int) error {
		id, _ := uuid.NewV7()
		_, err := tx.Exec(ctx, insertOrder, id.String(), fmt.Sprintf("customer-%d", key), int64(1000+key))
		return err
	}
	businessU := func(ctx context.Context, tx unitofwork.Tx, key int) error {
		id, _ := uuid.NewV7()
		_, err := tx.Exec(ctx, insertOrder, id.String(), fmt.Sprintf("customer-%d", key), int64(1000+key))
		return err
	}
	event := func(key, seq int) outbox.Event {
		return outbox.Event{AggregateType: aggregateType, AggregateID: orderID(key), Type: eventType, Topic: topic,
			Payload: json.RawMessage(payload(key, seq))}
	}
	// rawArgs are the values the unit of work would write for event(key, seq).
	rawArgs := func(key, seq int, body []byte) []any {
		id, _ := uuid.NewV7()
		return []any{id, aggregateType, orderID(key), eventType, body, topic, orderID(key), nil}
	}
	small := []byte(`{"seq": "0000001"}`)
	vs := []writeVariant{
		{name: "plain", kind: "variant", desc: "business transaction alone (pgx: BEGIN, INSERT order, COMMIT)",
			txn: func(ctx context.Context, seq int) error {
				return pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error { return business(ctx, tx, randKey(p.Keys)) })
			}},
		{name: "outbox0", kind: "variant", desc: "the same through unitofwork.Do, no event",
			txn: func(ctx context.Context, seq int) error {
				return uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error { return businessU(ctx, tx, randKey(p.Keys)) })
			}},
		{name: "rawinsert", kind: "variant", desc: "business transaction + hand-written INSERT of the same outbox row",
			txn: func(ctx context.Context, seq int) error {
				k := randKey(p.Keys)
				return pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
					if err := business(ctx, tx, k); err != nil {
						return err
					}
					_, err := tx.Exec(ctx, rawOne(ident(e.table)), rawArgs(k, seq, payload(k, seq))...)
					return err
				})
			}},
		{name: "outbox1", kind: "variant", desc: "business transaction + 1 event: unitofwork.Do + tx.Add",
			txn: func(ctx context.Context, seq int) error {
				k := randKey(p.Keys)
				return uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
					if err := businessU(ctx, tx, k); err != nil {
						return err
					}
					return tx.Add(ctx, event(k, seq))
				})
			}},
		{name: "outbox1+notifier", kind: "variant", desc: "outbox1 with unitofwork.Notifier as OnCommit (fxoutbox.Module's default: coalesced NOTIFY after commit)",
			txn: func(ctx context.Context, seq int) error {
				k := randKey(p.Keys)
				return uowN.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
					if err := businessU(ctx, tx, k); err != nil {
						return err
					}
					return tx.Add(ctx, event(k, seq))
				})
			}},
		{name: "rawinsert10", kind: "variant", desc: "business transaction + hand-written 10-row INSERT",
			txn: func(ctx context.Context, seq int) error {
				k := randKey(p.Keys)
				args := make([]any, 0, 80)
				for i := range 10 {
					args = append(args, rawArgs(k, seq+i, payload(k, seq+i))...)
				}
				return pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
					if err := business(ctx, tx, k); err != nil {
						return err
					}
					_, err := tx.Exec(ctx, rawTen.String(), args...)
					return err
				})
			}},
		{name: "outbox10", kind: "variant", desc: "business transaction + 10 events: unitofwork.Do + tx.Add",
			txn: func(ctx context.Context, seq int) error {
				k := randKey(p.Keys)
				evs := make([]outbox.Event, 10)
				for i := range evs {
					evs[i] = event(k, seq+i)
				}
				return uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
					if err := businessU(ctx, tx, k); err != nil {
						return err
					}
					return tx.Add(ctx, evs...)
				})
			}},
		{name: "outbox1+notify", kind: "variant", desc: "outbox1 plus SELECT pg_notify(...) in the same transaction (NOTIFY on every commit)",
			txn: func(ctx context.Context, seq int) error {
				k := randKey(p.Keys)
				return uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
					if err := businessU(ctx, tx, k); err != nil {
						return err
					}
					if _, err := tx.Exec(ctx, "SELECT pg_notify('fxbench_outbox', '')"); err != nil {
						return err
					}
					return tx.Add(ctx, event(k, seq))
				})
			}},
		{name: "rawinsert no-index", kind: "diagnostic", writers: []int{16}, desc: "rawinsert into a copy of the table with only its primary key (no event_id unique index, no partial index)",
			txn: func(ctx context.Context, seq int) error {
				k := randKey(p.Keys)
				return pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
					if err := business(ctx, tx, k); err != nil {
						return err
					}
					_, err := tx.Exec(ctx, rawOne(schema+".outbox_noidx"), rawArgs(k, seq, payload(k, seq))...)
					return err
				})
			}},
		{name: "rawinsert small-row", kind: "diagnostic", writers: []int{16}, desc: "rawinsert with an 18-byte payload instead of 256 bytes",
			txn: func(ctx context.Context, seq int) error {
				k := randKey(p.Keys)
				return pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
					if err := business(ctx, tx, k); err != nil {
						return err
					}
					_, err := tx.Exec(ctx, rawOne(ident(e.table)), rawArgs(k, seq, small)...)
					return err
				})
			}},
		{name: "rawinsert pipelined", kind: "diagnostic", writers: []int{16}, desc: "rawinsert with the business INSERT and the outbox INSERT sent in one round trip (pgx.Batch)",
			txn: func(ctx context.Context, seq int) error {
				k := randKey(p.Keys)
				return pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
					id, _ := uuid.NewV7()
					b := &pgx.Batch{}
					b.Queue(insertOrder, id.String(), fmt.Sprintf("customer-%d", k), int64(1000+k))
					b.Queue(rawOne(ident(e.table)), rawArgs(k, seq, payload(k, seq))...)
					return tx.SendBatch(ctx, b).Close()
				})
			}},
	}
	series := map[string]*WriteSeries{}
	var order []*WriteSeries
	for r := range p.WriteRounds {
		for _, w := range p.WriteWriters {
			// Each round starts one variant later, so that no variant
			// always runs right after the same other one.
			for i := range vs {
				v := vs[(i+r)%len(vs)]
				if v.writers != nil && !slices.Contains(v.writers, w) || v.kind == "diagnostic" && !p.Diagnostics {
					continue
				}
				if err := ctx.Err(); err != nil {
					return nil, err
				}
				key := fmt.Sprintf("%s/%d", v.name, w)
				s := series[key]
				if s == nil {
					s = &WriteSeries{Variant: v.name, Desc: v.desc, Writers: w, Kind: v.kind}
					series[key] = s
					order = append(order, s)
				}
				if _, err := e.pool.Exec(ctx, "TRUNCATE "+schema+".orders, "+ident(e.table)+", "+schema+".outbox_noidx"); err != nil {
					return nil, err
				}
				e.checkpoint(ctx)
				run, err := measureWrite(ctx, v.txn, w, p.writeDuration())
				if err != nil {
					return nil, fmt.Errorf("%s x%d: %w", v.name, w, err)
				}
				s.Rounds = append(s.Rounds, run)
				log.Printf("write round %d/%d  %-20s x%-2d %8.0f tx/s  p50 %6.2f ms  p99 %6.2f ms", r+1, p.WriteRounds, v.name, w, run.TPS, run.P50, run.P99)
			}
		}
	}
	for _, s := range order {
		var p50, p99 []float64
		for _, r := range s.Rounds {
			p50, p99 = append(p50, r.P50), append(p99, r.P99)
		}
		s.TPS, s.P50, s.P99 = round1(median(s.series())), round2(median(p50)), round2(median(p99))
	}
	get := func(name string, w int) *WriteSeries {
		if s := series[fmt.Sprintf("%s/%d", name, w)]; s != nil {
			return s
		}
		return &WriteSeries{}
	}
	const W = 16
	out := &Write{
		PlainTPS:        get("plain", W).TPS,
		Outbox0TPS:      get("outbox0", W).TPS,
		RawInsertTPS:    get("rawinsert", W).TPS,
		Outbox1TPS:      get("outbox1", W).TPS,
		RawInsert10:     get("rawinsert10", W).TPS,
		Outbox10TPS:     get("outbox10", W).TPS,
		NotifyTPS:       get("outbox1+notify", W).TPS,
		NotifierTPS:     get("outbox1+notifier", W).TPS,
		NotifierVsOut1:  medianRatio(get("outbox1+notifier", W).series(), get("outbox1", W).series()),
		Outbox1VsRaw:    medianRatio(get("outbox1", W).series(), get("rawinsert", W).series()),
		Outbox1VsPlain:  medianRatio(get("outbox1", W).series(), get("plain", W).series()),
		RawVsPlain:      medianRatio(get("rawinsert", W).series(), get("plain", W).series()),
		Outbox10VsRaw:   medianRatio(get("outbox10", W).series(), get("rawinsert10", W).series()),
		Outbox0VsPlain:  medianRatio(get("outbox0", W).series(), get("plain", W).series()),
		NotifyVsOutbox1: medianRatio(get("outbox1+notify", W).series(), get("outbox1", W).series()),
		Outbox1VsRaw1W:  medianRatio(get("outbox1", 1).series(), get("rawinsert", 1).series()),
		Diagnostics: map[string]float64{
			"rawinsert_noindex_vs_rawinsert":   medianRatio(get("rawinsert no-index", W).series(), get("rawinsert", W).series()),
			"rawinsert_smallrow_vs_rawinsert":  medianRatio(get("rawinsert small-row", W).series(), get("rawinsert", W).series()),
			"rawinsert_pipelined_vs_rawinsert": medianRatio(get("rawinsert pipelined", W).series(), get("rawinsert", W).series()),
		},
		Series: order,
	}
	out.Note = fmt.Sprintf("closed loop: each writer runs transactions back to back for %.1f s; tables truncated and CHECKPOINT before each measurement; medians over %d rounds; ratios are medians of per-round ratios", p.WriteDuration, p.WriteRounds)
	return out, nil
}

func measureWrite(ctx context.Context, txn func(context.Context, int) error, writers int, d time.Duration) (WriteRun, error) {
	lats := make([][]time.Duration, writers)
	errs := make([]error, writers)
	var wg sync.WaitGroup
	t0 := time.Now()
	end := t0.Add(d)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			seq := w * 1_000_000
			for time.Now().Before(end) {
				s := time.Now()
				if err := txn(ctx, seq); err != nil {
					errs[w] = err
					return
				}
				lats[w] = append(lats[w], time.Since(s))
				seq += 10
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(t0)
	for _, err := range errs {
		if err != nil {
			return WriteRun{}, err
		}
	}
	var all []time.Duration
	for _, l := range lats {
		all = append(all, l...)
	}
	slices.Sort(all)
	return WriteRun{
		TPS: round1(float64(len(all)) / elapsed.Seconds()),
		P50: percentileMS(all, 0.5),
		P99: percentileMS(all, 0.99),
		N:   len(all),
	}, nil
}
