package admin

import (
	"context"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/tablesql"
)

// The SQL over an inbox's parked table lives in internal/tablesql, which
// package inbox (Consumer.List, Retry, Delete) uses too; this file is its
// public face for operators and outboxctl.

// InboxParked is a record an inbox consumer (package inbox) set aside: its
// handler kept failing on it (MaxAttempts), returned a Permanent error, or
// the record had no identity or no route. It is stored with what it takes
// to apply it later (inbox.Consumer.Retry) and is inbox.Parked.
type InboxParked = tablesql.InboxParked

// InboxParkedCount is one group of an inbox's parked records, as
// CountInboxParked reports them.
type InboxParkedCount = tablesql.InboxParkedCount

// ListInboxParked returns the parked records of the inbox table (default
// outbox_inbox; the records are in <name>_parked) with an id above after,
// oldest (lowest id) first, at most limit (0: DefaultLimit), with their
// payloads and headers. consumer "" lists every consumer's; each record
// names its Consumer. For the next page, call it again with after set to
// the last record's ID.
func ListInboxParked(ctx context.Context, db Querier, table outbox.Table, consumer string, after int64, limit int) ([]InboxParked, error) {
	return tablesql.ListInboxParked(ctx, db, table, consumer, after, limit)
}

// GetInboxParked returns the parked record with this id, of this consumer
// ("" for any), or ErrNotFound.
func GetInboxParked(ctx context.Context, db Querier, table outbox.Table, consumer string, id int64) (InboxParked, error) {
	return tablesql.GetInboxParked(ctx, db, table, consumer, id)
}

// TakeInboxParked deletes the parked record with this id, of this
// consumer ("" for any), and returns it, or ErrNotFound: inbox.Consumer.Retry
// takes the record in the transaction that applies it, so it either applies
// and disappears or, rolled back, stays parked.
func TakeInboxParked(ctx context.Context, db Querier, table outbox.Table, consumer string, id int64) (InboxParked, error) {
	return tablesql.TakeInboxParked(ctx, db, table, consumer, id)
}

// DeleteInboxParked deletes the parked record with this id, of this
// consumer ("" for any), without applying it; a record that is not there
// is ErrNotFound. The event's inbox row (written when it was parked, when
// it had an identity) stays, so redeliveries of the event are skipped.
func DeleteInboxParked(ctx context.Context, db Querier, table outbox.Table, consumer string, id int64) error {
	return tablesql.DeleteInboxParked(ctx, db, table, consumer, id)
}

// CountInboxParked returns the inbox's parked records grouped by consumer,
// topic and error type, the largest groups first, each with its oldest
// and newest parked_at: what a status view shows. No rows is an empty
// slice.
func CountInboxParked(ctx context.Context, db Querier, table outbox.Table) ([]InboxParkedCount, error) {
	return tablesql.CountInboxParked(ctx, db, table)
}
