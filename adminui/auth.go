package adminui

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Role is what a request may do.
type Role int

const (
	// RoleNone may do nothing: pages answer 401 (or the login page), the
	// API 401 or 403.
	RoleNone Role = iota
	// RoleRead may see every page and read the API, and change nothing.
	RoleRead
	// RoleOperate may also requeue, delete and replay.
	RoleOperate
)

// String returns "none", "read" or "operate".
func (r Role) String() string {
	switch r {
	case RoleRead:
		return "read"
	case RoleOperate:
		return "operate"
	}
	return "none"
}

// Principal is who made a request and what they may do. Name is written in
// the audit log line of each action they take.
type Principal struct {
	Name string
	Role Role
}

// Authorizer maps a request to its principal. A request it does not
// recognize gets the zero Principal (RoleNone): the handler refuses it.
// Authorize is called on every request, concurrently.
type Authorizer interface {
	Authorize(r *http.Request) Principal
}

// AuthorizerFunc is a function that is an Authorizer.
type AuthorizerFunc func(r *http.Request) Principal

// Authorize calls f(r).
func (f AuthorizerFunc) Authorize(r *http.Request) Principal { return f(r) }

// LoginAuthorizer is an Authorizer that also takes a secret typed into the
// UI's login page and remembers the principal in a session cookie. When the
// configured Authorizer is one, the handler serves a login page and a
// logout button; otherwise a request without a principal is refused.
type LoginAuthorizer interface {
	Authorizer
	// Login checks secret and, when it is right, sets the session cookie
	// on w (path: cookiePath) and returns true.
	Login(w http.ResponseWriter, r *http.Request, secret, cookiePath string) bool
	// Logout clears the session cookie.
	Logout(w http.ResponseWriter, r *http.Request, cookiePath string)
}

// sessionCookie is the name of the cookie TokenAuthorizer's sessions use.
const sessionCookie = "outbox_ui_session"

// Token is one secret TokenAuthorizer accepts, and whom it stands for.
type Token struct {
	// Secret is the token: sent as "Authorization: Bearer <Secret>", or
	// typed into the login page. At least 16 bytes.
	Secret string
	// Name names the principal in the audit log. Default "token".
	Name string
	// Role is what the token may do (RoleRead or RoleOperate).
	Role Role
}

// TokenAuthorizer accepts bearer tokens and the sessions its login page
// opens: an HttpOnly, SameSite=Strict cookie named outbox_ui_session
// (Secure over TLS) signed with a key drawn at start, valid for 12 hours.
// Sessions end when the process restarts. It is what `outboxctl ui` uses.
type TokenAuthorizer struct {
	tokens []Token
	key    []byte
	ttl    time.Duration
	now    func() time.Time
}

var _ LoginAuthorizer = (*TokenAuthorizer)(nil)

// sessionTTL is how long a login lasts.
const sessionTTL = 12 * time.Hour

// ErrWeakToken is returned by NewTokenAuthorizer for a token shorter than
// 16 bytes.
var ErrWeakToken = errors.New("adminui: a token must be at least 16 bytes (use NewToken)")

// NewTokenAuthorizer returns an authorizer that accepts these tokens.
func NewTokenAuthorizer(tokens ...Token) (*TokenAuthorizer, error) {
	if len(tokens) == 0 {
		return nil, errors.New("adminui: NewTokenAuthorizer needs at least one token")
	}
	a := &TokenAuthorizer{key: make([]byte, 32), ttl: sessionTTL, now: time.Now}
	for _, t := range tokens {
		if len(t.Secret) < 16 {
			return nil, ErrWeakToken
		}
		if t.Role != RoleRead && t.Role != RoleOperate {
			return nil, errors.New("adminui: a token's Role must be RoleRead or RoleOperate")
		}
		if t.Name == "" {
			t.Name = "token"
		}
		if strings.ContainsAny(t.Name, "|") {
			return nil, errors.New("adminui: a token's Name must not contain |")
		}
		a.tokens = append(a.tokens, t)
	}
	if _, err := rand.Read(a.key); err != nil {
		return nil, err
	}
	return a, nil
}

// NewToken returns a random token: 32 bytes, URL-safe base64.
func NewToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// Authorize accepts "Authorization: Bearer <token>" and the session cookie.
func (a *TokenAuthorizer) Authorize(r *http.Request) Principal {
	if h := r.Header.Get("Authorization"); h != "" {
		scheme, secret, ok := strings.Cut(h, " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") {
			return Principal{}
		}
		if t, ok := a.match(strings.TrimSpace(secret)); ok {
			return Principal{Name: t.Name, Role: t.Role}
		}
		return Principal{}
	}
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return Principal{}
	}
	return a.session(c.Value)
}

