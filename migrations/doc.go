// Package migrations creates and drops the outbox table.
//
// The SQL files in this folder are the schema, in the layout golang-migrate
// reads as it is ("000001_create_outbox_event.up.sql" and ".down.sql").
// The folders goose/ and tern/ hold the same migrations in those tools'
// formats, generated from the up/down files (a test keeps them in step), for
// the table outbox_event in the connection's search_path.
//
// Programs that run goose or tern from Go take the migrations from [Goose]
// or [Tern] instead: embedded, rendered for any table name and schema, with
// the name of a version table of their own (<name>_goose_version,
// <name>_tern_version), so the outbox's versions 1 to 3 never collide with
// the application's own migrations. The library does not depend on either
// tool: both return an fs.FS and a name to pass to it.
//
// For a table with another name or schema, or to skip a migration tool
// altogether, call [Up]: it renders the same files for the configured
// [outbox.Table] (names validated and quoted) and applies the ones not yet
// applied, recording them in a table named <table>_migrations. Concurrent
// callers (several pods starting at once) serialize on an advisory lock.
//
// The first migration also takes over an outbox table that exists already
// with the same design, as the NestJS relay's outbox_event: it checks the
// table's columns first (an incompatible one stops it before any change,
// with an error naming the column and the fix), keeps every row as it is,
// adds the headers column and builds the partial index of unpublished rows
// only if no equivalent one exists. None of the runners (Up, golang-migrate,
// goose, tern) records checksums of applied files: those who applied the
// file before it learned this are not affected, and on an empty schema it
// creates the same table and indexes as before.
//
// roles.example.sql, beside them, is not a migration: a psql script that
// grants least-privilege writer and relay roles on the table, to run after
// the migrations as the role that owns the table.
//
// The inbox (package inbox, the consume side) has migrations of its own in
// the folder inbox/: the tables outbox_inbox (one row per event a consumer
// applied) and outbox_inbox_parked, in golang-migrate's layout. [UpInbox]
// and [DownInbox] apply and revert them for any table name and schema
// (default name [DefaultInboxTableName]), recording them in
// <name>_migrations; [GooseInbox] and [TernInbox] render them for those
// tools with version tables of their own. inbox/roles.example.sql grants a
// least-privilege consumer role.
//
// The streaming relay (relay.Stream) reads the table's inserts through a
// publication, [outbox.Table.Publication]: FOR TABLE the table WITH
// (publish = 'insert'). It is opt-in and has a migration of its own, in the
// folder stream/ (golang-migrate's layout, for the default table) and
// stream/goose, stream/tern. [UpStream] creates it for any table, and is
// idempotent (an existing publication that differs is an error saying how);
// [DownStream] drops it; [GooseStream] and [TernStream] render it with
// version tables of their own (<name>_stream_goose_version,
// <name>_stream_tern_version). Creating a publication takes the table's
// owner with CREATE on the database. The relay's replication slot is not a
// migration: the relay creates it, and it is dropped separately
// (admin.DropSlot, `outboxctl stream drop-slot`), since it keeps WAL until
// it is.
//
// Choosing a runner, goose and tern from Go, and taking over the NestJS
// relay's table: the [Migrations] guide.
//
// [Migrations]: https://github.com/fxoutbox/outbox/blob/main/docs/migrations.md
package migrations
