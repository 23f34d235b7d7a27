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
--   writer    the application's handlers: INSERT into the outbox, plus what
--             its own business tables need. It cannot read, change or delete
--             events, so it cannot forge what the relay has already seen.
--   relay     the publisher: reads the outbox, marks events published,
--             records failed attempts, parks events and deletes old ones. It
--             can change only the bookkeeping columns (published_at,
--             attempts, last_error, parked_at), never an event's payload,
--             topic, key or headers, and cannot add events.
--
-- Once, as an administrator (this file does not create roles or schemas):
--
--   CREATE ROLE outbox_migrator LOGIN PASSWORD '...';
--   CREATE ROLE orders_app      LOGIN PASSWORD '...';
--   CREATE ROLE orders_relay    LOGIN PASSWORD '...';
--   CREATE SCHEMA orders AUTHORIZATION outbox_migrator;
--   -- or, to use the public schema: GRANT CREATE ON SCHEMA public TO outbox_migrator;
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

-- The writer (unitofwork): INSERT only, without RETURNING.
GRANT INSERT ON TABLE :"schema".:"table" TO :"writer";

-- The relay: read (claim, backlog metrics, ListParked), mark published,
-- count attempts, park and requeue (UPDATE of the bookkeeping columns;
-- SELECT ... FOR UPDATE needs UPDATE on some column too), and delete
-- published rows after the retention (drop DELETE if Retention is negative).
GRANT SELECT, DELETE ON TABLE :"schema".:"table" TO :"relay";
GRANT UPDATE (published_at, attempts, last_error, parked_at) ON TABLE :"schema".:"table" TO :"relay";

-- The writer's business tables are yours to grant, for example:
--   GRANT SELECT, INSERT, UPDATE ON TABLE :"schema".orders TO :"writer";

COMMIT;
