package adminui

import (
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"encoding/json"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
)

//go:embed assets
var assets embed.FS

// Handler is the admin UI: an http.Handler to mount in the application's
// own mux, under any prefix with http.StripPrefix:
//
//	mux.Handle("/outbox/", http.StripPrefix("/outbox", h))
//
// Its links are relative to where it is mounted. Close ends the bulk
// actions still running (each stops after its current chunk) and waits for
// them.
type Handler struct {
	cfg    Config
	pages  map[string]*template.Template
	key    []byte // signs CSRF tokens
	cop    *http.CrossOriginProtection
	static http.Handler

	ctx    context.Context // the jobs'; Close cancels it
	cancel context.CancelFunc
	wg     sync.WaitGroup
	jobs   jobs
}

var _ http.Handler = (*Handler)(nil)

// NewHandler returns the admin UI over cfg's tables. It refuses a Config
// without an Authorizer (ErrNoAuthorizer) unless InsecureAllowAnonymous is
// set, which it logs as a warning. It does not touch the database.
func NewHandler(cfg Config) (*Handler, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	h := &Handler{cfg: c, key: make([]byte, 32), cop: http.NewCrossOriginProtection(), pages: map[string]*template.Template{}}
	if _, err := rand.Read(h.key); err != nil {
		return nil, err
	}
	for _, name := range []string{"overview", "parked", "event", "inbox", "record", "login"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(assets, "assets/layout.html", "assets/"+name+".html")
		if err != nil {
			return nil, err
		}
		h.pages[name] = t
	}
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		return nil, err
	}
	h.static = http.FileServer(http.FS(sub))
	h.ctx, h.cancel = context.WithCancel(context.Background())
	h.jobs.byID = map[string]*bulkJob{}
	if c.Authorizer == nil {
		c.Logger.Warn("adminui: serving WITHOUT AUTHENTICATION (InsecureAllowAnonymous): every request that reaches the handler may "+
			c.InsecureAllowAnonymous.String(), "role", c.InsecureAllowAnonymous.String())
	}
	return h, nil
}

// Close cancels the bulk actions still running and waits for them to end.
func (h *Handler) Close() {
	h.cancel()
	h.wg.Wait()
}

// principal is who makes r.
func (h *Handler) principal(r *http.Request) Principal {
	if h.cfg.Authorizer == nil {
		return Principal{Name: "anonymous", Role: h.cfg.InsecureAllowAnonymous}
	}
	p := h.cfg.Authorizer.Authorize(r)
	if p.Role < RoleNone || p.Role > RoleOperate {
		p.Role = RoleNone
	}
	return p
}

// csrfToken is the token every state-changing request of p must carry,
// bound to its credential (session cookie or bearer token).
func (h *Handler) csrfToken(r *http.Request, p Principal) string {
	cred := r.Header.Get("Authorization")
	if c, err := r.Cookie(sessionCookie); err == nil && cred == "" {
		cred = c.Value
	}
	m := hmac.New(sha256.New, h.key)
	m.Write([]byte("csrf|" + p.Name + "|" + p.Role.String() + "|" + cred))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// checkCSRF checks the request's X-CSRF-Token header (or csrf form field)
// and that it comes from the handler's own origin.
func (h *Handler) checkCSRF(r *http.Request, p Principal) bool {
	if err := h.cop.Check(r); err != nil {
		return false
	}
	got := r.Header.Get("X-CSRF-Token")
	if got == "" {
		got = r.PostFormValue("csrf")
	}
	return got != "" && hmac.Equal([]byte(got), []byte(h.csrfToken(r, p)))
}

// base is the path the handler is mounted at, ending in "/", from the
// request's original URI and the path left after http.StripPrefix.
func base(r *http.Request, rest string) string {
	orig := r.RequestURI
	if u, err := url.ParseRequestURI(orig); err == nil {
		orig = u.Path
	} else {
		orig = ""
	}
	b := strings.TrimSuffix(orig, rest)
	if b == orig && rest != "" || b == "" || !strings.HasPrefix(b, "/") || strings.HasPrefix(b, "//") {
		return "/"
	}
	if !strings.HasSuffix(b, "/") {
		b += "/"
	}
	return b
}

// ServeHTTP serves the pages, their JSON twins under api/, and the assets.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self';"+
		" form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("Cache-Control", "no-store")
	path := strings.TrimPrefix(r.URL.Path, "/")
	rq := &request{Request: r, w: w, h: h, path: path, base: base(r, strings.TrimPrefix(r.URL.Path, "/"))}
	if strings.HasPrefix(path, "assets/") && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		r2 := r.Clone(r.Context())
		r2.URL.Path = strings.TrimPrefix(path, "assets")
		hd.Set("Cache-Control", "public, max-age=300")
		h.static.ServeHTTP(w, r2)
		return
	}
	if path == "login" || path == "logout" {
		h.serveLogin(rq)
		return
	}
	rq.p = h.principal(r)
	api := strings.HasPrefix(path, "api/")
	if rq.p.Role == RoleNone {
		switch {
		case api && rq.p.Name != "":
			rq.fail(http.StatusForbidden, "forbidden: "+rq.p.Name+" has no role")
		case api:
			rq.fail(http.StatusUnauthorized, "unauthorized: send Authorization: Bearer <token>, or log in")
		case r.Method == http.MethodGet && h.login() != nil:
			to := rq.base + "login"
			if next := path + query(r); next != "" {
				to += "?next=" + url.QueryEscape(next)
			}
			http.Redirect(w, r, to, http.StatusSeeOther)
		default:
			http.Error(w, "unauthorized", http.StatusUnauthorized)
		}
		return
	}
	rq.csrf = h.csrfToken(r, rq.p)
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		if !h.checkCSRF(r, rq.p) {
			rq.fail(http.StatusForbidden, "forbidden: a state-changing request needs the page's CSRF token (X-CSRF-Token) and the UI's own origin")
			return
		}
	}
	h.route(rq)
}

