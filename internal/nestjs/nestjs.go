// Package nestjs reproduces, for tests, the outbox of the NestJS design this
// project replaces: its table (the exact DDL), the INSERT its TypeORM
// writers send, and its relay (a FOR UPDATE SKIP LOCKED batch of 50 in id
// order, sent with kafkajs: key = partition_key, value =
// JSON.stringify(payload), headers x-event-id and x-event-type, acks -1, the
// Java-compatible murmur2 partitioner of kafkajs 2.x). Tests take such a
// table over with the migrations and the relay, as docs/nestjs.md says.
package nestjs

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/unitofwork"
)

// DDL is the NestJS design's table and partial index, as it gives them.
const DDL = `CREATE TABLE outbox_event (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id       uuid         NOT NULL UNIQUE,
    aggregate_type text         NOT NULL,
    aggregate_id   text         NOT NULL,
    event_type     text         NOT NULL,
    payload        jsonb        NOT NULL,
    topic          text         NOT NULL,
    partition_key  text         NOT NULL,
    created_at     timestamptz  NOT NULL DEFAULT now(),
    published_at   timestamptz
);
CREATE INDEX ix_outbox_event_unpublished
    ON outbox_event(id)
    WHERE published_at IS NULL;`

// Insert is the statement TypeORM (0.3, PostgreSQL driver) sends for
// outboxRepo.save(outboxRepo.create({...})) of the design's entity: every
// column but the generated id, in the entity's order, DEFAULT for the
// values the entity leaves undefined (created_at, published_at). It names
// neither headers nor any column a later migration adds.
const Insert = `INSERT INTO "outbox_event"("event_id", "aggregate_type", "aggregate_id", "event_type", "payload", "topic", "partition_key", "created_at", "published_at") ` +
	`VALUES ($1, $2, $3, $4, $5, $6, $7, DEFAULT, DEFAULT) RETURNING "id", "created_at"`

// claim is the relay's query as TypeORM builds it from
// createQueryBuilder('e').setLock('pessimistic_write').setOnLocked('skip_locked')
// .where('e.publishedAt IS NULL').orderBy('e.id', 'ASC').take(50).
const claim = `SELECT "e"."id" AS "e_id", "e"."event_id" AS "e_event_id", "e"."aggregate_type" AS "e_aggregate_type", ` +
	`"e"."aggregate_id" AS "e_aggregate_id", "e"."event_type" AS "e_event_type", "e"."payload" AS "e_payload", "e"."topic" AS "e_topic", ` +
	`"e"."partition_key" AS "e_partition_key", "e"."created_at" AS "e_created_at", "e"."published_at" AS "e_published_at" ` +
	`FROM "outbox_event" "e" WHERE "e"."published_at" IS NULL ORDER BY "e"."id" ASC LIMIT 50 FOR UPDATE SKIP LOCKED`

// BatchSize is the NestJS relay's batch: take(50).
const BatchSize = 50

// Create creates schema with the NestJS table in it, and returns a pool
// whose connections have that schema as their search_path, as the NestJS
// application's would: Insert and the relay's statements name the table
// unqualified. The schema is dropped when the test ends.
func Create(t testing.TB, pool *pgxpool.Pool, schema string) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	nest := Pool(t, pool, schema)
	if _, err := nest.Exec(ctx, DDL); err != nil {
		t.Fatalf("the NestJS DDL: %v", err)
	}
	return nest
}

// Pool returns a pool to pool's database whose search_path is schema,
// closed when the test ends.
func Pool(t testing.TB, pool *pgxpool.Pool, schema string) *pgxpool.Pool {
	t.Helper()
	cfg := pool.Config().Copy()
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns = 4
	nest, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nest.Close)
	return nest
}

// Event is what a NestJS handler records.
type Event struct {
	EventID       uuid.UUID
	AggregateType string
	AggregateID   string
	EventType     string
	Payload       map[string]any
	Topic         string
	Key           string // partition_key
}

// NewEvent returns the n-th event of a test's stream: aggregate key, on
// topic, with a payload shaped as the design's handler writes it.
func NewEvent(n int, key, topic string) Event {
	id := uuid.Must(uuid.NewV7())
	return Event{
		EventID: id, AggregateType: "Order", AggregateID: key, EventType: "order.confirmed.v1", Topic: topic, Key: key,
		Payload: map[string]any{
			"eventId": id.String(), "eventType": "OrderConfirmed.v1", "occurredAt": time.Now().UTC().Format(time.RFC3339Nano),
			"aggregateType": "Order", "aggregateId": key, "customerId": "c-" + strconv.Itoa(n%7), "totalAmount": 1250 + n, "seq": n,
		},
	}
}

// Write inserts ev with TypeORM's statement, its parameters sent as
// node-postgres sends them (text; the payload JSON.stringify'd), and returns
// the row's id.
func Write(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, ev Event) (int64, error) {
	payload, err := json.Marshal(ev.Payload)
	if err != nil {
		return 0, err
	}
	var id int64
	var created time.Time
	err = db.QueryRow(ctx, Insert, ev.EventID.String(), ev.AggregateType, ev.AggregateID, ev.EventType, string(payload), ev.Topic, ev.Key).Scan(&id, &created)
	return id, err
}

