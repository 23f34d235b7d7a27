package admin_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/admin"
	"github.com/fxoutbox/outbox/internal/tablesql"
	"github.com/fxoutbox/outbox/migrations"
)

// newInbox applies the inbox migrations next to the setup's outbox table
// (the default name, outbox_inbox) and parks records as consumers do:
// billing 30 (20 on shop.orders, handler; 10 on shop.payments, no_event_id
// without an event id), shipping 5 (shop.orders, handler.permanent).
func newInbox(t *testing.T) (*setup, outbox.Table) {
	t.Helper()
	s := newSetup(t)
	in := outbox.Table{Schema: s.table.Schema}
	if err := migrations.Inbox.Up(s.ctx, s.pool, in); err != nil {
		t.Fatal(err)
	}
	_, err := s.pool.Exec(s.ctx, `INSERT INTO "`+in.Schema+`".outbox_inbox_parked
		(consumer, event_id, event_type, topic, "partition", "offset", key, value, headers, "timestamp", attempts, error_type, last_error)
		SELECT 'billing', CASE WHEN g <= 20 THEN 'ev-' || g END, CASE WHEN g <= 20 THEN 'order.created.v1' END,
			CASE WHEN g <= 20 THEN 'shop.orders' ELSE 'shop.payments' END, g % 3, g, convert_to('k' || g, 'UTF8'),
			convert_to('{"n": ' || g || '}', 'UTF8'), jsonb_build_object('x-event-id', 'ev-' || g),
			CASE WHEN g <= 20 THEN timestamptz '2026-12-03 09:00:00Z' END,
			CASE WHEN g <= 20 THEN 5 ELSE 0 END, CASE WHEN g <= 20 THEN 'handler' ELSE 'no_event_id' END, 'failure ' || g
		FROM generate_series(1, 30) g`)
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.pool.Exec(s.ctx, `INSERT INTO "`+in.Schema+`".outbox_inbox_parked
		(consumer, event_id, event_type, topic, "partition", "offset", attempts, error_type, last_error)
		SELECT 'shipping', 'ev-' || g, 'order.created.v1', 'shop.orders', 0, g, 1, 'handler.permanent', 'cannot decode'
		FROM generate_series(1, 5) g`)
	if err != nil {
		t.Fatal(err)
	}
	return s, in
}

