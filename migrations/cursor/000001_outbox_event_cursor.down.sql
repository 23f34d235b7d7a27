-- Back to marks mode. Events the cursor delivered keep published_at NULL,
-- and a marks relay would send them again: stop the cursor relays once
-- `outboxctl status` shows no backlog, mark what they delivered
-- (UPDATE outbox_event SET published_at = now() WHERE published_at IS NULL
-- AND parked_at IS NULL), then revert this and start the marks relays.
DROP TABLE IF EXISTS outbox_event_cursor;
ALTER TABLE outbox_event ALTER COLUMN txid DROP DEFAULT;
ALTER TABLE outbox_event DROP COLUMN IF EXISTS txid;
