package relay

import "time"

// SetKeepSaveEvery sets how often the workers of r, a cursor relay, write
// the positions of the lanes they keep across batches; before Start.
func SetKeepSaveEvery(r *Relay, d time.Duration) { r.cur.SetKeepEvery(d) }

// SetKeepFind sets how often the workers of r, a cursor relay, run Find
// while the lanes they keep have events to send (keptFindEvery); before
// Start.
func SetKeepFind(r *Relay, d time.Duration) { r.cur.SetKeepFind(d) }

// KeptClaims returns how many claims of r read the lanes its workers keep
// without Find and had events to send.
func KeptClaims(r *Relay) int64 { return r.cur.KeptClaims() }

// KeptUnreadable returns how many claims of r read kept lanes in one
// statement, met a row that could not be read and read the lanes again.
func KeptUnreadable(r *Relay) int64 { return r.cur.KeptUnreadable() }

// KeptFreed returns how many kept lanes the workers of r let go.
func KeptFreed(r *Relay) int64 { return r.cur.KeptFreed() }
