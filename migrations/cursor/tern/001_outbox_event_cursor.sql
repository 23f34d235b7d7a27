-- Cursor progress (relay.ProgressCursor): the relay records where each lane
-- stands instead of marking each event published. An event then costs the
-- table one INSERT: no UPDATE, no dead tuple, no second entry in any index.
--
-- txid is the writing transaction's id, set by its default: the relay
-- delivers, per lane, the events whose transactions committed between two
-- snapshots (PgQ's batches), so an open transaction holds back only its own
-- events. The column is added without a value for the rows already there (a
-- change of the catalog only, no rewrite); the relay delivers those rows
-- only while they are unpublished in marks mode, so publish them (run the
-- relay in marks mode until `outboxctl status` shows no backlog) before the
-- first cursor relay starts. On a large table, build the index first with
-- CREATE INDEX CONCURRENTLY (same name), so this file finds it there.
ALTER TABLE "outbox_event" ADD COLUMN IF NOT EXISTS txid xid8;
ALTER TABLE "outbox_event" ALTER COLUMN txid SET DEFAULT pg_current_xact_id();
CREATE INDEX IF NOT EXISTS "outbox_event_txid_idx" ON "outbox_event" (txid, id);

-- One row per lane: the snapshot up to which the lane is delivered (done),
-- the window being delivered (done, upto] with the position in it (pos, and
-- the ids past pos already sent, skip), the highest id visible when it
-- opened (top), and base, the highest id the lane's last window reached. The relay writes the rows of its lanes once per
-- batch; nothing else writes them.
CREATE TABLE IF NOT EXISTS "outbox_event_cursor" (
    lane       integer     PRIMARY KEY,
    lanes      integer     NOT NULL,
    done       pg_snapshot NOT NULL,
    upto       pg_snapshot,
    base       bigint      NOT NULL,
    pos        bigint      NOT NULL DEFAULT 0,
    floor      bigint      NOT NULL DEFAULT 0,
    top        bigint      NOT NULL DEFAULT 0,
    skip       bigint[]    NOT NULL DEFAULT '{}',
    updated_at timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 50);

---- create above / drop below ----

-- Back to marks mode. Events the cursor delivered keep published_at NULL,
-- and a marks relay would send them again: stop the cursor relays once
-- `outboxctl status` shows no backlog, mark what they delivered
-- (UPDATE "outbox_event" SET published_at = now() WHERE published_at IS NULL
-- AND parked_at IS NULL), then revert this and start the marks relays.
DROP TABLE IF EXISTS "outbox_event_cursor";
ALTER TABLE "outbox_event" ALTER COLUMN txid DROP DEFAULT;
ALTER TABLE "outbox_event" DROP COLUMN IF EXISTS txid;
