-- Least-privilege roles for cursor progress (relay.ProgressCursor): what the
-- relay role needs beyond migrations/roles.example.sql. An example to adapt,
-- NOT a migration (no version prefix: the migration tools skip it).
--
-- Run it after the cursor migration (migrations.Cursor.Up) and after
-- migrations/roles.example.sql, as the migrator, each time you run that one
-- (it takes these grants back and recreates the relay's delete policy):
--
--   psql "$DATABASE_URL" -v ON_ERROR_STOP=1 \
--        -v schema=orders -v table=outbox_event \
--        -v writer=orders_app -v relay=orders_relay \
--        -f migrations/roles.example.sql -f migrations/cursor/roles.example.sql
--
-- On a partitioned table (migrations.Partitioned), run
-- migrations/partitioned/roles.example.sql after this one: the relay's
-- partition upkeep takes the table's owner.
--
-- The writer needs nothing more: txid is set by its default, which asks no
-- privilege. outboxctl cursor rebase (after a restore into another cluster)
-- deletes the positions: run it as the migrator.

\set cursor :table '_cursor'
\set parked :table '_parked'

BEGIN;

REVOKE ALL ON TABLE :"schema".:"cursor" FROM PUBLIC, :"writer", :"relay";
REVOKE ALL ON TABLE :"schema".:"parked" FROM PUBLIC, :"writer", :"relay";

-- The relay reads the lanes' positions, creates the rows of lanes that have
-- none (at its first start, or after a rebase) and writes them once per batch.
GRANT SELECT, INSERT, UPDATE ON TABLE :"schema".:"cursor" TO :"relay";

-- Requeue and replay on a cursor table give the row a new txid, which the
-- next window of its lane takes (outboxctl and admin connect as the relay).
GRANT UPDATE (txid) ON TABLE :"schema".:"table" TO :"relay";

-- Parking moves a poison event to the parked table (a copy, then the row is
-- deleted; a copy of the same event is replaced), and a failed event's row
-- keeps when it first failed. outboxctl parked requeue (connected as the
-- relay) writes the event back into the table and deletes it there;
-- outboxctl parked delete deletes it.
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE :"schema".:"parked" TO :"relay";
GRANT UPDATE (first_failed_at) ON TABLE :"schema".:"table" TO :"relay";
GRANT INSERT (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, headers, created_at, attempts, last_error)
    ON TABLE :"schema".:"table" TO :"relay";

-- The relay inserts into the table only the events that are parked
-- (requeue: the statement that inserts the row still sees its parked copy).
DROP POLICY IF EXISTS fxoutbox_relay_requeue ON :"schema".:"table";
CREATE POLICY fxoutbox_relay_requeue ON :"schema".:"table" FOR INSERT TO :"relay"
    WITH CHECK (published_at IS NULL AND parked_at IS NULL
        AND event_id IN (SELECT p.event_id FROM :"schema".:"parked" p));

-- Retention: a delivered row keeps published_at NULL, so the relay may also
-- delete the rows its lane's position holds (its done snapshot sees the
-- row's transaction), never one still waiting; and parking: a row whose
-- copy is in the parked table (written by an earlier statement of the
-- parking transaction).
DROP POLICY IF EXISTS fxoutbox_relay_delete ON :"schema".:"table";
CREATE POLICY fxoutbox_relay_delete ON :"schema".:"table" FOR DELETE TO :"relay"
    USING (published_at IS NOT NULL OR parked_at IS NOT NULL OR EXISTS (
        SELECT FROM :"schema".:"cursor" c
         WHERE c.lane = ((hashtext(partition_key) & 2147483647) % c.lanes)
           AND pg_visible_in_snapshot(txid, c.done))
        OR (id, event_id) IN (SELECT p.id, p.event_id FROM :"schema".:"parked" p));

COMMIT;
