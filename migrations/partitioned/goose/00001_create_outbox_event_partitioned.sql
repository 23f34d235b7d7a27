-- +goose Up
-- +goose StatementBegin
-- The outbox table, partitioned (opt-in, for new installs; docs/partitions.md).
-- It has the columns of the outbox migrations 1 to 3 and the txid column of
-- the cursor migration (migrations/cursor/, which runs on top of this one
-- and adds the lanes' positions): a partitioned table is relayed with cursor
-- progress (relay.ProgressCursor), whose relays drop whole partitions once
-- every lane delivered them, instead of deleting rows.
--
-- Partition key: event_id, by RANGE. The writer's event ids are UUIDv7,
-- whose first 48 bits are the time in milliseconds, so a range of ids is a
-- range of time and UNIQUE (event_id) holds across partitions. An id of
-- another version (a random v4 id) is refused by the CHECK below: its
-- "time" is random, and it would land in a partition that is dropped on
-- another day than its own, or pin the open-ended tail forever.
--
-- Partitions: <name>_head holds every id below the oldest partition (old
-- events inserted again), <name>_tail every id above the newest one (writes
-- while no relay made partitions ahead), and between them one partition per
-- interval, named <name>_p<lower bound, UTC, YYYYMMDD_HHMI>. This creates
-- the previous interval, the current one and 7 ahead; the relay keeps 7
-- ahead, and derives the interval from the partitions' bounds. There is no
-- DEFAULT partition. To choose another interval, change the step below (or
-- pass it to migrations.Partitioned) before the first run.
DO $$
DECLARE
    step  interval := interval '1 day'; -- fxoutbox:interval
    ahead constant integer := 7;
    t     regclass := to_regclass('"outbox_event"');
BEGIN
    IF t IS NOT NULL THEN
        IF (SELECT relkind FROM pg_class WHERE oid = t) <> 'p' THEN
            RAISE EXCEPTION 'cannot create % partitioned: a table of that name exists and is not partitioned. Keep it on DELETE retention, or move its rows into a new partitioned table (docs/partitions.md, "An existing table")', t;
        END IF;
        RETURN;
    END IF;
    IF step < interval '1 minute' OR extract(epoch FROM step) % 60 <> 0 THEN
        RAISE EXCEPTION 'the partitions'' interval % is not a whole number of minutes of at least one', step;
    END IF;
    CREATE TABLE "outbox_event" (
        id             bigint      GENERATED ALWAYS AS IDENTITY,
        event_id       uuid        NOT NULL,
        aggregate_type text        NOT NULL,
        aggregate_id   text        NOT NULL,
        event_type     text        NOT NULL,
        payload        jsonb       NOT NULL,
        topic          text        NOT NULL,
        partition_key  text        NOT NULL,
        -- Kafka headers of the event plus the W3C trace context of the writer.
        headers        jsonb,
        created_at     timestamptz NOT NULL DEFAULT now(),
        published_at   timestamptz,
        attempts       integer     NOT NULL DEFAULT 0,
        last_error     text,
        parked_at      timestamptz,
        txid           xid8        DEFAULT pg_current_xact_id(),
        -- A unique index of a partitioned table holds its partition key: id
        -- is unique by its identity, and indexed first here for lookups.
        PRIMARY KEY (id, event_id),
        UNIQUE (event_id),
        CONSTRAINT "outbox_event_event_id_v7" CHECK (substr(event_id::text, 15, 1) = '7')
    ) PARTITION BY RANGE (event_id);
    CREATE INDEX "outbox_event_unpublished_idx" ON "outbox_event" (id) WHERE published_at IS NULL;
    CREATE INDEX "outbox_event_created_brin" ON "outbox_event" USING brin (created_at);
    CREATE INDEX "outbox_event_parked_idx" ON "outbox_event" (id) WHERE parked_at IS NOT NULL;
    CREATE INDEX "outbox_event_txid_idx" ON "outbox_event" (txid, id);
    DECLARE
        ms     bigint := (extract(epoch FROM step) * 1000)::bigint;
        lo     bigint := floor(extract(epoch FROM now()) * 1000 / ms)::bigint * ms - ms;
        schem  text := (SELECT nspname FROM pg_namespace n JOIN pg_class c ON c.relnamespace = n.oid WHERE c.oid = to_regclass('"outbox_event"'));
        base   text := (SELECT relname FROM pg_class WHERE oid = to_regclass('"outbox_event"'));
        bound  text;
        hi  text;
    BEGIN
        bound := (SELECT format('%s-%s-0000-0000-000000000000', substr(h, 1, 8), substr(h, 9, 4)) FROM lpad(to_hex(lo), 12, '0') h);
        EXECUTE format('CREATE TABLE %I.%I PARTITION OF "outbox_event" FOR VALUES FROM (MINVALUE) TO (%L)', schem, left(base, 58) || '_head', bound);
        FOR i IN 0 .. ahead + 1 LOOP
            hi := (SELECT format('%s-%s-0000-0000-000000000000', substr(h, 1, 8), substr(h, 9, 4)) FROM lpad(to_hex(lo + ms), 12, '0') h);
            EXECUTE format('CREATE TABLE %I.%I PARTITION OF "outbox_event" FOR VALUES FROM (%L) TO (%L)', schem,
                left(base, 48) || '_p' || to_char(to_timestamp(lo / 1000.0) AT TIME ZONE 'UTC', 'YYYYMMDD_HH24MI'), bound, hi);
            lo := lo + ms;
            bound := hi;
        END LOOP;
        EXECUTE format('CREATE TABLE %I.%I PARTITION OF "outbox_event" FOR VALUES FROM (%L) TO (MAXVALUE)', schem, left(base, 58) || '_tail', bound);
    END;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
-- Drops the partitioned table with every partition and its rows.
DROP TABLE IF EXISTS "outbox_event";
-- +goose StatementEnd
