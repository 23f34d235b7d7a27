-- The parked events go back into outbox_event, parked in their rows as a
-- marks relay parks them (with their old ids), before the table is dropped.
DO $$
BEGIN
    IF to_regclass('outbox_event_parked') IS NOT NULL THEN
        INSERT INTO outbox_event (id, event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, headers,
                                  created_at, attempts, last_error, parked_at) OVERRIDING SYSTEM VALUE
        SELECT p.id, p.event_id, p.aggregate_type, p.aggregate_id, p.event_type, p.payload, p.topic, p.partition_key, p.headers,
               coalesce(p.created_at, p.parked_at), p.attempts, p.reason, p.parked_at
          FROM outbox_event_parked p;
    END IF;
END
$$;
DROP TABLE IF EXISTS outbox_event_parked;
ALTER TABLE outbox_event DROP COLUMN IF EXISTS first_failed_at;