func (a *TokenAuthorizer) match(secret string) (Token, bool) {
	var found Token
	ok := false
	for _, t := range a.tokens {
		// Compare every token in constant time, whatever matched.
		if subtle.ConstantTimeCompare([]byte(t.Secret), []byte(secret)) == 1 {
			found, ok = t, true
		}
	}
	return found, ok
}

// Login sets a session cookie when secret is one of the tokens.
func (a *TokenAuthorizer) Login(w http.ResponseWriter, r *http.Request, secret, cookiePath string) bool {
	t, ok := a.match(strings.TrimSpace(secret))
	if !ok {
		return false
	}
	exp := a.now().Add(a.ttl)
	body := t.Name + "|" + strconv.Itoa(int(t.Role)) + "|" + strconv.FormatInt(exp.Unix(), 10)
	v := base64.RawURLEncoding.EncodeToString([]byte(body)) + "." + base64.RawURLEncoding.EncodeToString(a.sign(body))
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: v, Path: cookiePath, Expires: exp, HttpOnly: true,
		Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	return true
}

// Logout clears the session cookie.
func (a *TokenAuthorizer) Logout(w http.ResponseWriter, r *http.Request, cookiePath string) {
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: cookiePath, MaxAge: -1, HttpOnly: true,
		Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
}

func (a *TokenAuthorizer) sign(body string) []byte {
	m := hmac.New(sha256.New, a.key)
	m.Write([]byte("session|" + body))
	return m.Sum(nil)
}

func (a *TokenAuthorizer) session(v string) Principal {
	b64, sig64, ok := strings.Cut(v, ".")
	if !ok {
		return Principal{}
	}
	body, err1 := base64.RawURLEncoding.DecodeString(b64)
	sig, err2 := base64.RawURLEncoding.DecodeString(sig64)
	if err1 != nil || err2 != nil || !hmac.Equal(sig, a.sign(string(body))) {
		return Principal{}
	}
	parts := strings.Split(string(body), "|")
	if len(parts) != 3 {
		return Principal{}
	}
	role, err1 := strconv.Atoi(parts[1])
	exp, err2 := strconv.ParseInt(parts[2], 10, 64)
	if err1 != nil || err2 != nil || a.now().Unix() >= exp {
		return Principal{}
	}
	// The role is the token's now: a token removed since gives nothing.
	for _, t := range a.tokens {
		if t.Name == parts[0] && int(t.Role) == role {
			return Principal{Name: t.Name, Role: t.Role}
		}
	}
	return Principal{}
}

// HeaderAuthorizer trusts headers set by an authenticating proxy in front
// of the handler (oauth2-proxy, an OIDC-aware ingress, Pomerium): UserHeader
// names the user, GroupsHeader lists their groups (comma-separated), and a
// user in one of OperateGroups may operate, in one of ReadGroups may read.
// Use it only when every request reaches the handler through that proxy,
// which must strip these headers from the client's requests.
type HeaderAuthorizer struct {
	// UserHeader names the user. Default "X-Forwarded-User".
	UserHeader string
	// GroupsHeader lists the user's groups. Default "X-Forwarded-Groups".
	GroupsHeader string
	// ReadGroups may read; OperateGroups may operate. A group "*" matches
	// any authenticated user. Default: none.
	ReadGroups, OperateGroups []string
}

// Authorize reads the proxy's headers.
func (h HeaderAuthorizer) Authorize(r *http.Request) Principal {
	uh, gh := h.UserHeader, h.GroupsHeader
	if uh == "" {
		uh = "X-Forwarded-User"
	}
	if gh == "" {
		gh = "X-Forwarded-Groups"
	}
	user := strings.TrimSpace(r.Header.Get(uh))
	if user == "" {
		return Principal{}
	}
	var groups []string
	for _, g := range strings.Split(r.Header.Get(gh), ",") {
		if g = strings.TrimSpace(g); g != "" {
			groups = append(groups, g)
		}
	}
	in := func(allowed []string) bool {
		for _, a := range allowed {
			if a == "*" {
				return true
			}
			for _, g := range groups {
				if g == a {
					return true
				}
			}
		}
		return false
	}
	switch {
	case in(h.OperateGroups):
		return Principal{Name: user, Role: RoleOperate}
	case in(h.ReadGroups):
		return Principal{Name: user, Role: RoleRead}
	}
	return Principal{Name: user}
}
