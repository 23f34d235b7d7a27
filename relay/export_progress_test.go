package relay

// ExpireMarksCheck makes the next batch of r, a marks relay, check the
// table's progress again at once instead of after cursorCheckEvery.
func ExpireMarksCheck(r *Relay) { r.marksChecked.Store(0) }
