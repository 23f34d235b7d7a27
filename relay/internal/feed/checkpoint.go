package feed

import (
	"context"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox/relay/internal/failure"
	"github.com/fxoutbox/outbox/relay/internal/snapshot"
)

// checkpoint writes the stream's progress into the lanes' positions, at
// most once per checkpointEvery: every lane's done snapshot becomes the
// candidate taken at an earlier checkpoint, once the confirmed position
// passed the WAL insert position read after that snapshot (so every
// transaction the snapshot sees ended before a confirmed position: its rows
// are acknowledged or parked). It then takes the next candidate. Nothing is
// written while no row was resolved since the last write. final (at Stop)
// writes and takes no candidate. A failure is logged and tried again at the
// next period: the checkpoint only bounds what a restart sends again.
func (f *feed) checkpoint(ctx context.Context, final bool) {
	f.cpAt = time.Now()
	// Rows resolved before the candidate was taken are seen by its
	// snapshot (they were acknowledged after their commit was decoded).
	// Exactly once: not before the stream's first record, which says the
	// stream (not the lanes' positions and their records) holds its
	// progress.
	write := f.cand != nil && f.resolved > f.written && f.passed(f.cand) && (f.eo == nil || f.eo.Committed)
	take := !final && (f.cand == nil || f.passed(f.cand))
	if !write && !take {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(f.cfg.BatchTimeout, 5*time.Second))
	defer cancel()
	var next *snapshot.Candidate
	err := pgx.BeginFunc(ctx, f.cfg.DB, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		if write {
			// Another relay polling the table (a relay in Poll mode, or
			// one that lost its slot) holds lanes: their positions are its.
			var busy int
			if err := tx.QueryRow(ctx, f.cfg.Cur.Q.TryLockAll, f.cfg.NS, f.cfg.Lanes).Scan(&busy); err != nil {
				return err
			}
			if busy > 0 {
				if !f.cpWarned {
					f.cpWarned = true
					f.cfg.Logger.Warn("outbox relay: another relay holds lanes of the streamed table (a relay polling it?): the stream's checkpoint waits; run every relay of a table in the same mode",
						"table", f.cfg.Table.String(), "lanes_held", busy)
				}
				write = false
			} else {
				f.cpWarned = false
				b.Queue(f.cfg.Cur.Q.Checkpoint, pgx.NamedArgs{"done": f.cand.Snap, "base": f.cand.Base})
			}
		}
		if take {
			b.Queue(f.cfg.Stream.Candidate).QueryRow(func(row pgx.Row) error {
				var c snapshot.Candidate
				var lsn string
				if err := row.Scan(&c.Snap, &c.Base, &lsn); err != nil {
					return err
				}
				l, err := pglogrepl.ParseLSN(lsn)
				if err != nil {
					return err
				}
				c.LSN, c.Seq, next = l, f.resolved, &c
				return nil
			})
		}
		if b.Len() == 0 {
			return nil
		}
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		f.cfg.Logger.Warn("outbox relay: writing the stream's checkpoint failed; tried again in a second (a restart sends again what the stream published since the last one)",
			"table", f.cfg.Table.String(), "error", err, "error.type", failure.Type(err))
		return
	}
	if write {
		f.cfg.Cur.Forget() // the positions changed outside a batch: read them again
		f.written = f.cand.Seq
		f.cfg.CheckpointAt.Store(time.Now().UnixNano())
	}
	if next != nil {
		f.cand = next
	}
}

// passed reports whether every transaction that ended at or before c's
// position is resolved: the confirmed position is past it, or a later
// transaction arrived (the stream sends them in commit order) and none
// that ended before it waits.
func (f *feed) passed(c *snapshot.Candidate) bool {
	if f.cfg.Progress.Confirmed() >= c.LSN {
		return true
	}
	return f.lastEnd > c.LSN && (len(f.txs) == 0 || f.txs[0].end > c.LSN)
}

// stopDrain bounds how long a stopping relay goes on publishing the
// transactions that its last checkpoint covers.
const stopDrain = 3 * time.Second

// finish is the feed's end at Stop, after the batch in flight: it takes a
// checkpoint candidate now, publishes the transactions that ended before
// it (those that ended after it stay in the slot), and writes it, so that a
// restart sends nothing again. Failing keys, or stopDrain passing, leave
// the last checkpoint that was passed.
func (f *feed) finish(ctx context.Context) {
	if f.cand != nil && f.passed(f.cand) {
		f.checkpoint(ctx, false) // writes it and takes the next one, from now
	} else {
		f.checkpoint(ctx, true)
	}
	c := f.cand
	if c == nil {
		return
	}
	deadline := time.Now().Add(stopDrain)
	txs := f.conn.Txs()
	for !f.passed(c) && time.Now().Before(deadline) {
		now := time.Now()
		if !f.busy {
			if batch := f.next(now.Add(f.cfg.Linger)); len(batch) > 0 {
				f.dispatch(ctx, batch)
			}
		}
		t := time.NewTimer(max(0, min(time.Until(deadline), f.wait(now))))
		select {
		case tx, ok := <-txs:
			switch {
			case !ok:
				txs = nil
			case tx.End > c.LSN:
				f.lastEnd, txs = tx.End, nil // it stays in the slot
			default:
				if f.take(ctx, tx) != nil {
					txs = nil
				}
			}
		case res := <-f.results:
			f.busy = false
			if err := f.settle(ctx, res); err != nil {
				t.Stop()
				return
			}
		case <-t.C:
		}
		t.Stop()
	}
	if f.busy {
		res := <-f.results
		f.busy = false
		if f.settle(ctx, res) != nil {
			return
		}
	}
	f.checkpoint(ctx, true)
}