func inboxCount(t *testing.T, s *setup, in outbox.Table, where string) int {
	t.Helper()
	var n int
	if err := s.pool.QueryRow(s.ctx, `SELECT count(*) FROM "`+in.Schema+`".outbox_inbox_parked WHERE `+where).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// One consumer's records, in id order and in pages, with every field;
// every consumer's with "", each naming its consumer.
func TestListInboxParked(t *testing.T) {
	t.Parallel()
	s, in := newInbox(t)
	var got []tablesql.InboxParked
	var after int64
	for {
		page, err := tablesql.ListInboxParked(s.ctx, s.pool, in, "billing", after, 7)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) > 7 {
			t.Fatalf("page of %d, limit 7", len(page))
		}
		if len(page) == 0 {
			break
		}
		got = append(got, page...)
		after = page[len(page)-1].ID
	}
	if len(got) != 30 {
		t.Fatalf("billing has %d parked records, want 30", len(got))
	}
	for i, p := range got {
		if p.Consumer != "billing" || (i > 0 && p.ID <= got[i-1].ID) {
			t.Fatalf("record %d: %+v (after id %d)", i, p, got[max(i-1, 0)].ID)
		}
	}
	first, last := got[0], got[29]
	if first.EventID != "ev-1" || first.Type != "order.created.v1" || first.Topic != "shop.orders" || first.Partition != 1 || first.Offset != 1 ||
		string(first.Key) != "k1" || string(first.Value) != `{"n": 1}` || first.Headers["x-event-id"] != "ev-1" ||
		!first.Timestamp.Equal(mustTime(t, "2026-12-03T09:00:00Z")) || first.Attempts != 5 || first.ErrorType != "handler" ||
		first.LastError != "failure 1" || first.ParkedAt.IsZero() {
		t.Errorf("first record: %+v", first)
	}
	if last.EventID != "" || last.Type != "" || !last.Timestamp.IsZero() || last.ErrorType != "no_event_id" || last.Topic != "shop.payments" {
		t.Errorf("record without identity: %+v", last)
	}

	all, err := tablesql.ListInboxParked(s.ctx, s.pool, in, "", 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	byConsumer := map[string]int{}
	for _, p := range all {
		byConsumer[p.Consumer]++
	}
	if len(all) != 35 || byConsumer["billing"] != 30 || byConsumer["shipping"] != 5 {
		t.Fatalf("every consumer: %d records, %v", len(all), byConsumer)
	}
	if def, err := tablesql.ListInboxParked(s.ctx, s.pool, in, "", 0, 0); err != nil || len(def) != 35 {
		t.Fatalf("default limit: %d, %v", len(def), err)
	}
	if none, err := tablesql.ListInboxParked(s.ctx, s.pool, in, "nobody", 0, 0); err != nil || none == nil || len(none) != 0 {
		t.Fatalf("unknown consumer: %v, %v", none, err)
	}
	var ce *outbox.ConfigError
	if _, err := tablesql.ListInboxParked(s.ctx, s.pool, in, "", 0, -1); !errors.As(err, &ce) {
		t.Fatalf("negative limit: %v", err)
	}
	// A missing table is the database's error, wrapped; a long consumer
	// name with control bytes is quoted and cut in the message.
	_, err = tablesql.ListInboxParked(s.ctx, s.pool, outbox.Table{Schema: in.Schema, Name: "no_inbox"}, strings.Repeat("\x1b[31m", 1000), 0, 0)
	var pg *pgconn.PgError
	if !errors.As(err, &pg) || pg.Code != "42P01" || !strings.Contains(err.Error(), "no_inbox_parked") {
		t.Fatalf("missing table: %v", err)
	}
	if strings.Contains(err.Error(), "\x1b") || len(err.Error()) > 600 {
		t.Fatalf("message echoes the raw consumer name (%d bytes): %q", len(err.Error()), err.Error())
	}
}

// Get and Delete find a record by id only within its consumer (or any, with
// ""); Delete removes exactly that row, and an absent one is ErrNotFound.
func TestGetAndDeleteInboxParked(t *testing.T) {
	t.Parallel()
	s, in := newInbox(t)
	ship, err := tablesql.ListInboxParked(s.ctx, s.pool, in, "shipping", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	id := ship[0].ID
	p, err := tablesql.GetInboxParked(s.ctx, s.pool, in, "shipping", id)
	if err != nil || p.ID != id || p.Consumer != "shipping" || p.EventID != "ev-1" || p.ErrorType != "handler.permanent" {
		t.Fatalf("GetInboxParked: %+v, %v", p, err)
	}
	if p, err := tablesql.GetInboxParked(s.ctx, s.pool, in, "", id); err != nil || p.Consumer != "shipping" {
		t.Fatalf("GetInboxParked of any consumer: %+v, %v", p, err)
	}
	if _, err := tablesql.GetInboxParked(s.ctx, s.pool, in, "billing", id); !errors.Is(err, admin.ErrNotFound) {
		t.Fatalf("another consumer's record: %v, want ErrNotFound", err)
	}

	if err := tablesql.DeleteInboxParked(s.ctx, s.pool, in, "billing", id); !errors.Is(err, admin.ErrNotFound) {
		t.Fatalf("delete of another consumer's record: %v, want ErrNotFound", err)
	}
	if n := inboxCount(t, s, in, "true"); n != 35 {
		t.Fatalf("%d records after a refused delete, want 35", n)
	}
	if err := tablesql.DeleteInboxParked(s.ctx, s.pool, in, "shipping", id); err != nil {
		t.Fatal(err)
	}
	if n, gone := inboxCount(t, s, in, "true"), inboxCount(t, s, in, "id = "+jsonInt(id)); n != 34 || gone != 0 {
		t.Fatalf("after delete: %d records, record %d there %d times", n, id, gone)
	}
	err = tablesql.DeleteInboxParked(s.ctx, s.pool, in, "shipping", id)
	if !errors.Is(err, admin.ErrNotFound) || !strings.Contains(err.Error(), `consumer "shipping"`) {
		t.Fatalf("second delete: %v, want ErrNotFound naming the consumer", err)
	}
	if _, err := tablesql.GetInboxParked(s.ctx, s.pool, in, "", id); !errors.Is(err, admin.ErrNotFound) {
		t.Fatalf("get of a deleted record: %v", err)
	}
	if err := tablesql.DeleteInboxParked(s.ctx, s.pool, in, "", ship[1].ID); err != nil {
		t.Fatal(err)
	}
	if n := inboxCount(t, s, in, "consumer = 'shipping'"); n != 3 {
		t.Fatalf("shipping has %d records, want 3", n)
	}
}

// The status view's groups: by consumer, topic and error type, largest
// first.
func TestCountInboxParked(t *testing.T) {
	t.Parallel()
	s, in := newInbox(t)
	groups, err := tablesql.CountInboxParked(s.ctx, s.pool, in)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, g := range groups {
		got = append(got, g.Consumer+"/"+g.Topic+"/"+g.ErrorType+"="+jsonInt(g.Count))
		if g.FirstParkedAt.IsZero() || g.LastParkedAt.Before(g.FirstParkedAt) {
			t.Errorf("group %+v: parked_at bounds", g)
		}
	}
	want := "billing/shop.orders/handler=20 billing/shop.payments/no_event_id=10 shipping/shop.orders/handler.permanent=5"
	if strings.Join(got, " ") != want {
		t.Fatalf("groups:\n %s\nwant\n %s", strings.Join(got, " "), want)
	}
	// An empty inbox has no groups.
	empty := outbox.Table{Schema: in.Schema, Name: "empty_inbox"}
	if err := migrations.Inbox.Up(s.ctx, s.pool, empty); err != nil {
		t.Fatal(err)
	}
	if groups, err := tablesql.CountInboxParked(s.ctx, s.pool, empty); err != nil || groups == nil || len(groups) != 0 {
		t.Fatalf("empty inbox: %v, %v", groups, err)
	}
}

func mustTime(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func jsonInt[T int64 | int](n T) string { return strconv.FormatInt(int64(n), 10) }
