package adminui_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/adminui"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
)

func TestNewHandlerIsDenyByDefault(t *testing.T) {
	pool := testenv.Pool(t)
	if _, err := adminui.NewHandler(adminui.Config{DB: pool}); !errors.Is(err, adminui.ErrNoAuthorizer) {
		t.Fatalf("no authorizer: got %v, want ErrNoAuthorizer", err)
	}
	if _, err := adminui.NewTokenAuthorizer(adminui.Token{Secret: "short", Role: adminui.RoleRead}); !errors.Is(err, adminui.ErrWeakToken) {
		t.Fatalf("short token: got %v", err)
	}
	var logs syncBuffer
	h, err := adminui.NewHandler(adminui.Config{DB: pool, InsecureAllowAnonymous: adminui.RoleRead, Logger: slogTo(&logs)})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if !strings.Contains(logs.String(), "WITHOUT AUTHENTICATION") {
		t.Fatalf("InsecureAllowAnonymous logs no warning: %q", logs.String())
	}
}

func TestAuthentication(t *testing.T) {
	s := newSetup(t)
	// No credentials: the API says 401, a page sends to the login page.
	if code, _, _ := s.do(t, "GET", "api/overview", "", nil); code != http.StatusUnauthorized {
		t.Errorf("api without token: %d, want 401", code)
	}
	code, _, hd := s.do(t, "GET", "parked?topic=orders", "", nil)
	if code != http.StatusSeeOther || hd.Get("Location") != "/admin/login?next=parked%3Ftopic%3Dorders" {
		t.Errorf("page without token: %d to %q, want 303 to the login page", code, hd.Get("Location"))
	}
	if code, _, _ := s.do(t, "GET", "api/overview", "wrong-token-0123456789", nil); code != http.StatusUnauthorized {
		t.Errorf("api with a wrong token: %d, want 401", code)
	}
	for _, tok := range []string{operateToken, readToken} {
		if code, b, _ := s.do(t, "GET", "api/overview", tok, nil); code != 200 {
			t.Errorf("api/overview with a token: %d %s", code, b)
		}
	}
	// Security headers on every answer.
	_, _, hd = s.do(t, "GET", "", readToken, nil)
	if csp := hd.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-inline") {
		t.Errorf("CSP %q", csp)
	}

	// The login page: a wrong token is refused, the right one sets an
	// HttpOnly SameSite=Strict cookie under the mount path.
	jar := &cookieClient{t: t, s: s}
	page := jar.get("login")
	csrf := between(page, `name="csrf" value="`, `"`)
	if code, _ := jar.post("login", url.Values{"csrf": {csrf}, "token": {"nope-nope-nope-nope"}}); code != http.StatusUnauthorized {
		t.Errorf("login with a wrong token: %d", code)
	}
	if code, _ := jar.post("login", url.Values{"token": {operateToken}}); code != http.StatusForbidden {
		t.Errorf("login without the form's CSRF token: %d, want 403", code)
	}
	code, resp := jar.post("login", url.Values{"csrf": {csrf}, "token": {operateToken}, "next": {"parked"}})
	if code != http.StatusSeeOther || resp.Header.Get("Location") != "/admin/parked" {
		t.Fatalf("login: %d to %q", code, resp.Header.Get("Location"))
	}
	c := resp.Cookies()
	if len(c) != 1 || !c[0].HttpOnly || c[0].SameSite != http.SameSiteStrictMode || c[0].Path != "/admin/" {
		t.Fatalf("session cookie %+v", c)
	}
	if body := jar.get("parked"); !strings.Contains(body, "Parked events in") {
		t.Fatalf("the session does not open the parked page: %s", body)
	}
}

func TestStateChangesNeedCSRFAndOperate(t *testing.T) {
	s := newSetup(t)
	before := s.count(t, "parked_at IS NOT NULL")
	act := adminui.ActionRequest{Action: "requeue", Matching: true, Filter: adminui.Filter{Topic: "orders"}}
	refused := []struct {
		name    string
		token   string
		headers []string
		want    int
	}{
		{"no session", "", []string{"X-CSRF-Token", s.csrf(t, operateToken)}, http.StatusUnauthorized},
		{"no CSRF token", operateToken, nil, http.StatusForbidden},
		{"a wrong CSRF token", operateToken, []string{"X-CSRF-Token", "forged"}, http.StatusForbidden},
		{"another principal's CSRF token", operateToken, []string{"X-CSRF-Token", s.csrf(t, readToken)}, http.StatusForbidden},
		{"cross-site", operateToken, []string{"X-CSRF-Token", s.csrf(t, operateToken), "Sec-Fetch-Site", "cross-site"}, http.StatusForbidden},
		{"another origin", operateToken, []string{"X-CSRF-Token", s.csrf(t, operateToken), "Origin", "https://evil.example.com"}, http.StatusForbidden},
		{"a read-only token", readToken, []string{"X-CSRF-Token", s.csrf(t, readToken)}, http.StatusForbidden},
	}
	for _, r := range refused {
		if code, b, _ := s.do(t, "POST", "api/actions", r.token, act, r.headers...); code != r.want {
			t.Errorf("%s: %d %s, want %d", r.name, code, b, r.want)
		}
	}
	if after := s.count(t, "parked_at IS NOT NULL"); after != before {
		t.Fatalf("refused requests changed rows: %d parked, was %d", after, before)
	}
	if !strings.Contains(s.logs.String(), "action refused") {
		t.Errorf("the read-only refusal is not logged")
	}
	// The read role may count.
	code, b, _ := s.do(t, "POST", "api/count", readToken, act, "X-CSRF-Token", s.csrf(t, readToken))
	if code != 200 || !strings.Contains(string(b), `"count": 40`) {
		t.Errorf("read count: %d %s", code, b)
	}
}

