package relay

import (
	"strconv"
	"time"

	"github.com/fxoutbox/outbox/relay/internal/eo"
)

// newEOKeeper returns an exactly-once worker's keeper (eo.Keeper), or nil
// where lanes are not kept: in Mode Poll with a pool as the DB.
func (r *Relay) newEOKeeper() *eo.Keeper {
	if r.eo == nil || r.cfg.Mode != Poll {
		return nil
	}
	pool, ok := r.db.(acquirer)
	if !ok {
		return nil
	}
	return r.eo.NewKeeper(pool, r.db, keptIdleMillis(r.cfg), r.q.ns, r.cfg.Table.String(), r.cfg.BatchTimeout)
}

// keptIdleMillis is the bound on a kept connection's idle time between
// batches, in milliseconds: longer than any wait of a live worker.
func keptIdleMillis(cfg Config) string {
	d := max(cfg.BatchTimeout, 2*cfg.PollInterval) + 5*time.Second
	return strconv.FormatInt(d.Milliseconds(), 10)
}
