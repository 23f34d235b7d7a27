package cursor

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
)

// The engine's writes and reads of positions and parked rows outside a
// polling claim: exactly-once takeovers, the stream's handover, and the
// charges of a batch's failed rows.

// ApplyPositions writes lanes' positions, read from their last committed
// progress records, to the positions table, in a transaction of its own
// committed synchronously (durable). A position is the one after the
// lane's last Kafka transaction: the table's may be behind it (its writer
// died between the Kafka commit and its database commit), or ahead of it
// by windows that closed without events, which are read again.
func (e *Engine) ApplyPositions(ctx context.Context, lanes []Lane, durable string) error {
	if len(lanes) == 0 {
		return nil
	}
	tx, err := e.cfg.DB.Begin(ctx)
	if err != nil {
		return fmt.Errorf("relay: exactly-once: write the lanes' positions: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	b := &pgx.Batch{}
	b.Queue(durable)
	e.SaveLanes(b, lanes)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("relay: exactly-once: write the lanes' positions: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("relay: exactly-once: write the lanes' positions: %w", err)
	}
	return nil
}

// KeyLanes reads the lanes of keys, in a transaction of its own.
func (e *Engine) KeyLanes(ctx context.Context, keys []string) (map[string]int32, error) {
	tx, err := e.cfg.DB.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	out := map[string]int32{}
	rs, err := tx.Query(ctx, e.Q.KeyLanes, keys, e.cfg.Lanes)
	if err == nil {
		var k string
		var lane int32
		_, err = pgx.ForEachRow(rs, []any{&k, &lane}, func() error { out[k] = lane; return nil })
	}
	return out, err
}

// OpenPositions locks every lane (all) in tx and returns their positions
// from kept (closed at the stream's done snapshots), each window opened now
// with the lane's rows among ids as its skip list.
func (e *Engine) OpenPositions(ctx context.Context, tx pgx.Tx, kept []Lane, all []int32, ids []int64) ([]Lane, error) {
	var busy int
	if err := tx.QueryRow(ctx, e.Q.TryLockLanes, e.cfg.NS, all).Scan(&busy); err != nil {
		return nil, err
	}
	if busy > 0 {
		return nil, fmt.Errorf("another relay holds %d lanes of %s (a relay polling it?); run every relay of a table in the same mode", busy, e.cfg.Table)
	}
	skip := map[int32][]int64{}
	if len(ids) > 0 {
		rows, err := tx.Query(ctx, e.Q.RowLanes, ids, e.cfg.Lanes)
		if err != nil {
			return nil, err
		}
		var id int64
		var lane int32
		if _, err := pgx.ForEachRow(rows, []any{&id, &lane}, func() error { skip[lane] = append(skip[lane], id); return nil }); err != nil {
			return nil, err
		}
	}
	args := KeptArgs(kept)
	args["locked"], args["lanes"] = all, e.cfg.Lanes
	rows, err := tx.Query(ctx, e.Q.Load, pgx.NamedArgs(args))
	if err != nil {
		return nil, err
	}
	var out []Lane
	var l Lane
	var floor *int64
	if _, err := pgx.ForEachRow(rows, []any{&l.Lane, &l.Done, &l.Upto, &l.Base, &l.Pos, &floor, &l.Skip, &l.Top}, func() error {
		l.Floor = l.Base + 1
		if floor != nil {
			l.Floor = *floor
		}
		l.Skip = skip[l.Lane]
		slices.Sort(l.Skip)
		out = append(out, l)
		l = Lane{}
		return nil
	}); err != nil {
		return nil, err
	}
	if len(out) != len(kept) {
		return nil, fmt.Errorf("%d lanes' positions opened, want %d", len(out), len(kept))
	}
	return out, nil
}

// QueueCharge queues a try counted on each of the failed rows ids (Charge:
// a row out of attempts, or that no retry can help, is copied to the parked
// table with its last error, texts, in full beside its reason) and the
// delete of those copied (Unpark); seen gets each row charged, and whether
// it was parked.
func (e *Engine) QueueCharge(b *pgx.Batch, ids []int64, reasons []string, limits []int32, texts []string, seen func(id int64, parked bool)) {
	b.Queue(e.Q.Charge, ids, reasons, limits, texts).Query(func(rs pgx.Rows) error {
		var id int64
		var p bool
		_, err := pgx.ForEachRow(rs, []any{&id, &p}, func() error {
			seen(id, p)
			return nil
		})
		return err
	})
	b.Queue(e.Q.Unpark, ids)
}

// ChargeUnreadable parks the rows ids that cannot be read by moving them
// to the parked table, copied by the server (which never prints them),
// with their reasons msgs and what PostgreSQL said (details); park false
// (Poison Hold) only charges them. scan gets the charged rows: id,
// event_id, topic, partition_key, parked.
func (e *Engine) ChargeUnreadable(ctx context.Context, tx pgx.Tx, ids []int64, msgs, details []string, park bool, scan func(pgx.Rows) error) error {
	b := &pgx.Batch{}
	b.Queue(e.Q.ChargeUnreadable, pgx.NamedArgs{"ids": ids, "errs": msgs, "details": details, "park": park}).Query(scan)
	b.Queue(e.Q.Unpark, ids)
	return tx.SendBatch(ctx, b).Close()
}
