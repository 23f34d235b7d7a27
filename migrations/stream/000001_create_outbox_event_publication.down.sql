-- Drops the publication only. The streaming relay's replication slot is a
-- separate object, and it keeps WAL on the server's disk until it is
-- dropped: stop the streaming relays, then drop it with
-- `outboxctl stream drop-slot` (`outboxctl stream status` names it).
DROP PUBLICATION IF EXISTS outbox_event_fxoutbox;
