package relay

import "time"

// SetKeepSaveEvery sets how often the workers of r, a cursor relay, write
// the positions of the lanes they keep across batches; before Start.
func SetKeepSaveEvery(r *Relay, d time.Duration) { r.cur.keepEvery = d }
