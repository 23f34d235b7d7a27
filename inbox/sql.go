package inbox

import (
	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
)

// statements are the consumer's SQL for its configured tables.
type statements struct {
	insert, park     string
	insertMany       string
	cleanup, counted string
}

func newStatements(t outbox.Table) statements {
	in := sqlname.Ident(t)
	parked := sqlname.Ident(outbox.Table{Schema: t.Schema, Name: t.Name + "_parked"})
	return statements{
		insert: `INSERT INTO ` + in + ` (consumer, event_id, topic, "partition", "offset") VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING`,
		insertMany: `INSERT INTO ` + in + ` (consumer, event_id, topic, "partition", "offset")
			SELECT $1, e, t, p, o FROM unnest($2::text[], $3::text[], $4::integer[], $5::bigint[]) AS r(e, t, p, o)
			ON CONFLICT DO NOTHING RETURNING event_id`,
		park: `INSERT INTO ` + parked + ` (consumer, event_id, event_type, topic, "partition", "offset", key, value, headers, "timestamp", attempts, error_type, last_error)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
			ON CONFLICT (consumer, topic, "partition", "offset") DO UPDATE
			SET attempts = EXCLUDED.attempts, error_type = EXCLUDED.error_type, last_error = EXCLUDED.last_error, parked_at = now()
			RETURNING id, parked_at, xmax = 0`,
		cleanup: `DELETE FROM ` + in + ` WHERE ctid = ANY (ARRAY(SELECT ctid FROM ` + in +
			` WHERE consumer = $1 AND processed_at < now() - $2::interval LIMIT $3))`,
		counted: `SELECT count(*) FROM (SELECT 1 FROM ` + parked + ` WHERE consumer = $1 LIMIT 1000000) p`,
	}
}
