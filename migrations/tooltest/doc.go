// Package tooltest proves that goose and tern apply and revert the outbox
// migrations that migrations.Outbox.Goose and migrations.Outbox.Tern render (and the
// inbox's and the streaming publication's), on a real PostgreSQL server, and
// that golang-migrate, goose and tern take over an existing table of the
// NestJS relay's design. It is a module of its own so that the tools, and
// their dependencies, stay out of the library's go.mod.
package tooltest
