-- The publication through which the streaming relay (relay.Stream) reads the
-- outbox table's inserts from its logical replication slot, with the
-- built-in pgoutput plugin. Inserts only: the relay's own updates
-- (published_at, attempts, parked_at) and retention's deletes must not come
-- back to it through the stream.
--
-- Run it as the table's owner, which also needs CREATE on the database
-- (CREATE PUBLICATION asks for it; it may be revoked afterwards). The relay
-- creates its slot itself; it never creates this publication.
CREATE PUBLICATION outbox_event_fxoutbox FOR TABLE outbox_event WITH (publish = 'insert');
