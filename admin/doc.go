// Package admin is the operator's API of an outbox table: what the
// outboxctl command is a shell over. It reads and changes only the rows and the bookkeeping columns
// (published_at, parked_at, attempts); it never publishes, so it needs no
// broker.
//
// [ReadStatus] tells how the table is doing: the backlog, the age of its
// oldest event, the write and publish rates, the parked events grouped by
// topic and reason, the lanes relays hold right now and the relay sessions
// seen. [ListParked], [GetParked], [Requeue] and [Delete] operate parked
// events: in their rows, or for a table in cursor mode (relay.ProgressCursor)
// in its parked table <table>_parked, from which Requeue moves them back;
// [Replay] publishes already published events again. Bulk operations
// run in short statements of BulkOptions.ChunkSize rows, each committed on
// its own when db is a pool (or all in the caller's transaction when db is a
// pgx.Tx), and report their progress.
//
// Every function takes a [Querier] (a *pgxpool.Pool, a *pgx.Conn or a
// pgx.Tx) and the outbox.Table. The role it connects as needs what the
// relay's role has (migrations/roles.example.sql): SELECT on the table,
// UPDATE of published_at, parked_at and attempts (Requeue, Replay) and
// DELETE (Delete); in cursor mode what migrations/cursor/roles.example.sql
// adds (the parked table, and INSERT of a requeued event). [ReadStatus] sees every lane holder (pg_locks), but
// pg_stat_activity shows the client, state, times and last statement of
// another role's sessions only to members of pg_read_all_stats: without it,
// relays connecting as other roles show without those, and their LISTEN
// sessions are not seen.
//
// [FindTables] finds the outbox tables of a database by their columns,
// whatever their names.
//
// An inbox's (package inbox) parked records are the consumer's to operate:
// inbox.Consumer.List, Retry (which runs the application's handler, in the
// consuming service) and Delete; `outboxctl inbox` lists, shows and deletes
// them for any consumer.
//
// For the streaming relay (relay.Stream), [CheckStream] checks what it
// needs of the server, in order: wal_level = logical, the table's
// publication (FOR TABLE the table WITH (publish = 'insert'), created by
// migrations.Stream.Up), the role's REPLICATION attribute, room for
// replication slots and WAL senders, and the table's slot if it exists (a
// pgoutput logical slot of this database, not invalidated). It returns the
// first problem as a *[outbox.StreamSetupError] whose message names the SQL or
// setting that fixes it; the relay fails to start with it. [ReadStream]
// reports the slot (active, lag and retained WAL, wal_status), the
// publication and the settings; [DropSlot] drops the slot, which frees the
// WAL it keeps (DropSlot needs REPLICATION, ending another role's session
// pg_signal_backend). All of them read catalogs and settings any role may
// read.
package admin