// Sent is one record the NestJS relay sent.
type Sent struct {
	ID        int64
	EventID   string
	EventType string
	Topic     string
	Key       string
	Value     []byte // JSON.stringify(payload)
}

// Producer returns a sarama producer configured as the design's kafkajs
// producer: idempotent, acks -1, and kafkajs 2.x's DefaultPartitioner,
// which is Java's murmur2. It is closed when the test ends.
func Producer(t testing.TB, brokers []string) sarama.SyncProducer {
	t.Helper()
	c := sarama.NewConfig()
	c.ClientID = "nestjs-relay"
	c.Version = sarama.V2_8_0_0
	c.Producer.Idempotent = true
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Net.MaxOpenRequests = 1
	c.Producer.Return.Successes = true
	c.Producer.Partitioner = sarama.NewMurmur2Partitioner
	p, err := sarama.NewSyncProducer(brokers, c)
	if err != nil {
		t.Fatalf("kafka producer: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// RelayBatch runs one batch of the NestJS relay on db (search_path set to
// the table's schema): in a transaction, the claim (50 unpublished rows in
// id order, FOR UPDATE SKIP LOCKED), one send per topic with kafkajs's
// record shape, then, if mark, the UPDATE of published_at and the commit.
// With mark false it stops after the sends, as a relay that crashed there:
// the rows were sent and stay unpublished. It returns what it sent, in
// order.
func RelayBatch(ctx context.Context, db *pgxpool.Pool, p sarama.SyncProducer, mark bool) ([]Sent, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	rows, err := tx.Query(ctx, claim)
	if err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	var batch []Sent
	var (
		s         Sent
		eid       uuid.UUID
		aggType   string
		aggID     string
		payload   []byte
		createdAt time.Time
		published *time.Time
	)
	_, err = pgx.ForEachRow(rows, []any{&s.ID, &eid, &aggType, &aggID, &s.EventType, &payload, &s.Topic, &s.Key, &createdAt, &published}, func() error {
		s.EventID = eid.String()
		// node-postgres parses jsonb, JSON.stringify prints it back
		// compact, keys in the order PostgreSQL stored them.
		var v bytes.Buffer
		if err := json.Compact(&v, payload); err != nil {
			return err
		}
		s.Value = v.Bytes()
		batch = append(batch, s)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	if len(batch) == 0 {
		return nil, nil
	}
	// Map.groupBy keeps the topics in order of their first row, and each
	// topic's rows in id order.
	var topics []string
	byTopic := map[string][]*sarama.ProducerMessage{}
	for _, e := range batch {
		if _, ok := byTopic[e.Topic]; !ok {
			topics = append(topics, e.Topic)
		}
		byTopic[e.Topic] = append(byTopic[e.Topic], &sarama.ProducerMessage{
			Topic: e.Topic, Key: sarama.StringEncoder(e.Key), Value: sarama.ByteEncoder(e.Value),
			Headers: []sarama.RecordHeader{
				{Key: []byte(outbox.HeaderEventID), Value: []byte(e.EventID)},
				{Key: []byte(outbox.HeaderEventType), Value: []byte(e.EventType)},
			},
		})
	}
	for _, topic := range topics {
		if err := p.SendMessages(byTopic[topic]); err != nil {
			return nil, fmt.Errorf("send to %s: %w", topic, err)
		}
	}
	if !mark {
		return batch, nil
	}
	// manager.update(OutboxEventEntity, ids, { publishedAt: new Date() })
	params := make([]string, len(batch))
	args := []any{time.Now()}
	for i, e := range batch {
		params[i] = "$" + strconv.Itoa(i+2)
		args = append(args, strconv.FormatInt(e.ID, 10))
	}
	if _, err := tx.Exec(ctx, `UPDATE "outbox_event" SET "published_at" = $1 WHERE "id" IN (`+strings.Join(params, ", ")+`)`, args...); err != nil {
		return nil, fmt.Errorf("mark: %w", err)
	}
	return batch, tx.Commit(ctx)
}

// Row is one row of the table, as its NestJS columns hold it, with where
// it lies (ctid) and the transaction that wrote it (xmin): a row that is
// rewritten or updated changes them.
type Row struct {
	ID   int64
	CTID string
	XMin string
	Doc  string // the NestJS columns as JSON
}

// Snapshot reads every row of table, in id order, and the table's file
// node (a table rewrite changes it).
func Snapshot(t testing.TB, pool *pgxpool.Pool, table outbox.Table) (rows []Row, filenode int64) {
	t.Helper()
	ctx := context.Background()
	r, err := pool.Query(ctx, "SELECT id, ctid::text, xmin::text, (to_jsonb(e) - '{headers,attempts,last_error,parked_at}'::text[])::text FROM "+
		sqlname.Ident(table)+" e ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	rows, err = pgx.CollectRows(r, pgx.RowToStructByPos[Row])
	if err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, "SELECT pg_relation_filenode($1::regclass)::bigint", sqlname.Ident(table)).Scan(&filenode); err != nil {
		t.Fatal(err)
	}
	return rows, filenode
}

// Fill writes n events with Write over keys order-0 .. order-<keys-1>
// (round robin) to topic, and marks every other one of the first 2*published
// as published, a NestJS relay's history with gaps (SKIP LOCKED batches of
// several replicas). It returns the rows' ids.
func Fill(t testing.TB, nest *pgxpool.Pool, n, keys, published int, topic string) []int64 {
	t.Helper()
	ctx := context.Background()
	ids := make([]int64, n)
	for i := range n {
		id, err := Write(ctx, nest, NewEvent(i, "order-"+strconv.Itoa(i%keys), topic))
		if err != nil {
			t.Fatalf("NestJS insert: %v", err)
		}
		ids[i] = id
	}
	var marked []int64
	for i := 0; i < 2*published && i < n; i += 2 {
		marked = append(marked, ids[i])
	}
	if _, err := nest.Exec(ctx, `UPDATE "outbox_event" SET "published_at" = created_at + interval '1 second' WHERE "id" = ANY($1)`, marked); err != nil {
		t.Fatal(err)
	}
	return ids
}

// RequireAdopted checks table after a migration tool took it over: every
// row of before is there, its NestJS columns unchanged, in the same place,
// never updated (same ctid and xmin), the table not rewritten (same file
// node), the new columns empty (headers NULL, attempts 0, no error, not
// parked), one partial index of unpublished rows (the NestJS one, not a
// second), the columns and indexes of the later migrations present, and
// ids continuing after the last one for writers of both shapes.
func RequireAdopted(t testing.TB, pool *pgxpool.Pool, nest *pgxpool.Pool, table outbox.Table, before []Row, filenode int64) {
	t.Helper()
	ctx := context.Background()
	after, node := Snapshot(t, pool, table)
	if node != filenode {
		t.Errorf("the table was rewritten: file node %d, was %d", node, filenode)
	}
	if len(after) != len(before) {
		t.Fatalf("%d rows after the migration, %d before", len(after), len(before))
	}
	for i := range before {
		if after[i] != before[i] {
			t.Errorf("row changed by the migration:\n before %+v\n after  %+v", before[i], after[i])
		}
	}
	var dirty int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+sqlname.Ident(table)+
		" WHERE headers IS NOT NULL OR attempts <> 0 OR last_error IS NOT NULL OR parked_at IS NOT NULL").Scan(&dirty); err != nil {
		t.Fatal(err)
	}
	if dirty != 0 {
		t.Errorf("%d rows have values in the new columns", dirty)
	}
	r, err := pool.Query(ctx, "SELECT indexname FROM pg_indexes WHERE schemaname = $1 AND tablename = $2 ORDER BY indexname", table.Schema, table.WithDefaults().Name)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := pgx.CollectRows(r, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	name := table.WithDefaults().Name
	want := []string{"ix_outbox_event_unpublished", name + "_created_brin", name + "_event_id_key", name + "_parked_idx", name + "_pkey"}
	if strings.Join(idx, ",") != strings.Join(want, ",") {
		t.Errorf("indexes %v, want %v (the NestJS partial index kept, no second one)", idx, want)
	}
	// Ids go on after the last row, for the old writers and ours alike.
	last := before[len(before)-1].ID
	id, err := Write(ctx, nest, NewEvent(1000, "order-0", "t"))
	if err != nil {
		t.Fatalf("a NestJS writer after the migration: %v", err)
	}
	if id != last+1 {
		t.Errorf("a NestJS insert after the migration got id %d, want %d", id, last+1)
	}
	var headers []byte
	var attempts int
	if err := pool.QueryRow(ctx, "SELECT headers, attempts FROM "+sqlname.Ident(table)+" WHERE id = $1", id).Scan(&headers, &attempts); err != nil || headers != nil || attempts != 0 {
		t.Errorf("the NestJS row written after the migration: headers %s, attempts %d (%v)", headers, attempts, err)
	}
	uow, err := unitofwork.New(pool, &unitofwork.Config{Service: "order-service", Table: table})
	if err != nil {
		t.Fatal(err)
	}
	err = uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		return tx.Add(ctx, outbox.Event{AggregateType: "order", AggregateID: "order-0", Type: "order.confirmed.v1", Payload: map[string]int{"n": 1}})
	})
	if err != nil {
		t.Fatalf("a unitofwork writer after the migration: %v", err)
	}
	var goID int64
	if err := pool.QueryRow(ctx, "SELECT max(id) FROM "+sqlname.Ident(table)).Scan(&goID); err != nil || goID != last+2 {
		t.Errorf("the unitofwork insert after the migration got id %d (%v), want %d", goID, err, last+2)
	}
	if _, err := pool.Exec(ctx, "DELETE FROM "+sqlname.Ident(table)+" WHERE id > $1", last); err != nil {
		t.Fatal(err)
	}
}
