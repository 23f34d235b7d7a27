// Package sqlname quotes the names of an outbox table and of the objects
// that belong to it for SQL text. The module's packages paste no name into
// SQL any other way; users name a table with outbox.Table, whose Validate
// keeps the names to plain identifiers.
package sqlname

import (
	"fmt"
	"hash/fnv"

	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
)

// Ident returns t's quoted, schema-qualified name for SQL text, e.g.
// "public"."outbox_event" (just "outbox_event" without a schema). Validate
// t first.
func Ident(t outbox.Table) string {
	t = t.WithDefaults()
	if t.Schema == "" {
		return pgx.Identifier{t.Name}.Sanitize()
	}
	return pgx.Identifier{t.Schema, t.Name}.Sanitize()
}

// Derived returns the quoted name of an object that belongs to t, such as
// an index: t's name followed by "_" and suffix, unqualified.
func Derived(t outbox.Table, suffix string) string {
	return pgx.Identifier{t.WithDefaults().Name + "_" + suffix}.Sanitize()
}

// DefaultInbox is the inbox table's name when none is configured. Its
// parked records live in <name>_parked.
const DefaultInbox = "outbox_inbox"

// Inbox returns t with an empty Name set to DefaultInbox: the inbox's
// default, where outbox.Table.WithDefaults gives the outbox's.
func Inbox(t outbox.Table) outbox.Table {
	if t.Name == "" {
		t.Name = DefaultInbox
	}
	return t
}

// Cursor names the table that holds the lanes' positions of an outbox table
// in cursor mode: <name>_cursor, in the table's schema.
func Cursor(t outbox.Table) outbox.Table { return sibling(t.WithDefaults(), "_cursor") }

// CursorFromStart is the comment migrations.Install puts on the positions
// table (Cursor) of a table it created with the cursor migration: no relay
// ever marked its rows, so relay.ProgressAuto records cursor progress on it
// from the first batch (tablesql.ForCursor).
const CursorFromStart = "fxoutbox: cursor progress from the start (migrations.Install)"

// Parked names the table that holds the parked events of an outbox table
// in cursor mode (<name>_parked, in its schema), or the parked records of
// an inbox table given with its name set (see Inbox). An outbox table in
// marks mode parks its events in their rows.
func Parked(t outbox.Table) outbox.Table { return sibling(t.WithDefaults(), "_parked") }

func sibling(t outbox.Table, suffix string) outbox.Table {
	return outbox.Table{Schema: t.Schema, Name: t.Name + suffix}
}

// Channel returns the PostgreSQL notification channel on which writers in
// other processes wake the relays of this table: "<name>_wakeup", or
// "<schema>.<name>_wakeup" when a schema is set (a hashed name when that
// exceeds PostgreSQL's 63-byte limit).
func Channel(t outbox.Table) string {
	t = t.WithDefaults()
	c := t.Name + "_wakeup"
	if t.Schema != "" {
		c = t.Schema + "." + c
	}
	if len(c) > 63 {
		h := fnv.New64a()
		h.Write([]byte(c))
		c = fmt.Sprintf("outbox_wakeup_%016x", h.Sum64())
	}
	return c
}
