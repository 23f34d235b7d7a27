DROP INDEX IF EXISTS outbox_event_created_brin;
