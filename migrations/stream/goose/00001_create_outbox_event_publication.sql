-- +goose Up
-- +goose StatementBegin
-- The publication through which the streaming relay (relay.Stream) reads the
-- outbox table's inserts from its logical replication slot, with the
-- built-in pgoutput plugin. Inserts only: the relay's own updates
-- (published_at, attempts, parked_at) and retention's deletes must not come
-- back to it through the stream.
--
-- Run it as the table's owner, which also needs CREATE on the database
-- (CREATE PUBLICATION asks for it; it may be revoked afterwards). The relay
-- creates its slot itself; it never creates this publication.
CREATE PUBLICATION "outbox_event_fxoutbox" FOR TABLE "outbox_event" WITH (publish = 'insert');
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
-- Drops the publication only. The streaming relay's replication slot is a
-- separate object, and it keeps WAL on the server's disk until it is
-- dropped: stop the streaming relays, then drop it with
-- `outboxctl stream drop-slot` (`outboxctl stream status` names it).
DROP PUBLICATION IF EXISTS "outbox_event_fxoutbox";
-- +goose StatementEnd
