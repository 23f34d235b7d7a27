-- Least-privilege PostgreSQL roles for fxoutbox: an example to adapt.
--
-- This is NOT a migration. Its name has no version prefix, so migrations.Up,
-- golang-migrate, goose and tern skip it. Run it with psql:
--
--   psql "$DATABASE_URL" -v ON_ERROR_STOP=1 \
--        -v schema=orders -v table=outbox_event \
--        -v writer=orders_app -v relay=orders_relay \
--        -f migrations/roles.example.sql
--
-- Three roles, three jobs:
--
--   migrator  owns the schema and the outbox table: it runs migrations.Up (or
--             the NNNNNN_*.up.sql files). Set Config.Migrate / OUTBOX_MIGRATE
--             only in a process that connects as this role.
--   writer    the application's handlers: INSERT into the outbox (the
--             event's own columns only), plus what its own business tables
--             need. It cannot read, change or delete events, nor insert one
--             that looks published, parked, retried or old, so it cannot
--             forge what the relay has already seen.
--   relay     the publisher: reads the outbox, marks events published,
--             records failed attempts, parks events and deletes old ones. It
--             can change only the bookkeeping columns (published_at,
--             attempts, last_error, parked_at), never an event's payload,
--             topic, key or headers, cannot add events, and can delete
--             only published or parked events (row-level security).
--   stream    (only for the streaming relay, relay.Stream) a login role with
--             the REPLICATION attribute that is a member of the relay role:
--             the relay's grants and policies below apply to it through the
--             membership, and REPLICATION lets it open a logical replication
--             connection and create the table's slot. Keep REPLICATION off
--             the relay role itself, so that polling relays do without it.
--
-- REPLICATION is more than this table: a role that has it may decode every
-- change of the database through a slot of its own with any output plugin,
-- and, when pg_hba.conf has a line for it with the database `replication`,
-- stream the whole cluster's WAL (physical replication, base backups).
-- Logical replication connections match pg_hba.conf's lines for the
-- database, not the `replication` ones: give the stream role no
-- `replication` line.
--
-- Once, as an administrator (this file does not create roles or schemas):
--
--   CREATE ROLE outbox_migrator LOGIN PASSWORD '...';
--   CREATE ROLE orders_app      LOGIN PASSWORD '...';
--   CREATE ROLE orders_relay    LOGIN PASSWORD '...';
--   CREATE SCHEMA orders AUTHORIZATION outbox_migrator;
--   -- or, to use the public schema: GRANT CREATE ON SCHEMA public TO outbox_migrator;
--
-- and, for the streaming relay only:
--
--   CREATE ROLE orders_stream LOGIN REPLICATION PASSWORD '...' IN ROLE orders_relay;
--   -- (Amazon RDS and Aurora: CREATE ROLE ... IN ROLE orders_relay, rds_replication)
--   -- CREATE PUBLICATION takes CREATE on the database; the migrator then
--   -- owns the publication, and keeps it when the privilege is revoked:
--   GRANT CREATE ON DATABASE orders TO outbox_migrator;
--   -- ... as outbox_migrator: migrations.Stream.Up, or the migration in
--   -- migrations/stream/ (CREATE PUBLICATION orders_outbox_event_fxoutbox
--   --     FOR TABLE orders.outbox_event WITH (publish = 'insert')) ...
--   REVOKE CREATE ON DATABASE orders FROM outbox_migrator;
--
-- The streaming relay connects as orders_stream. It creates its replication
-- slot itself; dropping it (outboxctl stream drop-slot) takes REPLICATION
-- too. This script needs nothing more for it: run it as below.
--
-- Then, after the migrations, run this file as the migrator (the owner of
-- the schema and the table) or as a superuser. Run it again after every new
-- migration: a column added later has no column privilege until then.
--
-- It is idempotent. It first takes away every privilege that PUBLIC, the
-- writer and the relay hold on the outbox objects (whatever earlier grants
-- or ALTER DEFAULT PRIVILEGES gave them), then grants exactly what each one
-- needs.
--
-- What needs no grant:
--   * The id column is an identity column: PostgreSQL draws its values
--     without checking privileges on the sequence, so nobody gets USAGE on
--     it (UPDATE on it would let a role setval() it and break every insert).
--   * LISTEN, NOTIFY / pg_notify (the writer's wake-up, the relay's
--     Listen), pg_try_advisory_xact_lock and hashtext (the relay's lanes)
--     and set_config (the relay's idle_in_transaction_session_timeout) are
--     open to every role. If your database revoked EXECUTE on built-in
--     functions from PUBLIC, grant it back to the roles for
--     pg_notify(text, text), pg_try_advisory_xact_lock(integer, integer),
--     hashtext(text) and set_config(text, text, boolean).
--   * Both roles need CONNECT on the database, which PUBLIC has by default.
--
-- The statements below use psql variables: :"name" is the variable quoted as
-- an identifier. Without psql, replace them by hand.

-- The migrations name the identity sequence <table>_id_seq and record the
-- applied versions in <table>_migrations.
\set id_seq :table '_id_seq'
\set versions :table '_migrations'

BEGIN;

-- The schema: both roles look the table up in it; none of them may create
-- objects in it (in PostgreSQL 14 and older, PUBLIC could create in the
-- public schema). PUBLIC keeps its USAGE, which other roles may rely on.
REVOKE CREATE ON SCHEMA :"schema" FROM PUBLIC;
REVOKE ALL ON SCHEMA :"schema" FROM :"writer", :"relay";
GRANT USAGE ON SCHEMA :"schema" TO :"writer", :"relay";

-- Start from nothing. Revoking a table privilege also revokes the same
-- privilege on each of its columns.
REVOKE ALL ON TABLE :"schema".:"table" FROM PUBLIC, :"writer", :"relay";
REVOKE ALL ON SEQUENCE :"schema".:"id_seq" FROM PUBLIC, :"writer", :"relay";
REVOKE ALL ON TABLE :"schema".:"versions" FROM PUBLIC, :"writer", :"relay";

-- The writer (unitofwork): INSERT of the event's own columns only, without
-- RETURNING. It cannot set the bookkeeping columns (published_at, parked_at,
-- attempts, last_error), backdate created_at, or choose the id (OVERRIDING
-- SYSTEM VALUE needs INSERT on id), so it cannot insert an event that looks
-- published, parked or old. A column added by a later migration is not
-- granted until you add it here.
GRANT INSERT (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, headers)
    ON TABLE :"schema".:"table" TO :"writer";

-- The relay: read (claim, backlog metrics, ListParked), mark published,
-- count attempts, park and requeue (UPDATE of the bookkeeping columns;
-- SELECT ... FOR UPDATE needs UPDATE on some column too), and delete
-- published rows after the retention (drop DELETE if Retention is negative).
GRANT SELECT, DELETE ON TABLE :"schema".:"table" TO :"relay";
GRANT UPDATE (published_at, attempts, last_error, parked_at) ON TABLE :"schema".:"table" TO :"relay";

-- Row-level security: the relay may delete only published or parked rows
-- (retention, and an operator deleting a parked event), never an event still
-- waiting to be sent. PostgreSQL has no row condition on a DELETE grant, so
-- the table gets row security and each role a policy. The table's owner (the
-- migrator) and superusers bypass it. A DELETE of unpublished rows by the
-- relay is not an error: it deletes nothing.
--
-- Row security applies to every role that is not the owner: a role that is
-- not named below (a reporting role, say) sees no rows until you give it a
-- policy, e.g. CREATE POLICY reporting_read ON ... FOR SELECT TO reporting USING (true).
ALTER TABLE :"schema".:"table" ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS fxoutbox_writer_insert ON :"schema".:"table";
DROP POLICY IF EXISTS fxoutbox_relay_select ON :"schema".:"table";
DROP POLICY IF EXISTS fxoutbox_relay_update ON :"schema".:"table";
DROP POLICY IF EXISTS fxoutbox_relay_delete ON :"schema".:"table";
CREATE POLICY fxoutbox_writer_insert ON :"schema".:"table" FOR INSERT TO :"writer"
    WITH CHECK (published_at IS NULL AND parked_at IS NULL);
CREATE POLICY fxoutbox_relay_select ON :"schema".:"table" FOR SELECT TO :"relay" USING (true);
CREATE POLICY fxoutbox_relay_update ON :"schema".:"table" FOR UPDATE TO :"relay" USING (true) WITH CHECK (true);
CREATE POLICY fxoutbox_relay_delete ON :"schema".:"table" FOR DELETE TO :"relay"
    USING (published_at IS NOT NULL OR parked_at IS NOT NULL);

-- The writer's business tables are yours to grant, for example:
--   GRANT SELECT, INSERT, UPDATE ON TABLE :"schema".orders TO :"writer";

COMMIT;
