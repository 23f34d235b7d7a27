-- Least-privilege grants for an inbox consumer: an example to adapt.
--
-- This is NOT a migration (no version prefix: migrations.Inbox.Up,
-- golang-migrate, goose and tern skip it). Run it with psql after the inbox
-- migrations, as the role that owns the inbox tables (the migrator):
--
--   psql "$DATABASE_URL" -v ON_ERROR_STOP=1 \
--        -v schema=billing -v table=outbox_inbox -v consumer=billing_app \
--        -f migrations/inbox/roles.example.sql
--
-- The consumer role runs the inbox (package inbox, fxoutbox.InboxModule):
-- it records (consumer, event id) rows, deletes its old ones (retention),
-- parks records, and lists, retries and deletes parked records. Its
-- handlers also write the outbox (grant it the writer's privileges of
-- ../roles.example.sql), as does parking with a dead-letter topic
-- (Config.DeadLetterTopic), and its own business tables (yours to grant).
-- It cannot rewrite an inbox row (no UPDATE): it cannot make an applied
-- event look like another one, only forget rows, which is what retention
-- does.
--
-- What needs no grant: the parked table's id is an identity column (no
-- privilege on its sequence is needed, and none is given); the start-up
-- check that the tables exist (to_regclass) needs only USAGE on the schema.
--
-- It is idempotent: it takes away every privilege PUBLIC and the consumer
-- hold on the inbox objects, then grants exactly what the consumer needs.

\set parked :table '_parked'
\set parked_seq :table '_parked_id_seq'
\set versions :table '_migrations'

BEGIN;

GRANT USAGE ON SCHEMA :"schema" TO :"consumer";

REVOKE ALL ON TABLE :"schema".:"table" FROM PUBLIC, :"consumer";
REVOKE ALL ON TABLE :"schema".:"parked" FROM PUBLIC, :"consumer";
REVOKE ALL ON SEQUENCE :"schema".:"parked_seq" FROM PUBLIC, :"consumer";
REVOKE ALL ON TABLE :"schema".:"versions" FROM PUBLIC, :"consumer";

-- The inbox rows: INSERT ... ON CONFLICT DO NOTHING (no other privilege
-- needed), and SELECT with DELETE for the retention deletes. processed_at
-- is not granted for INSERT: rows cannot be backdated or postdated.
GRANT INSERT (consumer, event_id, topic, "partition", "offset") ON TABLE :"schema".:"table" TO :"consumer";
GRANT SELECT, DELETE ON TABLE :"schema".:"table" TO :"consumer";

-- Parked records: INSERT ... ON CONFLICT DO UPDATE of the failure columns
-- (a record parked again), SELECT (List, and ON CONFLICT), DELETE (Retry
-- and Delete).
GRANT INSERT (consumer, event_id, event_type, topic, "partition", "offset", key, value, headers, "timestamp", attempts, error_type, last_error)
    ON TABLE :"schema".:"parked" TO :"consumer";
GRANT UPDATE (attempts, error_type, last_error, parked_at) ON TABLE :"schema".:"parked" TO :"consumer";
GRANT SELECT, DELETE ON TABLE :"schema".:"parked" TO :"consumer";

COMMIT;
