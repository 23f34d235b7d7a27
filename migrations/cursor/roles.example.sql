-- Least-privilege roles for cursor progress (relay.ProgressCursor): what the
-- relay role needs beyond migrations/roles.example.sql. An example to adapt,
-- NOT a migration (no version prefix: the migration tools skip it).
--
-- Run it after the cursor migration (migrations.UpCursor) and after
-- migrations/roles.example.sql, as the migrator, each time you run that one
-- (it takes these grants back and recreates the relay's delete policy):
--
--   psql "$DATABASE_URL" -v ON_ERROR_STOP=1 \
--        -v schema=orders -v table=outbox_event \
--        -v writer=orders_app -v relay=orders_relay \
--        -f migrations/roles.example.sql -f migrations/cursor/roles.example.sql
--
-- The writer needs nothing more: txid is set by its default, which asks no
-- privilege. outboxctl cursor rebase (after a restore into another cluster)
-- deletes the positions: run it as the migrator.

\set cursor :table '_cursor'

BEGIN;

REVOKE ALL ON TABLE :"schema".:"cursor" FROM PUBLIC, :"writer", :"relay";

-- The relay reads the lanes' positions, creates the rows of lanes that have
-- none (at its first start, or after a rebase) and writes them once per batch.
GRANT SELECT, INSERT, UPDATE ON TABLE :"schema".:"cursor" TO :"relay";

-- Requeue and replay on a cursor table give the row a new txid, which the
-- next window of its lane takes (outboxctl and admin connect as the relay).
GRANT UPDATE (txid) ON TABLE :"schema".:"table" TO :"relay";

-- Retention: a delivered row keeps published_at NULL, so the relay may also
-- delete the rows its lane's position holds (its done snapshot sees the
-- row's transaction), never one still waiting.
DROP POLICY IF EXISTS fxoutbox_relay_delete ON :"schema".:"table";
CREATE POLICY fxoutbox_relay_delete ON :"schema".:"table" FOR DELETE TO :"relay"
    USING (published_at IS NOT NULL OR parked_at IS NOT NULL OR EXISTS (
        SELECT FROM :"schema".:"cursor" c
         WHERE c.lane = ((hashtext(partition_key) & 2147483647) % c.lanes)
           AND pg_visible_in_snapshot(txid, c.done)));

COMMIT;
