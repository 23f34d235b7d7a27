package rolestest

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/inbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/migrations"
	"github.com/fxoutbox/outbox/unitofwork"
)

const inboxScriptFile = "inbox/roles.example.sql"

// A consumer connected as the role that migrations/inbox/roles.example.sql
// grants (and the outbox script's writer grants) runs the whole inbox:
// applies records whose handlers add outbox events, parks (with a
// dead-letter event through the outbox), lists, retries
// and deletes parked records, and deletes old inbox rows; it cannot
// rewrite an inbox row. The script first takes back the broad grants the
// tables had.
func TestInboxRolesScript(t *testing.T) {
	r := newRoles(t)
	ctx := context.Background()
	mig := r.pool(t, r.migrator)
	tbl := r.schema(t, mig)
	if err := r.apply(t, tbl, readScript(t)); err != nil {
		t.Fatalf("%s: %v", scriptFile, err)
	}
	in := outbox.Table{Schema: tbl.Schema}
	if err := migrations.Inbox.Up(ctx, mig, in); err != nil {
		t.Fatalf("migrations.Inbox.Up as the migration role: %v", err)
	}
	for _, sql := range []string{
		"GRANT ALL ON TABLE " + ident(tbl.Schema) + ".outbox_inbox, " + ident(tbl.Schema) + ".outbox_inbox_parked TO PUBLIC, " + ident(r.writer),
		"CREATE TABLE " + ident(tbl.Schema) + ".effects (event_id text)",
		"GRANT INSERT ON TABLE " + ident(tbl.Schema) + ".effects TO " + ident(r.writer),
	} {
		if _, err := r.admin.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	b, err := fs.ReadFile(migrations.Inbox.FS(), path.Base(inboxScriptFile))
	if err != nil {
		t.Fatal(err)
	}
	sql, err := render(string(b), map[string]string{"schema": tbl.Schema, "table": sqlname.DefaultInbox, "consumer": r.writer})
	if err != nil {
		t.Fatalf("render %s: %v", inboxScriptFile, err)
	}
	if _, err := mig.Exec(ctx, sql); err != nil {
		t.Fatalf("%s as the migrator: %v", inboxScriptFile, err)
	}

	brokers := testenv.Brokers(t)
	topic := testenv.Topic(t, brokers, 1)
	app := r.pool(t, r.writer)
	uow, err := unitofwork.New(app, &unitofwork.Config{Table: tbl})
	if err != nil {
		t.Fatal(err)
	}
	var fixed atomic.Bool
	c, err := inbox.New(app, uow, &inbox.Config{
		Group: testenv.Name("roles_"), Brokers: brokers, Table: in, MaxAttempts: 1, MinBackoff: 10 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler), Retention: time.Millisecond, DeadLetterTopic: "billing.dlq",
		Routes: []inbox.Route{{Topic: topic, Handler: func(ctx context.Context, tx unitofwork.Tx, m *inbox.Message) error {
			if string(m.Value) == "bad" && !fixed.Load() {
				return errors.New("bad record")
			}
			if _, err := tx.Exec(ctx, "INSERT INTO "+ident(tbl.Schema)+".effects VALUES ($1)", m.ID); err != nil {
				return err
			}
			return tx.Add(ctx, outbox.Event{Topic: "billing.done", AggregateType: "a", AggregateID: m.ID, Type: "done.v1", Payload: map[string]int{}})
		}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	var msgs []*sarama.ProducerMessage
	for _, v := range []string{"good", "bad", "no id"} {
		m := &sarama.ProducerMessage{Topic: topic, Value: sarama.StringEncoder(v)}
		if v != "no id" {
			m.Headers = []sarama.RecordHeader{{Key: []byte(outbox.HeaderEventID), Value: []byte(uuid.NewString())}}
		}
		msgs = append(msgs, m)
	}
	testenv.Produce(t, brokers, msgs...)
	if err := c.Start(ctx); err != nil {
		t.Fatalf("Start as the consumer role: %v", err)
	}
	var parked []inbox.Parked
	testenv.Eventually(t, time.Minute, func() (bool, string) {
		var err error
		if parked, err = c.List(ctx, inbox.ListOptions{}); err != nil {
			t.Fatalf("List as the consumer role: %v", err)
		}
		return len(parked) == 2, fmt.Sprintf("parked %d records, want 2 (%+v)", len(parked), parked)
	})
	if parked[0].EventID == "" { // the bad record first, the one without id second
		parked[0], parked[1] = parked[1], parked[0]
	}
	if err := c.Retry(ctx, parked[0].ID); err == nil {
		t.Fatal("Retry of the bad record succeeded before the handler accepts it")
	}
	fixed.Store(true)
	if err := c.Retry(ctx, parked[0].ID); err != nil {
		t.Fatalf("Retry as the consumer role: %v", err)
	}
	if err := c.Delete(ctx, parked[1].ID); err != nil {
		t.Fatalf("Delete as the consumer role: %v", err)
	}
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := c.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	var effects, events, letters int
	_ = r.admin.QueryRow(ctx, "SELECT (SELECT count(*) FROM "+ident(tbl.Schema)+".effects), (SELECT count(*) FROM "+sqlname.Ident(tbl)+" WHERE topic <> 'billing.dlq'), "+
		"(SELECT count(*) FROM "+sqlname.Ident(tbl)+" WHERE topic = 'billing.dlq')").Scan(&effects, &events, &letters)
	if effects != 2 || events != 2 || letters != 2 {
		t.Fatalf("%d effects, %d outbox events and %d dead letters; want 2 of each (the good record and the retried bad one; a letter per parked record)", effects, events, letters)
	}
	if n, err := c.Cleanup(ctx); err != nil || n != 2 {
		t.Fatalf("Cleanup as the consumer role = %d, %v; want the 2 inbox rows", n, err)
	}
	var pe *pgconn.PgError
	_, err = app.Exec(ctx, "INSERT INTO "+ident(tbl.Schema)+".outbox_inbox (consumer, event_id, topic, \"partition\", \"offset\") VALUES ('x', 'y', 't', 0, 0)")
	if err != nil {
		t.Fatalf("insert an inbox row as the consumer role: %v", err)
	}
	for _, forbidden := range []string{
		"UPDATE " + ident(tbl.Schema) + ".outbox_inbox SET event_id = 'z'",
		"INSERT INTO " + ident(tbl.Schema) + ".outbox_inbox (consumer, event_id, topic, \"partition\", \"offset\", processed_at) VALUES ('x', 'old', 't', 0, 0, now() - interval '1 year')",
		"UPDATE " + ident(tbl.Schema) + ".outbox_inbox_parked SET value = 'x'",
		"TRUNCATE " + ident(tbl.Schema) + ".outbox_inbox",
	} {
		_, err := app.Exec(ctx, forbidden)
		if !errors.As(err, &pe) || pe.Code != "42501" {
			t.Errorf("%s as the consumer role: %v, want permission denied (42501)", forbidden, err)
		}
	}
}
