-- +goose Up
-- +goose StatementBegin
-- The transactional outbox: a handler inserts rows in its business
-- transaction; the relay publishes rows whose published_at is NULL to Kafka
-- and then sets it.
CREATE TABLE "outbox_event" (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id       uuid        NOT NULL UNIQUE,
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    event_type     text        NOT NULL,
    payload        jsonb       NOT NULL,
    topic          text        NOT NULL,
    partition_key  text        NOT NULL,
    -- Kafka headers of the event plus the W3C trace context of the writer.
    headers        jsonb,
    created_at     timestamptz NOT NULL DEFAULT now(),
    published_at   timestamptz
);

-- The relay only ever reads unpublished rows in id order: a partial index
-- keeps each poll proportional to the backlog, not to the table.
CREATE INDEX "outbox_event_unpublished_idx"
    ON "outbox_event" (id)
    WHERE published_at IS NULL;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DROP TABLE IF EXISTS "outbox_event";
-- +goose StatementEnd
