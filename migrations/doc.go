// Package migrations creates and drops the outbox's tables.
//
// Its migrations come in five sets, each a value of type [Set]: [Outbox]
// (the outbox table), [Inbox] (the inbox's tables, package inbox),
// [Stream] (the streaming relay's publication), [Cursor] (cursor progress:
// the lanes' positions and the parked events' table) and [Partitioned]
// (the outbox table partitioned by time, for new installs). Each has the
// same methods:
//
//	migrations.Outbox.Up(ctx, pool, table)        // apply what is not applied yet
//	migrations.Outbox.Down(ctx, pool, table, 0)   // revert down to a version (0: all)
//	migrations.Outbox.Check(ctx, pool, table)     // is it applied? (what a relay runs)
//	migrations.Outbox.All(table)                  // the SQL, rendered for table
//	migrations.Outbox.FS()                        // the files, for golang-migrate
//	migrations.Outbox.Goose(table)                // rendered for goose, with a version table
//	migrations.Outbox.Tern(table)                 // rendered for tern, with a version table
//
// The SQL files in this folder are the outbox's schema, in the layout
// golang-migrate reads as it is ("000001_create_outbox_event.up.sql" and
// ".down.sql"); the other sets have folders of their own (inbox/, stream/,
// cursor/, partitioned/). The folders goose/ and tern/ (and stream/goose,
// cursor/tern, ...) hold the same migrations in those tools' formats,
// generated from the up/down files (a test keeps them in step), for the
// table outbox_event in the connection's search_path.
//
// Programs that run goose or tern from Go take the migrations from
// [Set.Goose] or [Set.Tern] instead: embedded, rendered for any table name
// and schema, with the name of a version table of their own
// (<name>_goose_version, <name>_cursor_goose_version, ...), so the outbox's
// versions 1 to 3 never collide with the application's own migrations. The
// library does not depend on either tool: both return an fs.FS and a name
// to pass to it.
//
// For a table with another name or schema, or to skip a migration tool
// altogether, call [Set.Up]: it renders the same files for the configured
// [outbox.Table] (names validated and quoted) and applies the ones not yet
// applied, recording the outbox's and the inbox's in a table named
// <table>_migrations. Concurrent callers (several pods starting at once)
// serialize on an advisory lock per table.
//
// The first outbox migration also takes over an outbox table that exists
// already with the same design, as the NestJS relay's outbox_event: it
// checks the table's columns first (an incompatible one stops it before any
// change, with an error naming the column and the fix), keeps every row as
// it is, adds the headers column and builds the partial index of
// unpublished rows only if no equivalent one exists. None of the runners
// (Up, golang-migrate, goose, tern) records checksums of applied files:
// those who applied the file before it learned this are not affected, and
// on an empty schema it creates the same table and indexes as before.
//
// roles.example.sql, beside them, is not a migration: a psql script that
// grants least-privilege writer and relay roles on the table, to run after
// the migrations as the role that owns the table (inbox/ and cursor/ have
// one each too).
//
// The streaming relay's publication, [outbox.Table.Publication], is FOR
// TABLE the table WITH (publish = 'insert'). Stream.Up is idempotent (an
// existing publication that differs is an error saying how, and
// [ReadPublication] says what the catalog holds). Creating a publication
// takes the table's owner with CREATE on the database. The relay's
// replication slot is not a migration: the relay creates it, and it is
// dropped separately (admin.DropSlot, `outboxctl stream drop-slot`), since
// it keeps WAL until it is.
//
// Choosing a runner, goose and tern from Go, and taking over the NestJS
// relay's table: the [Migrations] guide.
//
// [Migrations]: https://github.com/fxoutbox/outbox/blob/main/docs/migrations.md
package migrations
