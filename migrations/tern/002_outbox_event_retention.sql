-- The relay deletes published rows older than its retention. Rows are
-- appended in created_at order, so a BRIN index finds the old ones by block
-- range at almost no cost to inserts.
CREATE INDEX "outbox_event_created_brin"
    ON "outbox_event" USING brin (created_at);

---- create above / drop below ----

DROP INDEX IF EXISTS "outbox_event_created_brin";
