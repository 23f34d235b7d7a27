package adminui

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
)

// Config configures NewHandler.
type Config struct {
	// DB is the database of the tables. Required. Bulk actions commit each
	// chunk of rows on its own connection of the pool.
	DB *pgxpool.Pool
	// Tables are the outbox tables shown. Default: one, outbox_event in
	// the search_path (the zero outbox.Table).
	Tables []outbox.Table
	// Inboxes are the inbox tables (package inbox) whose parked records are
	// shown, for every consumer name. Default: none.
	Inboxes []outbox.Table
	// Authorizer tells who a request is and what they may do. Required,
	// unless InsecureAllowAnonymous is set: NewHandler refuses a Config
	// without one. Ready ones: TokenAuthorizer (bearer tokens and a login
	// page), HeaderAuthorizer (an authenticating proxy's headers); any
	// AuthorizerFunc (mTLS: read r.TLS.PeerCertificates). Default nil.
	Authorizer Authorizer
	// InsecureAllowAnonymous, when not RoleNone and Authorizer is nil,
	// gives every request that role without any check: anyone who reaches
	// the handler may read, or with RoleOperate requeue and delete. Use it
	// only behind something that authenticates; NewHandler logs a warning.
	// Default RoleNone.
	InsecureAllowAnonymous Role
	// Logger receives the audit lines (one per action: who, what, the
	// filter, how many) and the warning of InsecureAllowAnonymous.
	// Default: slog.Default().
	Logger *slog.Logger
	// TraceURL, when set, makes an event's trace id a link: "{trace_id}"
	// in it is replaced by the id, e.g.
	// "https://jaeger.example.com/trace/{trace_id}". Default "".
	TraceURL string
	// Lanes is the number of lanes the relays use (OUTBOX_LANES), shown on
	// the overview. Default 64.
	Lanes int
	// ChunkSize is the most rows one statement of a bulk action changes,
	// each committed on its own. Default 5000 (a chunk of 5000 parked rows
	// is updated in tens of milliseconds; relays never wait on parked rows).
	ChunkSize int
	// PageSize is the number of rows a list page shows. Default 50.
	PageSize int
	// Title is the page title. Default "fxoutbox".
	Title string
}

// Defaults.
const (
	defaultChunkSize = 5000
	defaultPageSize  = 50
	defaultLanes     = 64
)

func (c Config) withDefaults() (Config, error) {
	if c.DB == nil {
		return c, &outbox.ConfigError{Field: "adminui.Config.DB", Reason: "is nil: give the pool of the outbox's database"}
	}
	if c.Authorizer == nil && c.InsecureAllowAnonymous == RoleNone {
		return c, ErrNoAuthorizer
	}
	if c.Authorizer != nil && c.InsecureAllowAnonymous != RoleNone {
		return c, &outbox.ConfigError{Field: "adminui.Config.InsecureAllowAnonymous", Reason: "is set together with an Authorizer: use one of them"}
	}
	if c.InsecureAllowAnonymous < RoleNone || c.InsecureAllowAnonymous > RoleOperate {
		return c, &outbox.ConfigError{Field: "adminui.Config.InsecureAllowAnonymous", Reason: "is not a Role"}
	}
	if len(c.Tables) == 0 {
		c.Tables = []outbox.Table{{}}
	}
	seen := map[string]bool{}
	for i, t := range c.Tables {
		t = t.WithDefaults()
		if err := t.Validate(); err != nil {
			return c, err
		}
		if seen["o:"+t.String()] {
			return c, &outbox.ConfigError{Field: "adminui.Config.Tables", Reason: fmt.Sprintf("names %s twice", t)}
		}
		seen["o:"+t.String()] = true
		c.Tables[i] = t
	}
	for i, t := range c.Inboxes {
		t = sqlname.Inbox(t)
		if err := t.Validate(); err != nil {
			return c, err
		}
		if seen["i:"+t.String()] {
			return c, &outbox.ConfigError{Field: "adminui.Config.Inboxes", Reason: fmt.Sprintf("names %s twice", t)}
		}
		seen["i:"+t.String()] = true
		c.Inboxes[i] = t
	}
	if c.TraceURL != "" && !strings.Contains(c.TraceURL, "{trace_id}") {
		return c, &outbox.ConfigError{Field: "adminui.Config.TraceURL", Reason: "has no {trace_id}"}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Lanes == 0 {
		c.Lanes = defaultLanes
	}
	if c.ChunkSize == 0 {
		c.ChunkSize = defaultChunkSize
	}
	if c.PageSize == 0 {
		c.PageSize = defaultPageSize
	}
	if c.Title == "" {
		c.Title = "fxoutbox"
	}
	switch {
	case c.ChunkSize < 1 || c.ChunkSize > 100000:
		return c, &outbox.ConfigError{Field: "adminui.Config.ChunkSize", Reason: fmt.Sprintf("is %d: use 1 to 100000 (default %d)", c.ChunkSize, defaultChunkSize)}
	case c.PageSize < 1 || c.PageSize > 1000:
		return c, &outbox.ConfigError{Field: "adminui.Config.PageSize", Reason: fmt.Sprintf("is %d: use 1 to 1000 (default %d)", c.PageSize, defaultPageSize)}
	case c.Lanes < 1 || c.Lanes > 4096:
		return c, &outbox.ConfigError{Field: "adminui.Config.Lanes", Reason: fmt.Sprintf("is %d: use 1 to 4096 (default %d)", c.Lanes, defaultLanes)}
	}
	return c, nil
}

// ErrNoAuthorizer is returned by NewHandler for a Config with neither an
// Authorizer nor InsecureAllowAnonymous: the UI is deny-by-default.
var ErrNoAuthorizer = errors.New("adminui: Config.Authorizer is nil: give one (TokenAuthorizer, HeaderAuthorizer, an AuthorizerFunc), or set InsecureAllowAnonymous to serve without authentication")
