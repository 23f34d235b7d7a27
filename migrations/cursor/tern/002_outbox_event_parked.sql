-- Parked events of a cursor table (relay.ProgressCursor): a poison event
-- (one no retry can send, or that failed MaxAttempts times) is moved here,
-- INSERT here and DELETE from "outbox_event", in the transaction that moves
-- its lane's position past it, so the outbox table's rows are only ever
-- inserted and deleted. A row holds everything the relay needs to send the
-- event again: `outboxctl parked requeue` (admin.Requeue) inserts it back
-- into "outbox_event" (a new id, the same event_id, a new txid, which the next
-- window of its lane takes) and deletes it here, in one transaction.
--
-- id is the row's id in "outbox_event" when it was parked (the paging key of
-- `outboxctl parked list`); reason is the stable text of the cause that
-- `outboxctl status` groups by ("[<error.type>] <message>", see
-- relay.Reason), last_error the last try's own error; first_try_at and
-- last_try_at are the first and the last failed try (first_try_at is NULL
-- for an event parked in its row by an older relay). The table is plain:
-- it does not depend on how "outbox_event" is stored (partitioned or not).
CREATE TABLE IF NOT EXISTS "outbox_event_parked" (
    id             bigint      PRIMARY KEY,
    event_id       uuid        NOT NULL UNIQUE,
    aggregate_type text,
    aggregate_id   text,
    event_type     text,
    payload        jsonb,
    topic          text,
    partition_key  text,
    headers        jsonb,
    created_at     timestamptz,
    reason         text        NOT NULL,
    last_error     text,
    attempts       integer     NOT NULL,
    first_try_at   timestamptz,
    last_try_at    timestamptz NOT NULL,
    parked_at      timestamptz NOT NULL DEFAULT now()
);

-- When an event first failed, kept in its row while it is retried (only a
-- failed event's row is written), so that the parked copy says so.
ALTER TABLE "outbox_event" ADD COLUMN IF NOT EXISTS first_failed_at timestamptz;

-- Events an older cursor relay parked in their rows (parked_at) move here
-- when the table is already in cursor mode (its lanes have positions); the
-- first cursor relay moves them otherwise, when it creates the positions.
INSERT INTO "outbox_event_parked" (id, event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, headers,
                                 created_at, reason, last_error, attempts, last_try_at, parked_at)
SELECT e.id, e.event_id, e.aggregate_type, e.aggregate_id, e.event_type, e.payload, e.topic, e.partition_key, e.headers,
       e.created_at, coalesce(e.last_error, ''), e.last_error, e.attempts, e.parked_at, e.parked_at
  FROM "outbox_event" e
 WHERE e.parked_at IS NOT NULL AND e.published_at IS NULL AND EXISTS (SELECT FROM "outbox_event_cursor")
ON CONFLICT DO NOTHING;
DELETE FROM "outbox_event" e
 WHERE e.parked_at IS NOT NULL AND e.published_at IS NULL
   AND EXISTS (SELECT FROM "outbox_event_parked" p WHERE p.id = e.id AND p.event_id = e.event_id);

---- create above / drop below ----

-- The parked events go back into "outbox_event", parked in their rows as a
-- marks relay parks them (with their old ids), before the table is dropped.
DO $$
BEGIN
    IF to_regclass('"outbox_event_parked"') IS NOT NULL THEN
        INSERT INTO "outbox_event" (id, event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, headers,
                                  created_at, attempts, last_error, parked_at) OVERRIDING SYSTEM VALUE
        SELECT p.id, p.event_id, p.aggregate_type, p.aggregate_id, p.event_type, p.payload, p.topic, p.partition_key, p.headers,
               coalesce(p.created_at, p.parked_at), p.attempts, p.reason, p.parked_at
          FROM "outbox_event_parked" p;
    END IF;
END
$$;
DROP TABLE IF EXISTS "outbox_event_parked";
ALTER TABLE "outbox_event" DROP COLUMN IF EXISTS first_failed_at;
