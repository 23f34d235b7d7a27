// Package lanelock holds the statements of the session locks a relay
// worker keeps on lanes between its batches: on a connection of its own,
// it takes a session lock on a lane while its batch's transaction holds the
// lane's transaction lock (so the session lock is granted at once), and
// then holds the lane across batches, since other relays' try-locks in the
// same namespace fail while its own succeed. A session bound by
// idle_session_timeout lets a frozen relay's lanes go.
package lanelock

const (
	// KeepSession sets idle_session_timeout ($1, milliseconds) for the
	// session of a connection that keeps lanes across batches: the server
	// ends a frozen relay's session, and so its session locks, after it.
	KeepSession = "SELECT set_config('idle_session_timeout', $1, false)"
	// Own takes session locks on @lanes in namespace @ns, which the
	// transaction holds already.
	Own = "SELECT count(pg_advisory_lock(@ns, l)) FROM unnest(@lanes::int[]) l"
	// Release lets the session locks on @lanes in namespace @ns go.
	Release = "SELECT count(pg_advisory_unlock(@ns, l)) FROM unnest(@lanes::int[]) l"
)
