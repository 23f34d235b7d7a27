-- Drops the partitioned table with every partition and its rows.
DROP TABLE IF EXISTS outbox_event;
