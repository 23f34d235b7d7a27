// Package locks names the PostgreSQL advisory locks the module's packages
// share: the relays take them, admin and outboxctl find them in pg_locks.
package locks

import "hash/fnv"

// Namespace returns the first key of a table's advisory locks, for the
// table's name as outbox.Table.String() gives it (schema.name): the FNV-32a
// hash of "fxoutbox:" and that name. Relays claim the table's lanes with
// transaction-scoped locks (Namespace, lane); pg_locks shows the namespace
// as classid (an unsigned 32-bit number), the lane as objid, objsubid 2.
func Namespace(table string) int32 {
	h := fnv.New32a()
	h.Write([]byte("fxoutbox:" + table))
	return int32(h.Sum32())
}

// StatsReporter is the second key of the session-level advisory lock
// (Namespace, StatsReporter) held by the one relay of a table that reports
// its table-wide gauges (backlog, oldest age, parked). Lanes are never
// negative, so it never meets a lane's lock.
const StatsReporter int32 = -1

// Partitions is the second key of the transaction-scoped advisory lock
// (Namespace, Partitions) that a relay holds while it changes a
// partitioned table's partitions (makes, re-bounds or drops one): one relay
// of the table at a time, the others skip the round.
const Partitions int32 = -2
