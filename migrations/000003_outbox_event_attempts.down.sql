DROP INDEX IF EXISTS outbox_event_parked_idx;
ALTER TABLE outbox_event
    DROP COLUMN IF EXISTS parked_at,
    DROP COLUMN IF EXISTS last_error,
    DROP COLUMN IF EXISTS attempts;
