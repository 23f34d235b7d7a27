package inbox

import (
	"context"
	"fmt"
	"time"
)

// cleanupBatch bounds one retention DELETE, so it holds few locks briefly.
const cleanupBatch = 1000

// Cleanup deletes this consumer's inbox rows older than Config.Retention,
// in batches of at most 1000 rows, and returns how many it deleted. The
// consumer runs it every CleanupInterval; it does nothing when Retention is
// negative.
func (c *Consumer) Cleanup(ctx context.Context) (int64, error) {
	if c.cfg.Retention < 0 {
		return 0, nil
	}
	age := fmt.Sprintf("%d microseconds", c.cfg.Retention.Microseconds())
	var total int64
	for {
		tag, err := c.db.Exec(ctx, c.sql.cleanup, c.cfg.Name, age, cleanupBatch)
		if err != nil {
			return total, fmt.Errorf("inbox: delete inbox rows of %s older than %v: %w", c.cfg.Name, c.cfg.Retention, err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < cleanupBatch {
			return total, nil
		}
	}
}

func (c *Consumer) cleanupLoop(ctx context.Context) {
	t := time.NewTicker(c.cfg.CleanupInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := c.Cleanup(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			c.cfg.Logger.Warn("outbox inbox: retention cleanup failed; retried at the next interval", "consumer", c.cfg.Name, "error.type", errorType(err), "error", err)
		case n > 0:
			c.cfg.Logger.Info("outbox inbox: deleted old inbox rows", "consumer", c.cfg.Name, "rows", n, "retention", c.cfg.Retention)
		}
	}
}
