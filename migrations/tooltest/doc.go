// Package tooltest proves that goose and tern apply and revert the outbox
// migrations that migrations.Goose and migrations.Tern render (and the
// inbox's and the streaming publication's), on a real PostgreSQL server. It
// is a module of its own so that goose and tern, and their dependencies,
// stay out of the library's go.mod.
package tooltest