func query(r *http.Request) string {
	if r.URL.RawQuery == "" {
		return ""
	}
	return "?" + r.URL.RawQuery
}

// route dispatches an authorized request.
func (h *Handler) route(rq *request) {
	get := rq.Method == http.MethodGet || rq.Method == http.MethodHead
	post := rq.Method == http.MethodPost
	switch {
	case rq.path == "" && get:
		h.pageOverview(rq)
	case rq.path == "parked" && get:
		h.pageParked(rq)
	case rq.path == "event" && get:
		h.pageEvent(rq)
	case rq.path == "inbox" && get:
		h.pageInbox(rq)
	case rq.path == "inbox-record" && get:
		h.pageRecord(rq)
	case rq.path == "api/session" && get:
		rq.json(map[string]any{"name": rq.p.Name, "role": rq.p.Role.String(), "csrf_token": rq.csrf})
	case rq.path == "api/overview" && get:
		h.apiOverview(rq)
	case rq.path == "api/parked" && get:
		h.apiParked(rq)
	case rq.path == "api/event" && get:
		h.apiEvent(rq)
	case rq.path == "api/inbox" && get:
		h.apiInbox(rq)
	case rq.path == "api/inbox-record" && get:
		h.apiRecord(rq)
	case rq.path == "api/count" && post:
		h.apiCount(rq)
	case rq.path == "api/actions" && post:
		h.apiAction(rq)
	case strings.HasPrefix(rq.path, "api/jobs/") && get:
		h.apiJob(rq, strings.TrimPrefix(rq.path, "api/jobs/"))
	default:
		rq.fail(http.StatusNotFound, "not found")
	}
}

// login returns the Authorizer's login, if it has one.
func (h *Handler) login() LoginAuthorizer {
	l, _ := h.cfg.Authorizer.(LoginAuthorizer)
	return l
}

