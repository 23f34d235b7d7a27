-- Least-privilege roles for a partitioned outbox table (migrations.Partitioned,
-- docs/partitions.md): what the relay needs beyond migrations/roles.example.sql
-- and migrations/cursor/roles.example.sql to run the partitions' upkeep. An
-- example to adapt, NOT a migration (no version prefix: the migration tools
-- skip it).
--
-- Creating, attaching, detaching and dropping partitions, and commenting on
-- them, takes the ownership of the partitioned table: PostgreSQL has no
-- privilege to grant for it. So the table gets an owner of its own, a role
-- that nobody logs in as, and the relay becomes a member of it:
--
--   owner     (NOLOGIN) owns the outbox table and every partition of it. It
--             may create tables in the schema (the new partitions), and
--             read the lanes' positions (a partition goes only when every
--             lane delivered its rows).
--   migrator  a member of owner: it hands the table over (below) and keeps
--             running the migrations, which need the owner's privileges.
--   relay     a member of owner, and NOINHERIT: it does not hold the owner's
--             privileges in its sessions, so its reads and writes of the
--             events stay bound by the grants and row-level policies of the
--             other two scripts. The relay's upkeep switches to the owner
--             (SET LOCAL ROLE) for its own transactions only, so the
--             partitions it makes belong to the owner as their siblings do.
--
-- A member of the owning role can take its privileges whenever it wants
-- (SET ROLE): NOINHERIT keeps mistakes out, not a relay that is taken over.
-- To keep the relay's sessions without that power, give it no membership and
-- run the upkeep in a separate process that connects as a member of owner:
-- Relay.MaintainPartitions on a relay that is never started, every
-- CleanupInterval. The writer gets nothing here: it cannot change the
-- partitions, and its inserts through the table need no privilege on them.
--
-- Once, as an administrator (this file does not create roles):
--
--   CREATE ROLE orders_outbox_owner NOLOGIN;
--   GRANT orders_outbox_owner TO outbox_migrator;
--   GRANT orders_outbox_owner TO orders_relay;
--   ALTER ROLE orders_relay NOINHERIT;
--
-- (PostgreSQL 16 and later can instead keep the relay INHERIT and grant the
-- membership alone without inheritance: GRANT orders_outbox_owner TO
-- orders_relay WITH INHERIT FALSE.)
--
-- Then, after the migrations and the other two scripts, run this one as the
-- migrator, each time you run them:
--
--   psql "$DATABASE_URL" -v ON_ERROR_STOP=1 \
--        -v schema=orders -v table=outbox_event \
--        -v writer=orders_app -v relay=orders_relay -v owner=orders_outbox_owner \
--        -f migrations/roles.example.sql -f migrations/cursor/roles.example.sql \
--        -f migrations/partitioned/roles.example.sql
--
-- It is idempotent. A relay that is not a member of the owning role fails its
-- upkeep with PostgreSQL's "must be owner of table" and says what to grant.

\set cursor :table '_cursor'

BEGIN;

-- The owner creates the new partitions in the table's schema; ALTER ... OWNER
-- TO needs that privilege of the new owner too.
GRANT USAGE, CREATE ON SCHEMA :"schema" TO :"owner";

-- A partition goes once every lane delivered its rows: the check reads the
-- lanes' positions as the owner.
GRANT SELECT ON TABLE :"schema".:"cursor" TO :"owner";

-- The table and each partition (ALTER TABLE ... OWNER TO does not recurse into
-- partitions); their indexes and the identity sequence follow their table.
SELECT set_config('fxoutbox.table', format('%I.%I', :'schema', :'table'), true),
       set_config('fxoutbox.owner', :'owner', true);
DO $$
DECLARE
    part regclass;
BEGIN
    FOR part IN SELECT relid FROM pg_partition_tree(current_setting('fxoutbox.table')::regclass) LOOP
        EXECUTE format('ALTER TABLE %s OWNER TO %I', part, current_setting('fxoutbox.owner'));
    END LOOP;
END
$$;

COMMIT;
