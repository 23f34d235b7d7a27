-- +goose Up
-- +goose StatementBegin
-- Failure bookkeeping. attempts and last_error count only errors that will
-- fail again for this event (too large, invalid or missing topic, rejected
-- record); an unavailable broker is never held against an event. A parked
-- event stopped being retried after its attempts ran out: it no longer
-- blocks its key, and stays until an operator requeues or deletes it.
ALTER TABLE "outbox_event"
    ADD COLUMN attempts   integer     NOT NULL DEFAULT 0,
    ADD COLUMN last_error text,
    ADD COLUMN parked_at  timestamptz;

CREATE INDEX "outbox_event_parked_idx"
    ON "outbox_event" (id)
    WHERE parked_at IS NOT NULL;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DROP INDEX IF EXISTS "outbox_event_parked_idx";
ALTER TABLE "outbox_event"
    DROP COLUMN IF EXISTS parked_at,
    DROP COLUMN IF EXISTS last_error,
    DROP COLUMN IF EXISTS attempts;
-- +goose StatementEnd
