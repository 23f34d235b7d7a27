package unitofwork

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/record"
	"github.com/fxoutbox/outbox/internal/sqlname"
)

type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// inserter writes outbox rows: one event with a plain VALUES insert, several
// with one INSERT ... SELECT FROM unnest(...) — one round trip either way.
// Both statements are constant text, so pgx prepares and caches them.
//
// The watched variants also return the transaction's id, for AddTx's commit
// watcher, in the same round trip: "WITH ... INSERT" runs the insert once
// and needs no SELECT privilege on the table.
type inserter struct{ one, many, oneWatched, manyWatched string }

const columns = "(event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, headers)"

func newInserter(t outbox.Table) inserter {
	in := inserter{
		one: "INSERT INTO " + sqlname.Ident(t) + " " + columns + " VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
		many: "INSERT INTO " + sqlname.Ident(t) + " " + columns +
			" SELECT u.event_id, u.aggregate_type, u.aggregate_id, u.event_type, u.payload::jsonb, u.topic, u.partition_key, u.headers::jsonb" +
			" FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[])" +
			" WITH ORDINALITY AS u(event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, headers, n)" +
			" ORDER BY u.n",
	}
	const xid = ") SELECT pg_current_xact_id()::text::bigint"
	in.oneWatched, in.manyWatched = "WITH ins AS ("+in.one+xid, "WITH ins AS ("+in.many+xid
	return in
}

// queryRower runs the watched variants.
type queryRower interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// exec inserts recs. With xid set, it runs the watched variant and stores
// the transaction's id in *xid.
func (in inserter) exec(ctx context.Context, db execer, recs []record.Record) error {
	return in.run(ctx, db, recs, nil)
}

func (in inserter) run(ctx context.Context, db execer, recs []record.Record, xid *int64) error {
	do := func(one, watched string, args ...any) (err error) {
		defer func() { err = notV7(err, recs) }()
		if xid == nil {
			_, err := db.Exec(ctx, one, args...)
			return err
		}
		return db.(queryRower).QueryRow(ctx, watched, args...).Scan(xid)
	}
	if len(recs) == 1 {
		r := recs[0]
		return do(in.one, in.oneWatched, r.ID, r.AggregateType, r.AggregateID, r.Type, r.Payload, r.Topic, r.Key, headersArg(r.Headers))
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
	return do(in.many, in.manyWatched, ids, aggTypes, aggIDs, types, payloads, topics, keys, headers)
}

// headersArg encodes headers as a JSON object, or nil (SQL NULL) when empty.
func headersArg(h map[string]string) []byte {
	if len(h) == 0 {
		return nil
	}
	return record.EncodeHeaders(h)
}

var _ execer = pgx.Tx(nil)

// notV7 explains the refusal of an event id that is not a UUIDv7 by a
// partitioned table (migrations.Partitioned, the CHECK constraint
// <name>_event_id_v7): its partitions are ranges of the time in v7 ids.
func notV7(err error, recs []record.Record) error {
	var pg *pgconn.PgError
	if !errors.As(err, &pg) || pg.Code != "23514" || !strings.HasSuffix(pg.ConstraintName, "_event_id_v7") {
		return err
	}
	for _, r := range recs {
		if r.ID.Version() != 7 {
			return fmt.Errorf("%w: event id %s is a version %d UUID, and the outbox table is partitioned by the time in version 7 ids (docs/partitions.md): leave Event.ID zero to get one, or set a UUIDv7 (uuid.NewV7): %w",
				outbox.ErrInvalidEvent, r.ID, r.ID.Version(), err)
		}
	}
	return err
}
