// Package lanelock holds the statements of the session locks a relay
// worker keeps on lanes between its batches: on a connection of its own,
// it takes a session lock on a lane while its batch's transaction holds the
// lane's transaction lock (so the session lock is granted at once), and
// then holds the lane across batches, since other relays' try-locks in the
// same namespace fail while its own succeed. A session bound by
// idle_session_timeout lets a frozen relay's lanes go.
package lanelock

import (
	"context"
	"errors"
	"log/slog"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

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

// Acquirer gives a connection of a pool (a *pgxpool.Pool).
type Acquirer interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// Keep takes a connection out of pool for a worker that keeps lanes (it
// holds its locks and settings for good, and the pool keeps its size for
// the rest of the relay), its idle session bounded by idleMillis. When the
// server cannot bound an idle session (PostgreSQL 13: a frozen relay would
// keep its lanes for ever), it sets off, warns that instead (what the
// worker does without), and returns no connection and no error.
func Keep(ctx context.Context, pool Acquirer, idleMillis string, logger *slog.Logger, off *bool, instead string) (*pgx.Conn, error) {
	pc, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	conn := pc.Hijack()
	if _, err := conn.Exec(ctx, KeepSession, idleMillis); err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		if pe := new(pgconn.PgError); errors.As(err, &pe) && pe.Code == "42704" { // unrecognized configuration parameter
			*off = true
			logger.Warn("outbox relay: the server has no idle_session_timeout (PostgreSQL 14 or later); "+instead, "error", err)
			return nil, nil
		}
		return nil, err
	}
	return conn, nil
}

// Idle returns the lanes of kept that no batch used since the last call
// (those not in used), in order, and clears used for the next period: the
// lanes a worker lets go.
func Idle[V any](kept map[int32]V, used map[int32]bool) []int32 {
	var idle []int32
	for lane := range kept {
		if !used[lane] {
			idle = append(idle, lane)
		}
	}
	clear(used)
	slices.Sort(idle)
	return idle
}
