package admin

import (
	"context"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/tablesql"
)

// The streaming relay's setup checks live in internal/tablesql, which the
// relay runs at Start; this file is their public face.

// CheckStream checks that the server is set up for the streaming relay of
// table (relay.Stream), in this order: wal_level is logical; the table's
// publication (outbox.Table.Publication) exists and is FOR TABLE the table
// WITH (publish = 'insert'); the current role has REPLICATION (or is a
// superuser); max_replication_slots and max_wal_senders are above 0 and,
// when the table's slot does not exist yet, a slot is free; and if the
// slot (outbox.Table.Slot) exists, it is a pgoutput logical slot of this
// database and was not invalidated. The first problem found is returned as
// an *outbox.StreamSetupError; a failing query as a wrapped error.
//
// It reads only catalogs and settings every role may read, and changes
// nothing. The role is the current one (current_user): connect as the
// role the relay's replication connection logs in as.
func CheckStream(ctx context.Context, db Querier, table outbox.Table) error {
	return tablesql.CheckStream(ctx, db, table)
}

var (
	// ErrNoSlot is returned by DropSlot when the table has no replication
	// slot.
	ErrNoSlot = tablesql.ErrNoSlot
	// ErrSlotActive is returned by DropSlot without force when a session
	// streams from the slot.
	ErrSlotActive = tablesql.ErrSlotActive
)

// DropSlot drops the table's replication slot (outbox.Table.Slot), which
// frees the WAL it keeps. A slot a session streams from (a running
// streaming relay) is refused with ErrSlotActive unless force is set: then
// that session is ended first (pg_terminate_backend of its active_pid),
// again if a standby relay takes the slot over meanwhile, until the slot is
// dropped, ctx ends or 30s have passed. An absent slot is ErrNoSlot.
//
// A streaming relay that still runs creates a new slot when it reconnects,
// which starts from the present: stop the streaming relays first (or switch
// them to polling) unless that is what you want. The role needs REPLICATION
// (or SUPERUSER), and, to end another role's session, membership of
// pg_signal_backend.
func DropSlot(ctx context.Context, db Querier, table outbox.Table, force bool) error {
	return tablesql.DropSlot(ctx, db, table, force)
}
