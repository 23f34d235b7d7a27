package relay

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/relay/internal/claim"
	"github.com/fxoutbox/outbox/relay/internal/feed"
	"github.com/fxoutbox/outbox/relay/internal/kafkaproducer"
)

// feedConfig is what the stream under cursor progress (relay/internal/feed)
// takes of the relay.
func (r *Relay) feedConfig() feed.Config {
	c := r.cfg
	return feed.Config{Table: c.Table, Logger: c.Logger, Lanes: c.Lanes, BatchSize: c.BatchSize, MaxBatchSize: c.MaxBatchSize,
		BatchTimeout: c.BatchTimeout, PollInterval: c.PollInterval, Linger: c.Stream.Linger, Hold: c.Poison == outbox.Hold, Held: ErrHeld,
		DB: r.db, Cur: r.cur, Durable: r.q.Durable, Stream: r.q.stream, NS: r.q.ns, EO: r.eo, Observer: r.metrics,
		Progress: &r.stream.progress, Oldest: &r.stream.oldest, CheckpointAt: &r.stream.checkpointAt}
}

// feedHost is the relay as its feed sees it (feed.Host).
type feedHost struct{ r *Relay }

func (h feedHost) PollOnce(ctx context.Context, size int) (int, error) {
	_, next, err := h.r.runOnce(ctx, size, 0, nil)
	return next, err
}

// Publish is the pipeline's publish of a polling batch (messages, sends,
// spans, metrics), through the relay's publisher or in the stream's
// transaction txn, which commit ends.
func (h feedHost) Publish(ctx context.Context, rows []claim.Row, txn *kafkaproducer.Txn, commit func(errs []error)) ([]error, []int) {
	r := h.r
	pub := r.pub
	if txn != nil {
		pub = streamTxnPublisher{txn}
	}
	t := time.Now()
	msgs, spans, encErrs := r.messages(ctx, rows)
	errs, alone := r.publish(ctx, pub, rows, msgs, encErrs)
	if commit != nil {
		commit(errs)
	}
	acked := r.metrics.publishLap(ctx, t, rows, errs)
	r.endSpans(spans, msgs, errs)
	r.metrics.record(ctx, rows, errs, acked)
	return errs, alone
}

func (h feedHost) ChargeUnreadable(ctx context.Context, tx pgx.Tx, bad []claim.Unreadable) ([]int64, error) {
	_, ids, err := h.r.chargeUnreadable(ctx, tx, bad, nil)
	return ids, err
}

func (h feedHost) ParkLimit(err error, alone bool) int32 { return h.r.parkLimit(err, alone) }

func (h feedHost) QueueCharge(b *pgx.Batch, ids []int64, reasons []string, limits []int32, errs []error, seen func(id int64, parked bool)) {
	h.r.queueCharge(b, ids, reasons, limits, errs, seen)
}

func (h feedHost) LogFailures(rows []claim.Row, errs []error, failed []int, reasons []string, parked map[int64]bool) {
	h.r.logFailures(rows, errs, failed, reasons, parked)
}

// NoteTopics remembers the topics the broker said are missing, and
// forgets those it took events for, as the pipeline does.
func (h feedHost) NoteTopics(topics []string, errs []error, now time.Time) {
	for i, t := range topics {
		h.r.missing.Report(t, errs[i], now)
	}
	h.r.missing.Forget(publishedTopics(errs, func(i int) string { return topics[i] }))
}

func (h feedHost) Streaming() {
	h.r.stream.state.Store(int32(Streaming))
	h.r.health.set(0, nil)
}

func (h feedHost) Health(err error)                { h.r.health.set(0, err) }
func (h feedHost) Failed(err error) bool           { return h.r.failLog.failed(errorKind(err)) }
func (h feedHost) Recovered() bool                 { return h.r.failLog.recovered() }
func (h feedHost) Backoff(fails int) time.Duration { return h.r.backoff(fails) }
func (h feedHost) Sleep(d time.Duration) bool      { return h.r.sleep(d, nil) }
func (h feedHost) Stop() <-chan struct{}           { return h.r.stop }
func (h feedHost) Stopping() bool                  { return h.r.stopping() }
