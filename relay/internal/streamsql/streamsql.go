// Package streamsql holds the statements of the relay's stream (Mode
// Stream) that are about its replication slot and the table's snapshot and
// WAL positions, as opposed to the lanes' positions (relay/internal/cursor)
// or the marks (relay/internal/marks). SQL text only: the relay runs it
// and scans the rows; the replication connection itself is pgoutput's.
package streamsql

import (
	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
)

// Queries are the stream's statements for one table.
type Queries struct {
	// Candidate reads a checkpoint candidate: the current snapshot (as
	// text), the highest id of the table it sees (0 when none) and the WAL
	// insert position after it (as text), so that every transaction the
	// snapshot sees ends at or before that position.
	Candidate string
	// Snapshot reads the current snapshot, as text.
	Snapshot string
	// MaxID reads the table's highest id, 0 when it has no row.
	MaxID string
	// DropLost drops the slot named $1 if the server invalidated it
	// (wal_status lost) and no process holds it: a row when it did.
	DropLost string
	// Slot reads whether the slot named $1 exists (no row when not),
	// whether it is invalidated (wal_status lost) and the process that
	// holds it (NULL when none).
	Slot string
}

// NewQueries returns the stream's statements for table.
func NewQueries(table outbox.Table) Queries {
	t := sqlname.Ident(table)
	return Queries{
		Candidate: "SELECT pg_current_snapshot()::text, coalesce((SELECT max(id) FROM " + t + "), 0), pg_current_wal_insert_lsn()::text",
		Snapshot:  "SELECT pg_current_snapshot()::text",
		MaxID:     "SELECT coalesce(max(id), 0) FROM " + t,
		DropLost:  "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active AND wal_status = 'lost'",
		Slot:      "SELECT true, coalesce(wal_status = 'lost', false), active_pid FROM pg_replication_slots WHERE slot_name = $1",
	}
}
