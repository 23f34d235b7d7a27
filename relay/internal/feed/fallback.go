package feed

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox/relay/internal/cursor"
	"github.com/fxoutbox/outbox/relay/internal/eo"
	"github.com/fxoutbox/outbox/relay/internal/kafkaproducer"
)

// Fallback hands the stream's progress to the table before the
// relay polls it for want of a slot: the record's resolved rows become the
// lanes' positions, in a Kafka transaction (the lane records, and a stream
// record that says the table holds the progress) and then in the table.
// Nothing to do when the record says so already, or there is none.
func Fallback(ctx context.Context, cfg Config) error {
	ctx, cancel := context.WithTimeout(ctx, cfg.BatchTimeout)
	defer cancel()
	txn, p, err := cfg.EO.StreamInit(ctx)
	if err != nil || p == nil || p.Mode != eo.StreamModeStream {
		return err
	}
	e, err := eo.ResumeStream(txn, p, cfg.Lanes)
	if err != nil {
		return err
	}
	if err := cfg.Cur.Ready(ctx); err != nil {
		return err
	}
	kept := make([]cursor.Lane, cfg.Lanes)
	all := make([]int32, cfg.Lanes)
	for i := range kept {
		all[i] = int32(i)
		kept[i] = cursor.Lane{Lane: int32(i), Done: p.Done, Base: p.Base}
		if len(p.Lanes) > 0 {
			kept[i].Done, kept[i].Base = p.Lanes[i].Done, p.Lanes[i].Base
		}
	}
	ids := make([]int64, 0, len(e.IDs))
	for id := range e.IDs {
		ids = append(ids, id)
	}
	tx, err := cfg.DB.Begin(ctx)
	if err != nil {
		return fmt.Errorf("relay: exactly-once stream: hand the stream's progress to the table: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	pos, err := cfg.Cur.OpenPositions(ctx, tx, kept, all, ids)
	if err != nil {
		return fmt.Errorf("relay: exactly-once stream: hand the stream's progress to the table: %w", err)
	}
	recs := make([]kafkaproducer.Record, 0, len(pos)+1)
	for i := range pos {
		rec, err := cfg.EO.Record(pos[i].Lane, "", nil, &pos[i], nil)
		if err != nil {
			return err
		}
		recs = append(recs, rec)
	}
	rec, err := cfg.EO.StreamRecord(eo.StreamRecord{Table: cfg.Table.String(), Mode: eo.StreamModeTable, Topics: p.Topics})
	if err != nil {
		return err
	}
	recs = append(recs, rec)
	started := time.Now()
	if err := eo.FirstResult(txn.Produce(ctx, recs)); err != nil {
		_ = txn.Abort(ctx)
		cfg.Observer.TxnEnded(ctx, eo.TxnAborted, started, err)
		return fmt.Errorf("relay: exactly-once stream: write the lanes' positions to the progress topic: %w", err)
	}
	if err := txn.Commit(ctx); err != nil {
		txn.Invalidate()
		cfg.Observer.TxnEnded(ctx, eo.TxnUnknown, started, err)
		return fmt.Errorf("relay: exactly-once stream: write the lanes' positions to the progress topic: %w", err)
	}
	cfg.Observer.TxnEnded(ctx, eo.TxnCommitted, started, nil)
	// The workers read every lane back before they publish it again.
	cfg.EO.Disown()
	cfg.Cur.Forget()
	b := &pgx.Batch{}
	b.Queue(cfg.Durable)
	cfg.Cur.SaveLanes(b, pos)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("relay: exactly-once stream: write the lanes' positions: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("relay: exactly-once stream: write the lanes' positions: %w", err)
	}
	cfg.Logger.Info("outbox relay: exactly-once stream: the stream's progress is in the lanes' positions; polling resumes from there",
		"table", cfg.Table.String(), "events_past_done", len(ids))
	return nil
}