func TestRequeueEverythingMatching(t *testing.T) {
	s := newSetup(t)
	csrf := s.csrf(t, operateToken)
	act := adminui.ActionRequest{Action: "requeue", Matching: true, Filter: adminui.Filter{Topic: "orders", Reason: "message_too_large"}}
	code, b, _ := s.do(t, "POST", "api/actions", operateToken, act, "X-CSRF-Token", csrf, "Origin", s.srv.URL)
	if code != http.StatusAccepted {
		t.Fatalf("requeue: %d %s", code, b)
	}
	var job adminui.Job
	if err := json.Unmarshal(b, &job); err != nil {
		t.Fatal(err)
	}
	job = s.wait(t, operateToken, job)
	// 40 rows in chunks of 7: every row, not the page of 20.
	if job.State != "done" || job.Done != 40 || job.Total != 40 {
		t.Fatalf("job %+v", job)
	}
	if n := s.count(t, "topic = 'orders' AND parked_at IS NOT NULL"); n != 0 {
		t.Fatalf("%d orders events still parked", n)
	}
	if n := s.count(t, "topic = 'orders' AND parked_at IS NULL AND published_at IS NULL AND attempts = 0 AND last_error IS NOT NULL"); n != 40 {
		t.Fatalf("%d orders events back in line, want 40", n)
	}
	if n := s.count(t, "parked_at IS NOT NULL"); n != 28 {
		t.Fatalf("%d parked left, want 28", n)
	}
	log := s.logs.String()
	if !strings.Contains(log, `"msg":"adminui: audit"`) || !strings.Contains(log, `"who":"alice"`) || !strings.Contains(log, `"count":40`) ||
		!strings.Contains(log, `message_too_large`) {
		t.Fatalf("no audit line: %s", log)
	}
}

func TestDeleteSelectionAndReplayOne(t *testing.T) {
	s := newSetup(t)
	csrf := s.csrf(t, operateToken)
	var ids []string
	rows, err := s.pool.Query(s.ctx, "SELECT event_id::text FROM "+sqlname.Ident(s.table)+" WHERE topic = 'payments' ORDER BY id LIMIT 3")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		_ = rows.Scan(&id)
		ids = append(ids, id)
	}
	rows.Close()
	job := s.act(t, csrf, adminui.ActionRequest{Action: "delete", EventIDs: ids})
	if job.Done != 3 || s.count(t, "topic = 'payments'") != 22 {
		t.Fatalf("delete selection: %+v", job)
	}
	var pub string
	if err := s.pool.QueryRow(s.ctx, "SELECT event_id::text FROM "+sqlname.Ident(s.table)+" WHERE published_at IS NOT NULL LIMIT 1").Scan(&pub); err != nil {
		t.Fatal(err)
	}
	job = s.act(t, csrf, adminui.ActionRequest{Action: "replay", EventIDs: []string{pub}})
	if job.Done != 1 || s.count(t, "event_id = '"+pub+"' AND published_at IS NULL") != 1 {
		t.Fatalf("replay: %+v", job)
	}
	// An action without a scope is refused.
	if code, _, _ := s.do(t, "POST", "api/actions", operateToken, adminui.ActionRequest{Action: "delete"}, "X-CSRF-Token", csrf); code != 400 {
		t.Fatalf("an action with neither ids nor matching: %d", code)
	}
}

func TestInboxRecords(t *testing.T) {
	s := newSetup(t)
	code, b, _ := s.do(t, "GET", "api/inbox?consumer=billing", readToken, nil)
	var ip adminui.InboxPage
	if code != 200 || json.Unmarshal(b, &ip) != nil || len(ip.Records) != 6 || len(ip.Groups) != 2 {
		t.Fatalf("api/inbox: %d %s", code, b)
	}
	code, b, _ = s.do(t, "GET", "inbox-record?id="+jsonNum(ip.Records[0].ID), readToken, nil)
	if code != 200 || strings.Contains(string(b), xssScript) || !strings.Contains(string(b), "&lt;script&gt;alert(1)&lt;/script&gt;") {
		t.Fatalf("inbox record page: %d", code)
	}
	csrf := s.csrf(t, operateToken)
	job := s.act(t, csrf, adminui.ActionRequest{Action: "delete", Inbox: s.inbox.String(), Matching: true, InboxFilter: adminui.InboxFilter{Consumer: "shipping"}})
	if job.Done != 3 {
		t.Fatalf("inbox delete: %+v", job)
	}
	if code, _, _ := s.do(t, "POST", "api/actions", operateToken, adminui.ActionRequest{Action: "requeue", Inbox: s.inbox.String(), IDs: []int64{1}},
		"X-CSRF-Token", csrf); code != 400 {
		t.Fatalf("inbox requeue: %d, want 400", code)
	}
}

