DROP TABLE IF EXISTS outbox_inbox_parked;
DROP TABLE IF EXISTS outbox_inbox;
