package admin

import (
	"context"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/tablesql"
)

// The streaming relay's setup checks live in internal/tablesql, which the
// relay runs at Start; this file is their public face.

// The checks of CheckStream, in the order it makes them: the Check of a
// StreamSetupError.
const (
	// CheckWALLevel: wal_level is not logical.
	CheckWALLevel = tablesql.CheckWALLevel
	// CheckPublication: the table's publication is missing or is not FOR
	// TABLE the table WITH (publish = 'insert').
	CheckPublication = tablesql.CheckPublication
	// CheckReplicationRole: the role has neither REPLICATION nor SUPERUSER.
	CheckReplicationRole = tablesql.CheckReplicationRole
	// CheckReplicationCapacity: max_replication_slots or max_wal_senders is
	// 0, or every slot is taken and the table's slot does not exist yet.
	CheckReplicationCapacity = tablesql.CheckReplicationCapacity
	// CheckSlot: a slot of the table's slot name exists but is not a
	// pgoutput logical slot of this database.
	CheckSlot = tablesql.CheckSlot
	// CheckSlotLost: the table's slot was invalidated (wal_status lost).
	// The error also matches outbox.ErrSlotInvalidated.
	CheckSlotLost = tablesql.CheckSlotLost
)

// StreamSetupError is what CheckStream finds wrong with the server's setup
// for the streaming relay. Error says what is wrong and the exact SQL or
// setting that fixes it.
type StreamSetupError = tablesql.StreamSetupError

// CheckStream checks that the server is set up for the streaming relay of
// table (relay.Stream), in this order: wal_level is logical; the table's
// publication (outbox.Table.Publication) exists and is FOR TABLE the table
// WITH (publish = 'insert'); the current role has REPLICATION (or is a
// superuser); max_replication_slots and max_wal_senders are above 0 and,
// when the table's slot does not exist yet, a slot is free; and if the
// slot (outbox.Table.Slot) exists, it is a pgoutput logical slot of this
// database and was not invalidated. The first problem found is returned as
// a *StreamSetupError; a failing query as a wrapped error.
//
// It reads only catalogs and settings every role may read, and changes
// nothing. The role is the current one (current_user): connect as the
// role the relay's replication connection logs in as.
func CheckStream(ctx context.Context, db Querier, table outbox.Table) error {
	return tablesql.CheckStream(ctx, db, table)
}

// StreamSetup is a snapshot of what the streaming relay of a table relies
// on: the server's settings, the table's publication and its slot.
type StreamSetup = tablesql.StreamSetup

// SlotStatus is the table's replication slot, from pg_replication_slots.
type SlotStatus = tablesql.SlotStatus

// ReadStream reads what the streaming relay of table relies on; Setup
// carries CheckStream's verdict. It changes nothing.
func ReadStream(ctx context.Context, db Querier, table outbox.Table) (StreamSetup, error) {
	return tablesql.ReadStream(ctx, db, table)
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
