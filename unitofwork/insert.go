package unitofwork

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fxoutbox/outbox"
)

type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// inserter writes outbox rows: one event with a plain VALUES insert, several
// with one INSERT ... SELECT FROM unnest(...) — one round trip either way.
// Both statements are constant text, so pgx prepares and caches them.
type inserter struct{ one, many string }

const columns = "(event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, headers)"

func newInserter(t outbox.Table) inserter {
	return inserter{
		one: "INSERT INTO " + t.Ident() + " " + columns + " VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
		many: "INSERT INTO " + t.Ident() + " " + columns +
			" SELECT u.event_id, u.aggregate_type, u.aggregate_id, u.event_type, u.payload::jsonb, u.topic, u.partition_key, u.headers::jsonb" +
			" FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[])" +
			" WITH ORDINALITY AS u(event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, headers, n)" +
			" ORDER BY u.n",
	}
}

func (in inserter) exec(ctx context.Context, db execer, recs []outbox.Record) error {
	if len(recs) == 1 {
		r := recs[0]
		_, err := db.Exec(ctx, in.one, r.ID, r.AggregateType, r.AggregateID, r.Type, r.Payload, r.Topic, r.Key, headersArg(r.Headers))
		return err
	}
	var (
		ids                             = make([][16]byte, len(recs))
		aggTypes, aggIDs, types, topics = make([]string, len(recs)), make([]string, len(recs)), make([]string, len(recs)), make([]string, len(recs))
		keys                            = make([]string, len(recs))
		payloads                        = make([][]byte, len(recs)) // sent as text: no copy of each payload
		headers                         = make([]*string, len(recs))
	)
	for i, r := range recs {
		ids[i] = r.ID
		aggTypes[i], aggIDs[i], types[i], topics[i], keys[i] = r.AggregateType, r.AggregateID, r.Type, r.Topic, r.Key
		payloads[i] = r.Payload
		if h := headersArg(r.Headers); h != nil {
			s := string(h)
			headers[i] = &s
		}
	}
	_, err := db.Exec(ctx, in.many, ids, aggTypes, aggIDs, types, payloads, topics, keys, headers)
	return err
}

// headersArg encodes headers as a JSON object, or nil (SQL NULL) when empty.
func headersArg(h map[string]string) []byte {
	if len(h) == 0 {
		return nil
	}
	return outbox.EncodeHeaders(h)
}

var _ execer = pgx.Tx(nil)
