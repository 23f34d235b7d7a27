package fxoutbox

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/fx"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/adminui"
)

// AdminUIModule provides the admin web UI, an *adminui.Handler, from an
// adminui.Config the application supplies (its Authorizer is required: the
// UI is deny-by-default). The application mounts it in its own mux:
//
//	fx.Supply(adminui.Config{Authorizer: adminui.HeaderAuthorizer{OperateGroups: []string{"sre"}}}),
//	fxoutbox.AdminUIModule,
//	fx.Invoke(func(mux *http.ServeMux, ui *adminui.Handler) {
//		mux.Handle("/outbox/", http.StripPrefix("/outbox", ui))
//	}),
//
// Empty fields of the adminui.Config are filled from the application: DB
// from the *pgxpool.Pool, Tables from Config.Table, Lanes from Config.Relay.Lanes,
// Logger from the *slog.Logger. OnStop ends the bulk actions still running.
var AdminUIModule = fx.Module("fxoutbox.adminui",
	fx.Provide(newAdminUI),
)

// adminUIParams are newAdminUI's dependencies.
type adminUIParams struct {
	fx.In

	Lifecycle fx.Lifecycle
	Pool      *pgxpool.Pool
	UI        adminui.Config
	// Config, when the application has one, names the table and its lanes.
	Config Config       `optional:"true"`
	Logger *slog.Logger `optional:"true"`
}

// newAdminUI builds the admin UI's handler and closes it on stop.
func newAdminUI(p adminUIParams) (*adminui.Handler, error) {
	c := p.UI
	if c.DB == nil {
		c.DB = p.Pool
	}
	if len(c.Tables) == 0 {
		c.Tables = []outbox.Table{p.Config.Table}
	}
	if c.Lanes == 0 {
		c.Lanes = p.Config.Relay.Lanes
	}
	if c.Logger == nil {
		c.Logger = p.Logger
	}
	h, err := adminui.NewHandler(c)
	if err != nil {
		return nil, err
	}
	p.Lifecycle.Append(fx.StopHook(func(context.Context) { h.Close() }))
	return h, nil
}
