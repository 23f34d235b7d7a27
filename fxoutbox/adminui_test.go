package fxoutbox_test

import (
	"github.com/fxoutbox/outbox/relay"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.uber.org/fx"
	"go.uber.org/fx/fxevent"
	"go.uber.org/fx/fxtest"

	"github.com/fxoutbox/outbox/adminui"
	"github.com/fxoutbox/outbox/fxoutbox"
	"github.com/fxoutbox/outbox/internal/testenv"
)

func TestAdminUIModule(t *testing.T) {
	pool := testenv.Pool(t)
	table := testenv.Table(t, pool)
	auth, err := adminui.NewTokenAuthorizer(adminui.Token{Secret: "fx-token-0123456789abcdef", Role: adminui.RoleRead})
	if err != nil {
		t.Fatal(err)
	}
	var ui *adminui.Handler
	app := fxtest.New(t,
		fx.WithLogger(func() fxevent.Logger { return fxevent.NopLogger }),
		fx.Supply(pool, fxoutbox.Config{Table: table, Relay: relay.Config{Lanes: 16}}, adminui.Config{Authorizer: auth}),
		fxoutbox.AdminUIModule,
		fx.Populate(&ui),
	)
	app.RequireStart()
	defer app.RequireStop()
	mux := http.NewServeMux()
	mux.Handle("/outbox/", http.StripPrefix("/outbox", ui))
	req := httptest.NewRequest("GET", "/outbox/api/overview", nil)
	req.Header.Set("Authorization", "Bearer fx-token-0123456789abcdef")
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, req)
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), table.String()) || !strings.Contains(rec.Body.String(), `"lanes": 16`) {
		t.Fatalf("api/overview: %d %s", rec.Code, rec.Body.String())
	}
}

func TestAdminUIModuleNeedsAnAuthorizer(t *testing.T) {
	pool := testenv.Pool(t)
	app := fx.New(
		fx.WithLogger(func() fxevent.Logger { return fxevent.NopLogger }),
		fx.Supply(pool, adminui.Config{}),
		fxoutbox.AdminUIModule,
		fx.Invoke(func(*adminui.Handler) {}),
	)
	if err := app.Err(); err == nil || !strings.Contains(err.Error(), "Authorizer is nil") {
		t.Fatalf("a Config without an Authorizer: %v", err)
	}
}
