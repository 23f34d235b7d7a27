// Package sqlname quotes the names of an outbox table and of the objects
// that belong to it for SQL text. The module's packages paste no name into
// SQL any other way; users name a table with outbox.Table, whose Validate
// keeps the names to plain identifiers.
package sqlname

import (
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
