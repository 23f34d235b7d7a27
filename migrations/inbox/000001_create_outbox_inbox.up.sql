-- The inbox: one row per event a consumer has applied (or parked). The
-- consumer's transaction inserts its row before the handler runs, with
-- ON CONFLICT DO NOTHING: a row that already exists means the event was
-- applied, and the record is skipped. A second transaction inserting the
-- same (consumer, event_id) while the first is open waits on the primary
-- key, then skips (first committed) or applies (first rolled back).
CREATE TABLE outbox_inbox (
    consumer     text        NOT NULL,
    -- x-event-id, or the identity the consumer's Identity gives a record
    -- without one (e.g. "topic/partition/offset").
    event_id     text        NOT NULL,
    topic        text        NOT NULL,
    "partition"  integer     NOT NULL,
    "offset"     bigint      NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);
-- Retention deletes rows older than the consumer's Retention. Rows are
-- appended in processed_at order, so a BRIN index finds old ones cheaply.
CREATE INDEX outbox_inbox_brin
    ON outbox_inbox USING brin (processed_at);

-- Records the handler kept failing on (after MaxAttempts) or that could not
-- be identified, set aside with what it takes to apply them later.
CREATE TABLE outbox_inbox_parked (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer     text        NOT NULL,
    event_id     text,
    event_type   text,
    topic        text        NOT NULL,
    "partition"  integer     NOT NULL,
    "offset"     bigint      NOT NULL,
    key          bytea,
    value        bytea,
    headers      jsonb,
    "timestamp"  timestamptz,
    attempts     integer     NOT NULL,
    error_type   text        NOT NULL,
    last_error   text        NOT NULL,
    parked_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE (consumer, topic, "partition", "offset")
);
