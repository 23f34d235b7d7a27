package adminui_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/adminui"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/migrations"
)

// Tokens of the test server.
const (
	operateToken = "operate-token-0123456789"
	readToken    = "read-token-0123456789abc"
)

// XSS payloads stored in events: they must show as text.
const (
	xssScript = `<script>alert(1)</script>`
	xssImg    = `"><img src=x onerror=alert(1)>`
)

type setup struct {
	ctx   context.Context
	pool  *pgxpool.Pool
	table outbox.Table
	inbox outbox.Table
	h     *adminui.Handler
	srv   *httptest.Server
	url   string // the UI's base URL, under /admin/
	logs  *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// newSetup migrates a fresh schema (outbox and inbox), parks events of
// three causes (one with XSS payloads) and serves the UI under /admin/
// with an operate and a read token.
func newSetup(t *testing.T) *setup {
	t.Helper()
	pool := testenv.Pool(t)
	s := &setup{ctx: context.Background(), pool: pool, table: testenv.Table(t, pool), logs: &syncBuffer{}}
	s.inbox = sqlname.Inbox(outbox.Table{Schema: s.table.Schema})
	if err := migrations.Inbox.Up(s.ctx, pool, s.inbox); err != nil {
		t.Fatal(err)
	}
	s.seed(t, 40, "orders", "'[kafka.message_too_large] the record is larger than the broker accepts (message.max.bytes)'", `jsonb_build_object('n', g)`, "'k' || (g % 5)")
	s.seed(t, 25, "payments", "'[invalid_topic] the topic name is not valid'", `jsonb_build_object('n', g)`, "'p' || g")
	s.seed(t, 3, "xss", `'[kafka.rejected] `+xssImg+`'`, `jsonb_build_object('html', '`+xssScript+`', 'attr', '`+strings.ReplaceAll(xssImg, `'`, `''`)+`')`, `'`+xssImg+`'`)
	s.exec(t, `INSERT INTO `+sqlname.Ident(s.table)+` (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, created_at, published_at)
		SELECT gen_random_uuid(), 'order', 'o' || g, 'order.created.v1', '{}', 'orders', 'k', now() - ((g * 97 % 3500) || ' s')::interval - interval '1 s',
		now() - ((g * 97 % 3500) || ' s')::interval FROM generate_series(1, 300) g`)
	s.exec(t, `INSERT INTO `+sqlname.Ident(s.table)+` (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key)
		SELECT gen_random_uuid(), 'order', 'o' || g, 'order.created.v1', '{}', 'orders', 'k' FROM generate_series(1, 7) g`)
	s.exec(t, `INSERT INTO "`+s.inbox.Schema+`".outbox_inbox_parked (consumer, event_id, event_type, topic, "partition", "offset", key, value, headers, attempts, error_type, last_error)
		SELECT CASE WHEN g <= 6 THEN 'billing' ELSE 'shipping' END, 'ev-' || g, 'order.created.v1', 'shop.orders', 0, g, convert_to('k' || g, 'UTF8'),
		convert_to('{"note": "`+xssScript+`"}', 'UTF8'), '{"x-event-id": "ev"}', 5, 'handler', 'failure `+strings.ReplaceAll(xssImg, `'`, `''`)+`'
		FROM generate_series(1, 9) g`)

	ops, err := adminui.NewTokenAuthorizer(adminui.Token{Secret: operateToken, Name: "alice", Role: adminui.RoleOperate},
		adminui.Token{Secret: readToken, Name: "bob", Role: adminui.RoleRead})
	if err != nil {
		t.Fatal(err)
	}
	s.h, err = adminui.NewHandler(adminui.Config{DB: pool, Tables: []outbox.Table{s.table}, Inboxes: []outbox.Table{s.inbox}, Authorizer: ops,
		Logger: slog.New(slog.NewJSONHandler(s.logs, nil)), TraceURL: "https://traces.example.com/trace/{trace_id}", ChunkSize: 7, PageSize: 20})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/admin/", http.StripPrefix("/admin", s.h))
	s.srv = httptest.NewServer(mux)
	s.url = s.srv.URL + "/admin/"
	t.Cleanup(func() {
		s.srv.Close()
		s.h.Close()
	})
	return s
}

// seed parks n events of topic with the last error, payload and key (SQL
// over g).
func (s *setup) seed(t *testing.T, n int, topic, lastErr, payload, key string) {
	t.Helper()
	s.exec(t, `INSERT INTO `+sqlname.Ident(s.table)+` (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, headers,
		created_at, parked_at, attempts, last_error)
		SELECT gen_random_uuid(), 'order', 'o' || g, 'order.created.v1', `+payload+`, '`+topic+`', `+key+`,
		'{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}', now() - interval '70 min', now() - ((g * 131 % 3500) || ' s')::interval, 5, `+lastErr+`
		FROM generate_series(1, $1) g`, n)
}

func (s *setup) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := s.pool.Exec(s.ctx, sql, args...); err != nil {
		t.Fatalf("%v\n%s", err, sql)
	}
}

func (s *setup) count(t *testing.T, where string) int {
	t.Helper()
	var n int
	if err := s.pool.QueryRow(s.ctx, "SELECT count(*) FROM "+sqlname.Ident(s.table)+" WHERE "+where).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// do sends a request with the bearer token (none when ""), extra headers
// (name, value, ...) and a JSON body (none when nil).
func (s *setup) do(t *testing.T, method, path, token string, body any, headers ...string) (int, []byte, http.Header) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, s.url+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }, Timeout: 30 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b, resp.Header
}

// csrf returns the CSRF token of token's requests.
func (s *setup) csrf(t *testing.T, token string) string {
	t.Helper()
	code, b, _ := s.do(t, "GET", "api/session", token, nil)
	if code != 200 {
		t.Fatalf("api/session: %d %s", code, b)
	}
	var sess struct {
		CSRF string `json:"csrf_token"`
	}
	if err := json.Unmarshal(b, &sess); err != nil {
		t.Fatal(err)
	}
	return sess.CSRF
}

// wait polls a job until it ends and returns it.
func (s *setup) wait(t *testing.T, token string, job adminui.Job) adminui.Job {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		if job.State != "running" {
			return true, ""
		}
		code, b, _ := s.do(t, "GET", "api/jobs/"+job.ID, token, nil)
		if code != 200 {
			t.Fatalf("api/jobs: %d %s", code, b)
		}
		if err := json.Unmarshal(b, &job); err != nil {
			t.Fatal(err)
		}
		return job.State != "running", fmt.Sprintf("job %s still running: %+v", job.ID, job)
	})
	return job
}
