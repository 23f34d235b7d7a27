package inbox_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/fxoutbox/outbox/inbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/unitofwork"
)

// With BatchSize, records that queue up are applied several to a
// transaction; an event id twice in one batch is applied once; a handler
// error rolls its whole batch back, and the batch's records are then
// applied alone (the failing one retried, counted from its first attempt),
// each exactly once and every key in order.
func TestBatchesShareATransactionAndFailAlone(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.batch = 50
	want := e.produce(events(400, 40)...)
	// The same event under two keys: both ready at once, so in one batch.
	first := e.produce(ev{Key: "twice-1"})[0]
	e.produce(ev{Key: "twice-2", ID: first.ID})
	want = append(want, first)

	fail := want[45] // fails at its first call
	var calls, failed, failedAttempt, mates, called atomic.Int64
	effect := e.effect("b")
	cfg := e.config(group(), func(ctx context.Context, tx unitofwork.Tx, m *inbox.Message) error {
		calls.Add(1)
		if m.ID == fail.ID {
			failedAttempt.Store(int64(m.Attempt))
			if failed.Add(1) == 1 {
				// The inbox rows this transaction inserted are the batch; those
				// before this record's offset had their handler called.
				var n, before int64
				if err := tx.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE "offset" < $1) FROM `+sqlname.Ident(sqlname.Inbox(e.inbox))+
					` WHERE xmin::text::bigint = txid_current() % 4294967296`, m.Offset).Scan(&n, &before); err != nil {
					return err
				}
				mates.Store(n - 1)
				called.Store(before)
				return errors.New("boom")
			}
		}
		return effect(ctx, tx, m)
	})
	// Two workers, 40 keys: most records wait, and batches are large.
	cfg.Concurrency = 2
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	cfg.MeterProvider = mp
	e.start(cfg)
	e.waitEffects(len(want))
	time.Sleep(300 * time.Millisecond) // a late duplicate would show now
	e.checkOnce(want)

	var txs, biggest int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(DISTINCT txid), max(n) FROM (SELECT txid, count(*) n FROM `+e.effects+` GROUP BY txid) b`).Scan(&txs, &biggest); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d events in %d transactions, at most %d in one; %d handler calls", len(want), txs, biggest, calls.Load())
	if txs > len(want)/2 || biggest < 2 {
		t.Errorf("%d events applied in %d transactions (at most %d in one): the records were not batched", len(want), txs, biggest)
	}
	if failed.Load() != 2 || failedAttempt.Load() != 1 {
		t.Errorf("the failing record was called %d times, last as attempt %d; want twice, the retry alone as attempt 1", failed.Load(), failedAttempt.Load())
	}
	// The batch metric: the batches that committed, and the one that failed.
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	batches := map[string]uint64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == inbox.MetricBatchSize {
				for _, dp := range m.Data.(metricdata.Histogram[int64]).DataPoints {
					o, _ := dp.Attributes.Value("outbox.inbox.batch.outcome")
					batches[o.AsString()] += dp.Count
				}
			}
		}
	}
	if batches["committed"] == 0 || (mates.Load() > 0) != (batches["failed"] == 1) {
		t.Errorf("%s by outcome: %v; want committed batches, and one failed (the failing record had %d batch-mates)", inbox.MetricBatchSize, batches, mates.Load())
	}
	switch {
	case mates.Load() == 0:
		t.Logf("the failing record was alone in its transaction: its batch-mates' rollback is not tested in this run")
	case calls.Load() != int64(len(want))+1+called.Load():
		t.Errorf("%d handler calls for %d events, one failing in a batch of %d after %d handlers ran: want %d, each called again alone after the rollback",
			calls.Load(), len(want), mates.Load()+1, called.Load(), int64(len(want))+1+called.Load())
	}
}
