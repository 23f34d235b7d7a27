package adminui_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/adminui"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
)

// TestReadOnlyDatabaseRole serves every page through a pool whose role may
// only SELECT the tables (a reporting role as docs/adminui.md describes it),
// and shows that an action then fails in the database, with its audit line.
func TestReadOnlyDatabaseRole(t *testing.T) {
	s := newSetup(t)
	role := testenv.Name("ui_reader_")
	for _, sql := range []string{
		"CREATE ROLE " + role + " NOLOGIN",
		"GRANT USAGE ON SCHEMA " + s.table.Schema + " TO " + role,
		"GRANT SELECT ON " + sqlname.Ident(s.table) + ", " + sqlname.Ident(s.inbox) + "_parked TO " + role,
		"ALTER TABLE " + sqlname.Ident(s.table) + " ENABLE ROW LEVEL SECURITY",
		"CREATE POLICY ui_read ON " + sqlname.Ident(s.table) + " FOR SELECT TO " + role + " USING (true)",
	} {
		s.exec(t, strings.Replace(sql, sqlname.Ident(s.inbox)+"_parked", `"`+s.inbox.Schema+`".`+s.inbox.Name+"_parked", 1))
	}
	t.Cleanup(func() {
		_, _ = s.pool.Exec(context.Background(), "DROP OWNED BY "+role)
		_, _ = s.pool.Exec(context.Background(), "DROP ROLE "+role)
	})
	cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, "SET ROLE "+role)
		return err
	}
	pool, err := pgxpool.NewWithConfig(s.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var logs syncBuffer
	h, err := adminui.NewHandler(adminui.Config{DB: pool, Tables: []outbox.Table{s.table}, Inboxes: []outbox.Table{s.inbox},
		InsecureAllowAnonymous: adminui.RoleOperate, Logger: slogTo(&logs)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer func() { srv.Close(); h.Close() }()
	var id string
	if err := s.pool.QueryRow(s.ctx, "SELECT event_id::text FROM "+sqlname.Ident(s.table)+" WHERE parked_at IS NOT NULL LIMIT 1").Scan(&id); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"", "api/overview", "parked", "parked?topic=orders&reason=large", "event?id=" + id, "inbox", "inbox-record?id=1"} {
		resp, err := http.Get(srv.URL + "/" + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("%s as a SELECT-only role: %d %s", path, resp.StatusCode, b)
		}
	}
	// An action: the job fails on the missing UPDATE grant.
	resp, err := http.Get(srv.URL + "/api/session")
	if err != nil {
		t.Fatal(err)
	}
	var sess struct {
		CSRF string `json:"csrf_token"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&sess)
	resp.Body.Close()
	req, _ := http.NewRequest("POST", srv.URL+"/api/actions", strings.NewReader(`{"action": "requeue", "event_ids": ["`+id+`"]}`))
	req.Header.Set("X-CSRF-Token", sess.CSRF)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var job adminui.Job
	_ = json.NewDecoder(resp.Body).Decode(&job)
	resp.Body.Close()
	s.url = srv.URL + "/"
	job = s.wait(t, "", job)
	if job.State != "failed" || !strings.Contains(job.Error, "permission denied") || !strings.Contains(logs.String(), "level=ERROR msg=\"adminui: audit\"") {
		t.Fatalf("requeue as a SELECT-only role: %+v\n%s", job, logs.String())
	}
}
