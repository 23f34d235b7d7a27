package rolestest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/admin"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/migrations"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// replicationConnect opens a logical replication connection
// (replication=database) as role.
func (r *roles) replicationConnect(ctx context.Context, role string) (*pgconn.PgConn, error) {
	cfg, err := pgconn.ParseConfig(r.url)
	if err != nil {
		return nil, err
	}
	cfg.User, cfg.Password = role, r.password
	cfg.RuntimeParams["replication"] = "database"
	return pgconn.ConnectConfig(ctx, cfg)
}

// change is one row change decoded from the stream.
type change struct {
	op      string // insert, update, delete, truncate
	table   string // schema.name
	eventID string // inserts: the event_id column
}

// receive decodes pgoutput messages from conn until it has seen n inserts
// (or ctx ends), confirming nothing, and returns every row change seen.
func receive(ctx context.Context, conn *pgconn.PgConn, n int) ([]change, error) {
	relations := map[uint32]*pglogrepl.RelationMessage{}
	var out []change
	inserts := 0
	for inserts < n {
		msg, err := conn.ReceiveMessage(ctx)
		if err != nil {
			return out, fmt.Errorf("after %d inserts: %w", inserts, err)
		}
		cd, ok := msg.(*pgproto3.CopyData)
		if !ok {
			if er, ok := msg.(*pgproto3.ErrorResponse); ok {
				return out, fmt.Errorf("server: %s", er.Message)
			}
			continue
		}
		switch cd.Data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(cd.Data[1:])
			if err != nil {
				return out, err
			}
			if ka.ReplyRequested {
				if err := pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: 0}); err != nil {
					return out, err
				}
			}
		case pglogrepl.XLogDataByteID:
			xld, err := pglogrepl.ParseXLogData(cd.Data[1:])
			if err != nil {
				return out, err
			}
			m, err := pglogrepl.Parse(xld.WALData)
			if err != nil {
				return out, err
			}
			name := func(id uint32) string {
				if rel := relations[id]; rel != nil {
					return rel.Namespace + "." + rel.RelationName
				}
				return "?"
			}
			switch m := m.(type) {
			case *pglogrepl.RelationMessage:
				relations[m.RelationID] = m
			case *pglogrepl.InsertMessage:
				c := change{op: "insert", table: name(m.RelationID)}
				if rel := relations[m.RelationID]; rel != nil {
					for i, col := range m.Tuple.Columns {
						if i < len(rel.Columns) && rel.Columns[i].Name == "event_id" {
							c.eventID = string(col.Data)
						}
					}
				}
				out = append(out, c)
				inserts++
			case *pglogrepl.UpdateMessage:
				out = append(out, change{op: "update", table: name(m.RelationID)})
			case *pglogrepl.DeleteMessage:
				out = append(out, change{op: "delete", table: name(m.RelationID)})
			case *pglogrepl.TruncateMessage:
				out = append(out, change{op: "truncate"})
			}
		}
	}
	return out, nil
}

