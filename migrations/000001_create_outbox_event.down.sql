DROP TABLE IF EXISTS outbox_event;