func TestStoredValuesAreEscaped(t *testing.T) {
	s := newSetup(t)
	var id string
	if err := s.pool.QueryRow(s.ctx, "SELECT event_id::text FROM "+sqlname.Ident(s.table)+" WHERE topic = 'xss' LIMIT 1").Scan(&id); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"", "parked?topic=xss", "event?id=" + id, "inbox"} {
		code, b, _ := s.do(t, "GET", path, readToken, nil)
		body := string(b)
		if code != 200 {
			t.Fatalf("%s: %d %s", path, code, body)
		}
		if strings.Contains(body, "<script>alert") || strings.Contains(body, "<img src=x") {
			t.Errorf("%s: a stored value is markup:\n%s", path, body)
		}
	}
	_, b, _ := s.do(t, "GET", "event?id="+id, readToken, nil)
	body := string(b)
	for _, want := range []string{"&lt;script&gt;alert(1)&lt;/script&gt;", "&#34;&gt;&lt;img src=x onerror=alert(1)&gt;",
		`href="https://traces.example.com/trace/0af7651916cd43dd8448eb211c80319c"`, `id="state">parked`} {
		if !strings.Contains(body, want) {
			t.Errorf("event page lacks %s", want)
		}
	}
	// The payload shown is pretty-printed JSON.
	if !strings.Contains(body, "{\n  &#34;attr&#34;") {
		t.Errorf("payload not pretty-printed:\n%s", between(body, `<pre id="payload">`, "</pre>"))
	}
}

func TestParkedKeysetPages(t *testing.T) {
	s := newSetup(t)
	var seen []int64
	after := int64(0)
	for page := 0; page < 10; page++ {
		code, b, _ := s.do(t, "GET", "api/parked?after="+jsonNum(after), readToken, nil)
		var pp adminui.ParkedPage
		if code != 200 || json.Unmarshal(b, &pp) != nil {
			t.Fatalf("api/parked: %d %s", code, b)
		}
		if page == 0 && (pp.Matching != 68 || len(pp.Groups) != 3 || pp.Groups[0].Count != 40) {
			t.Fatalf("first page: %d matching, groups %+v", pp.Matching, pp.Groups)
		}
		for _, e := range pp.Events {
			seen = append(seen, e.ID)
		}
		if pp.Next == 0 {
			break
		}
		after = pp.Next
	}
	if len(seen) != 68 {
		t.Fatalf("pages held %d events, want 68", len(seen))
	}
	for i := 1; i < len(seen); i++ {
		if seen[i] <= seen[i-1] {
			t.Fatalf("ids not increasing: %v", seen)
		}
	}
	if code, _, _ := s.do(t, "GET", "api/parked?event_id=nope", readToken, nil); code != 400 {
		t.Fatalf("a bad event id: %d", code)
	}
	if code, _, _ := s.do(t, "GET", "api/parked?table=other.outbox_event", readToken, nil); code != 404 {
		t.Fatalf("an unknown table: %d", code)
	}
}

func TestTwoTables(t *testing.T) {
	s := newSetup(t)
	other := testenv.Table(t, s.pool)
	s.exec(t, `INSERT INTO `+sqlname.Ident(other)+` (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, parked_at, attempts, last_error)
		SELECT gen_random_uuid(), 'a', 'a', 't', '{}', 'orders', 'k', now(), 5, '[invalid_topic] x' FROM generate_series(1, 4)`)
	h, err := adminui.NewHandler(adminui.Config{DB: s.pool, Tables: []outbox.Table{s.table, other}, InsecureAllowAnonymous: adminui.RoleOperate, Logger: slogTo(io.Discard)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer func() { srv.Close(); h.Close() }()
	s.url = srv.URL + "/"
	code, b, _ := s.do(t, "GET", "api/overview", "", nil)
	var ov adminui.Overview
	if code != 200 || json.Unmarshal(b, &ov) != nil || len(ov.Tables) != 2 || ov.Tables[1].Status.Parked != 4 {
		t.Fatalf("api/overview: %d %s", code, b)
	}
	// Everything matching "orders" in the second table, not the first.
	csrf := s.csrf(t, operateToken) // act sends it; anonymous, it only binds the CSRF token
	job := s.act(t, csrf, adminui.ActionRequest{Action: "delete", Table: other.String(), Matching: true, Filter: adminui.Filter{Topic: "orders"}})
	if job.Done != 4 || s.count(t, "topic = 'orders' AND parked_at IS NOT NULL") != 40 {
		t.Fatalf("delete in the second table: %+v", job)
	}
	if code, _, _ := s.do(t, "POST", "api/count", operateToken, adminui.ActionRequest{Action: "delete", Table: "nope.outbox_event", Matching: true}, "X-CSRF-Token", csrf); code != 400 {
		t.Fatalf("an unknown table: %d", code)
	}
}
