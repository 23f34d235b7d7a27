// Package adminui is the admin web UI of fxoutbox: an http.Handler that an
// application mounts in its own mux, under any prefix, and that
// `outboxctl ui` serves on its own.
//
//	ui, err := adminui.NewHandler(adminui.Config{
//		DB:         pool,
//		Tables:     []outbox.Table{{Schema: "orders"}},
//		Authorizer: adminui.HeaderAuthorizer{OperateGroups: []string{"sre"}, ReadGroups: []string{"dev"}},
//	})
//	mux.Handle("/outbox/", http.StripPrefix("/outbox", ui))
//	defer ui.Close()
//
// Pages: the overview of each table (backlog, oldest unpublished age,
// published and parked per minute over the last hour, relays and the lanes
// they hold, the stream slot's lag, the inboxes' parked records), parked
// events grouped by topic and reason with filters (topic, type, key, event
// id, reason) and keyset pages, an event's detail in any state (pending,
// published, parked: payload, headers, attempts, last error, trace link),
// and an inbox's parked records. Each page has a JSON twin under api/ with
// the same parameters, which its script uses and scripts may use too.
//
// Actions, for RoleOperate only: requeue, delete and replay on one event, a
// selection, or everything that matches a filter, chosen on the server and
// not limited to the page shown. The page asks for confirmation with the
// count (POST api/count), starts a job (POST api/actions) that changes
// Config.ChunkSize rows per committed statement, and polls its progress
// (GET api/jobs/{id}). Each action writes one audit line through
// Config.Logger: who, what, the table, the filter and how many rows.
// Retrying an inbox record runs the application's handler, so here inbox
// records are only deleted (inbox.Consumer.Retry retries them).
//
// Security: NewHandler refuses a Config without an Authorizer, unless
// InsecureAllowAnonymous, which it logs as a warning. Roles are checked on
// the server for pages and API alike. Every request that is not GET or
// HEAD needs the page's CSRF token (X-CSRF-Token, bound to the session or
// bearer token; GET api/session gives it to scripts) and passes
// http.CrossOriginProtection (Sec-Fetch-Site, Origin). The
// Content-Security-Policy allows scripts and styles from the handler only,
// no inline script; every stored value (payload, key, headers, reasons) is
// written by html/template or by the script's textContent, never as
// markup. Every asset is embedded: nothing is fetched from a network.
//
// Database role: reading needs SELECT on the outbox table (and on the
// inbox's <name>_parked table), which the relay's role in
// migrations/roles.example.sql has; pg_locks, pg_stat_activity and
// pg_replication_slots are readable by every role (other roles' sessions
// show fully only to members of pg_read_all_stats). Acting needs what the
// relay's role has: UPDATE of published_at, parked_at and attempts
// (requeue, replay; replay also last_error) and DELETE of parked rows.
// docs/adminui.md has the details.
package adminui