// The streaming relay's role as roles.example.sql describes it: a LOGIN
// role with REPLICATION, member of the relay role. The migrator creates the
// publication (it needs CREATE on the database for that, and owns it); the
// streaming role passes CheckStream, opens a logical replication
// connection, creates a temporary pgoutput slot and receives the writer's
// inserts, and not the relay's marks; it still does the relay's polling
// work. The relay role, without REPLICATION, fails CheckStream, and the
// server refuses its replication connection the way CheckStream says.
func TestStreamingRelayRole(t *testing.T) {
	t.Parallel()
	r := newRoles(t)
	ctx := context.Background()
	mig := r.pool(t, r.migrator)
	tbl := r.schema(t, mig)
	if err := r.apply(t, tbl, readScript(t)); err != nil {
		t.Fatalf("%s: %v", scriptFile, err)
	}
	stream := testenv.Name("outbox_stream_")
	if _, err := r.admin.Exec(ctx, "CREATE ROLE "+ident(stream)+" LOGIN REPLICATION PASSWORD "+literal(r.password)+" IN ROLE "+ident(r.relay)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = r.admin.Exec(context.Background(), "DROP OWNED BY "+ident(stream))
		_, _ = r.admin.Exec(context.Background(), "DROP ROLE "+ident(stream))
	})
	var db string
	if err := r.admin.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	// The migrator may not create the publication until it has CREATE on
	// the database; it keeps owning it after that is revoked.
	if err := migrations.Stream.Up(ctx, mig, tbl); pgCode(err) != "42501" {
		t.Fatalf("Stream.Up by the migrator without CREATE on the database: %v, want SQLSTATE 42501", err)
	}
	if _, err := r.admin.Exec(ctx, "GRANT CREATE ON DATABASE "+ident(db)+" TO "+ident(r.migrator)); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Stream.Up(ctx, mig, tbl); err != nil {
		t.Fatalf("Stream.Up by the migrator: %v", err)
	}
	if _, err := r.admin.Exec(ctx, "REVOKE CREATE ON DATABASE "+ident(db)+" FROM "+ident(r.migrator)); err != nil {
		t.Fatal(err)
	}
	var owner string
	if err := r.admin.QueryRow(ctx, "SELECT pg_get_userbyid(pubowner) FROM pg_publication WHERE pubname = $1", tbl.Publication()).Scan(&owner); err != nil || owner != r.migrator {
		t.Fatalf("the publication's owner is %q (%v), want the migrator", owner, err)
	}
	if v := r.violations(t, tbl); len(v) > 0 {
		t.Fatalf("privileges differ from the script's intent:\n%s", strings.Join(v, "\n"))
	}

	// The relay role without REPLICATION: CheckStream says so, and the
	// server refuses its replication connection for that reason.
	relayDB := r.pool(t, r.relay)
	err := admin.CheckStream(ctx, relayDB, tbl)
	var se *outbox.StreamSetupError
	if !errors.As(err, &se) || se.Check != outbox.StreamCheckReplicationRole || !strings.Contains(se.Fix, "ALTER ROLE "+ident(r.relay)+" REPLICATION") {
		t.Fatalf("CheckStream as the relay role: %v, want the check %s", err, outbox.StreamCheckReplicationRole)
	}
	if conn, err := r.replicationConnect(ctx, r.relay); err == nil {
		_ = conn.Close(ctx)
		t.Fatal("the relay role without REPLICATION opened a replication connection")
	} else if pgCode(err) != "42501" || !strings.Contains(err.Error(), "replication") {
		t.Fatalf("replication connection as the relay role: %v, want SQLSTATE 42501 naming the replication role", err)
	}

	// The streaming role.
	streamDB := r.pool(t, stream)
	if err := admin.CheckStream(ctx, streamDB, tbl); err != nil {
		t.Fatalf("CheckStream as the streaming role: %v", err)
	}
	conn, err := r.replicationConnect(ctx, stream)
	if err != nil {
		t.Fatalf("replication connection as the streaming role: %v", err)
	}
	defer conn.Close(context.Background())
	if _, err := pglogrepl.CreateReplicationSlot(ctx, conn, testenv.Slot(t, streamDB, tbl), "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{Temporary: true, Mode: pglogrepl.LogicalReplication}); err != nil {
		t.Fatalf("CREATE_REPLICATION_SLOT as the streaming role: %v", err)
	}
	if err := pglogrepl.StartReplication(ctx, conn, testenv.Slot(t, streamDB, tbl), 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + tbl.Publication() + "'"}}); err != nil {
		t.Fatalf("START_REPLICATION as the streaming role: %v", err)
	}

	writer := r.pool(t, r.writer)
	uow, err := unitofwork.New(writer, &unitofwork.Config{Service: "svc", Table: tbl})
	if err != nil {
		t.Fatal(err)
	}
	write := func(key string) uuid.UUID {
		t.Helper()
		e := outbox.Event{ID: uuid.Must(uuid.NewV7()), AggregateType: "order", AggregateID: key, Type: "order.placed.v1", Topic: "orders"}
		if err := uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error { return tx.Add(ctx, e) }); err != nil {
			t.Fatalf("writer: %v", err)
		}
		return e.ID
	}
	first := write("o-1")
	// The streaming role does the relay's polling work too (its grants come
	// from the relay role): it marks the first event published, an UPDATE
	// the publication must not send.
	rl, err := relay.New(streamDB, &okPublisher{}, &relay.Config{Table: tbl})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := rl.RunOnce(ctx); err != nil || n != 1 {
		t.Fatalf("RunOnce as the streaming role: %d, %v", n, err)
	}
	second := write("o-2")

	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	changes, err := receive(rctx, conn, 2)
	if err != nil {
		t.Fatalf("stream: %v (so far %+v)", err, changes)
	}
	want := []change{{"insert", tbl.String(), first.String()}, {"insert", tbl.String(), second.String()}}
	if fmt.Sprint(changes) != fmt.Sprint(want) {
		t.Fatalf("streamed %+v, want the two inserts only: %+v", changes, want)
	}
}
