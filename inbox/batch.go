package inbox

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"

	"github.com/fxoutbox/outbox/unitofwork"
)

// processBatch applies records of distinct keys (or of none), given in
// offset order, together in one transaction (Config.BatchSize above 1).
// It calls complete(i) as soon as msgs[i] is done (applied, duplicate,
// ignored or parked), as process would return true, and returns once every
// record is done or abandoned; failed reports that the batch's
// transaction failed and its records were applied alone.
//
// One try is made at the whole batch. If it fails for any reason, nothing
// of it committed, and each record is then processed alone, concurrently
// (the records are of distinct keys), with its own retries, attempts and
// parking: a failing record costs its batch one rolled-back transaction,
// never the other records' effects, and under Hold it holds its own key
// only. Records not yet started when the claim ends (stop closed) are
// abandoned to the next owner.
func (c *Consumer) processBatch(ctx context.Context, msgs []*sarama.ConsumerMessage, stop <-chan struct{}, complete func(i int)) (failed bool) {
	finish := func(r *record, i int, outcome string, err error) {
		if c.finish(r, outcome, err) {
			complete(i)
		}
	}
	rs := make([]*record, len(msgs))
	var together, alone []int // records that join the batch's transaction, and the others
	hs := make([]Handler, len(msgs))
	causes := make([]error, len(msgs))
	for i, msg := range msgs {
		rs[i] = c.begin(ctx, msg)
		var ignored bool
		hs[i], causes[i], ignored = c.resolve(msg, rs[i].m)
		switch {
		case ignored:
			finish(rs[i], i, OutcomeIgnored, nil)
		case causes[i] != nil:
			alone = append(alone, i) // parked by try
		default:
			together = append(together, i)
		}
	}
	if len(together) == 1 {
		alone, together = append(alone, together[0]), nil
	}
	if len(together) > 1 {
		outcomes, err := c.applyBatch(ctx, rs, together, hs)
		if ctx.Err() == nil {
			c.ms.batched(ctx, msgs[0].Topic, len(together), err == nil)
		}
		switch {
		case err == nil:
			for j, i := range together {
				rs[i].span.SetAttributes(attribute.Int("outbox.inbox.batch_size", len(together)))
				finish(rs[i], i, outcomes[j], nil)
			}
		case ctx.Err() != nil:
			for _, i := range slices.Concat(together, alone) {
				finish(rs[i], i, "", ctx.Err())
			}
			return false
		default:
			failed = true
			c.cfg.Logger.Debug("outbox inbox: a batch's transaction failed; applying its records one at a time",
				"consumer", c.cfg.Name, "topic", msgs[0].Topic, "partition", msgs[0].Partition, "records", len(together),
				"error.type", errorType(err), "error", err)
			alone = append(alone, together...)
			slices.Sort(alone)
		}
	}
	alone1 := func(i int) {
		select {
		case <-stop:
			finish(rs[i], i, "", context.Canceled) // the claim ended: left to the next owner
			return
		default:
		}
		outcome, err := c.try(rs[i].ctx, rs[i].msg, rs[i].m, hs[i], causes[i], stop)
		finish(rs[i], i, outcome, err)
	}
	if len(alone) == 1 {
		alone1(alone[0])
		return failed
	}
	var wg sync.WaitGroup
	for _, i := range alone {
		wg.Go(func() { alone1(i) })
	}
	wg.Wait()
	return failed
}

// applyBatch is one try at the records rs[idx], with their handlers
// hs[idx], in one transaction: their
// inbox rows in one INSERT sent with BEGIN, then, in offset order, the
// handler of each record whose row was new, each with its record's ctx
// (process span and baggage). It returns each record's outcome (applied or
// duplicate) once the transaction committed.
func (c *Consumer) applyBatch(ctx context.Context, rs []*record, idx []int, hs []Handler) (outcomes []string, err error) {
	ids := make([]string, len(idx))
	topics := make([]string, len(idx))
	parts := make([]int32, len(idx))
	offsets := make([]int64, len(idx))
	for j, i := range idx {
		m := rs[i].m
		m.Attempt = 1
		ids[j], topics[j], parts[j], offsets[j] = m.ID, m.Topic, m.Partition, m.Offset
	}
	deadline := time.Now().Add(c.cfg.TryTimeout)
	tctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	var inserted map[string]bool
	b := &pgx.Batch{}
	b.Queue(c.sql.insertMany, c.cfg.Name, ids, topics, parts, offsets).Query(func(rows pgx.Rows) error {
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		inserted = make(map[string]bool, len(got))
		for _, id := range got {
			inserted[id] = true
		}
		return nil
	})
	outcomes = make([]string, len(idx))
	err = c.uow.DoBatch(tctx, b, func(_ context.Context, tx unitofwork.Tx) error {
		for j, i := range idx {
			if !inserted[ids[j]] {
				// Applied before, or earlier in this batch (an id twice).
				outcomes[j] = OutcomeDuplicate
				continue
			}
			delete(inserted, ids[j])
			// The record's own ctx (span, baggage), with the batch's deadline.
			hctx, cancel := context.WithDeadline(rs[i].ctx, deadline)
			err := c.call(hctx, hs[i], tx, rs[i].m)
			cancel()
			if err != nil {
				return err
			}
			outcomes[j] = OutcomeApplied
		}
		return nil
	})
	if err != nil && inserted == nil {
		return nil, fmt.Errorf("inbox: record %d events in %s: %w", len(idx), c.cfg.Table, err)
	}
	if err != nil {
		return nil, err
	}
	return outcomes, nil
}
