package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/adminui"
	"github.com/fxoutbox/outbox/internal/sqlname"
)

const uiAbout = `Serves the admin web UI (package adminui) on --addr, loopback by default:
the overview, parked events grouped by cause, an event's detail, the inbox's
parked records. Requests authenticate with "Authorization: Bearer <token>" or
through the login page (an HttpOnly, SameSite=Strict session cookie). The
token is OUTBOX_UI_TOKEN; when it is unset, a random one is printed once at
start. The UI only reads unless --allow-write lets the token requeue, delete
and replay. It reads the same variables as the other commands; the inbox's
parked records are shown when the inbox table (OUTBOX_INBOX_SCHEMA,
OUTBOX_INBOX_TABLE) exists. Ctrl-C stops it.`

func cmdUI(ctx context.Context, args []string, e env) int {
	c := newCommand("ui", e, "[--addr 127.0.0.1:8089] [--allow-write] [--trace-url URL]")
	c.about = uiAbout
	addr := c.fs.String("addr", "127.0.0.1:8089", "address to listen on; a host other than loopback serves the network (put TLS in front)")
	allowWrite := c.fs.Bool("allow-write", false, "let the token requeue, delete and replay (default: read only)")
	traceURL := c.fs.String("trace-url", "", "link trace ids to this URL, {trace_id} replaced, e.g. https://jaeger.example.com/trace/{trace_id}")
	if ok, code := c.parseNone(args); !ok {
		return code
	}
	cfg, err := c.e.config()
	if err != nil {
		fmt.Fprintf(c.e.stderr, "outboxctl: configuration: %v\n", err)
		return exitUsage
	}
	table := cfg.Table.WithDefaults()
	url := c.e.getenv("DATABASE_URL")
	if strings.TrimSpace(url) == "" {
		fmt.Fprintln(c.e.stderr, "outboxctl: DATABASE_URL is not set: set it to the database of the outbox table, e.g. postgres://user:password@host:5432/db")
		return exitUsage
	}
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		fmt.Fprintf(c.e.stderr, "outboxctl: DATABASE_URL is not a valid connection string: %v\n", cutErr(err))
		return exitUsage
	}
	if _, ok := pc.ConnConfig.RuntimeParams["application_name"]; !ok {
		pc.ConnConfig.RuntimeParams["application_name"] = "outboxctl ui"
	}
	pc.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		fmt.Fprintf(c.e.stderr, "outboxctl: %s\n", explain(err, table, ""))
		return exitError
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		fmt.Fprintf(c.e.stderr, "outboxctl: %s\n", explain(err, table, ""))
		return exitError
	}
	inboxes := c.uiInboxes(ctx, pool)

	role, mode := adminui.RoleRead, "read only (--allow-write to requeue, delete and replay)"
	if *allowWrite {
		role, mode = adminui.RoleOperate, "read and write"
	}
	token, generated := c.e.getenv("OUTBOX_UI_TOKEN"), false
	if token == "" {
		token, generated = adminui.NewToken(), true
	}
	auth, err := adminui.NewTokenAuthorizer(adminui.Token{Secret: token, Name: "outboxctl-ui-token", Role: role})
	if err != nil {
		fmt.Fprintf(c.e.stderr, "outboxctl ui: OUTBOX_UI_TOKEN: %v\n", err)
		return exitUsage
	}
	log := slog.New(slog.NewTextHandler(c.e.stderr, nil))
	h, err := adminui.NewHandler(adminui.Config{DB: pool, Tables: []outbox.Table{table}, Inboxes: inboxes, Authorizer: auth,
		Logger: log, Lanes: cfg.Relay.Lanes, TraceURL: *traceURL})
	if err != nil {
		fmt.Fprintf(c.e.stderr, "outboxctl ui: %v\n", err)
		return exitUsage
	}
	defer h.Close()

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintf(c.e.stderr, "outboxctl ui: %v\n", err)
		return exitError
	}
	host, _, _ := net.SplitHostPort(ln.Addr().String())
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		fmt.Fprintf(c.e.stderr, "outboxctl ui: WARNING: listening on %s, not loopback: anyone who can reach it and has the token may use the UI; the token travels in clear without TLS in front\n", ln.Addr())
	}
	fmt.Fprintf(c.e.stderr, "outboxctl ui: serving %s, %s, on http://%s/\n", table, mode, ln.Addr())
	if generated {
		fmt.Fprintf(c.e.stderr, "outboxctl ui: token (printed once; set OUTBOX_UI_TOKEN to choose one): %s\n", token)
	} else {
		fmt.Fprintln(c.e.stderr, "outboxctl ui: token: the value of OUTBOX_UI_TOKEN")
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		fmt.Fprintf(c.e.stderr, "outboxctl ui: %v\n", err)
		return exitError
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
	}
	if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintf(c.e.stderr, "outboxctl ui: %v\n", err)
	}
	return exitOK
}

// uiInboxes returns the inbox table when its parked table exists.
func (c *command) uiInboxes(ctx context.Context, pool *pgxpool.Pool) []outbox.Table {
	read := c.e.inboxConfig
	if read == nil {
		read = readInboxConfig
	}
	ic, err := read()
	if err != nil {
		fmt.Fprintf(c.e.stderr, "outboxctl ui: not showing the inbox: configuration: %v\n", err)
		return nil
	}
	in := sqlname.Inbox(ic.Consumer.Table)
	var exists bool
	if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", sqlname.Ident(parkedOf(in))).Scan(&exists); err != nil || !exists {
		return nil
	}
	return []outbox.Table{in}
}