// loginToken is the CSRF token of the login form, which has no principal
// yet.
func (h *Handler) loginToken() string {
	m := hmac.New(sha256.New, h.key)
	m.Write([]byte("login"))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

func (h *Handler) serveLogin(rq *request) {
	l := h.login()
	if l == nil {
		rq.fail(http.StatusNotFound, "this UI has no login page: its authorizer authenticates each request")
		return
	}
	next := rq.FormValue("next")
	// next is a path under the handler's base: never another host.
	if next = strings.TrimLeft(next, "/"); strings.Contains(next, "//") || strings.Contains(next, `\`) {
		next = ""
	}
	switch {
	case rq.path == "logout" && rq.Method == http.MethodPost:
		if !h.checkCSRF(rq.Request, h.principal(rq.Request)) {
			rq.fail(http.StatusForbidden, "forbidden: log out from the UI's own page")
			return
		}
		l.Logout(rq.w, rq.Request, rq.base)
		http.Redirect(rq.w, rq.Request, rq.base+"login", http.StatusSeeOther)
	case rq.Method == http.MethodPost && (h.cop.Check(rq.Request) != nil || !hmac.Equal([]byte(rq.PostFormValue("csrf")), []byte(h.loginToken()))):
		rq.fail(http.StatusForbidden, "forbidden: the login form must come from this UI")
	case rq.path == "login" && rq.Method == http.MethodPost:
		if l.Login(rq.w, rq.Request, rq.PostFormValue("token"), rq.base) {
			http.Redirect(rq.w, rq.Request, rq.base+next, http.StatusSeeOther)
			return
		}
		rq.csrf = h.loginToken()
		rq.page(http.StatusUnauthorized, "login", map[string]any{"Error": "That token is not valid.", "Next": next})
	case rq.path == "login" && rq.Method == http.MethodGet:
		rq.csrf = h.loginToken()
		rq.page(http.StatusOK, "login", map[string]any{"Next": next})
	default:
		rq.fail(http.StatusMethodNotAllowed, "method not allowed")
	}
}

// request is one request being served.
type request struct {
	*http.Request
	w    http.ResponseWriter
	h    *Handler
	path string
	base string
	p    Principal
	csrf string
}

func (rq *request) api() bool { return strings.HasPrefix(rq.path, "api/") }

// fail answers with an error: JSON under api/, text elsewhere.
func (rq *request) fail(code int, msg string) {
	if rq.api() {
		rq.w.Header().Set("Content-Type", "application/json")
		rq.w.WriteHeader(code)
		_ = json.NewEncoder(rq.w).Encode(map[string]string{"error": msg})
		return
	}
	http.Error(rq.w, msg, code)
}

// dbFail logs a database error and answers 500 without its details.
func (rq *request) dbFail(err error) {
	rq.h.cfg.Logger.Error("adminui: request failed", "path", rq.path, "error", err)
	rq.fail(http.StatusInternalServerError, "the database query failed: "+err.Error())
}

func (rq *request) json(v any) {
	rq.w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(rq.w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		rq.h.cfg.Logger.Debug("adminui: write response", "error", err)
	}
}

// layout is what every page's layout shows.
type layout struct {
	Title, Base, CSRF, Page string
	Principal               Principal
	CanOperate, CanLogout   bool
	Tables, Inboxes         []string
	// Current is the table or inbox the page is about.
	Current string
	Data    any
}

func (rq *request) page(code int, name string, data any) {
	l := layout{Title: rq.h.cfg.Title, Base: rq.base, CSRF: rq.csrf, Page: name, Principal: rq.p, Data: data,
		CanOperate: rq.p.Role == RoleOperate, CanLogout: rq.h.login() != nil && rq.p.Role != RoleNone}
	for _, t := range rq.h.cfg.Tables {
		l.Tables = append(l.Tables, t.String())
	}
	for _, t := range rq.h.cfg.Inboxes {
		l.Inboxes = append(l.Inboxes, t.String())
	}
	switch {
	case (name == "parked" || name == "event") && len(l.Tables) > 0:
		l.Current = cmp.Or(rq.FormValue("table"), l.Tables[0])
	case (name == "inbox" || name == "record") && len(l.Inboxes) > 0:
		l.Current = cmp.Or(rq.FormValue("inbox"), l.Inboxes[0])
	}
	rq.w.Header().Set("Content-Type", "text/html; charset=utf-8")
	var b strings.Builder
	if err := rq.h.pages[name].Execute(&b, l); err != nil {
		rq.h.cfg.Logger.Error("adminui: render page", "page", name, "error", err)
		http.Error(rq.w, "the page failed to render", http.StatusInternalServerError)
		return
	}
	rq.w.WriteHeader(code)
	_, _ = rq.w.Write([]byte(b.String()))
}

// audit writes the one log line of an action.
func (h *Handler) audit(j *bulkJob) {
	lvl := slog.LevelInfo
	attrs := []any{"who", j.Who, "role", j.Role, "action", j.Action, "table", j.Table, "filter", j.Filter, "count", j.Done, "state", j.State}
	if j.Error != "" {
		lvl = slog.LevelError
		attrs = append(attrs, "error", j.Error)
	}
	h.cfg.Logger.Log(context.Background(), lvl, "adminui: audit", attrs...)
}
