package adminui_test

import (
	"crypto/x509"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/adminui"
	"github.com/fxoutbox/outbox/internal/testenv"
)

// The UI with bearer tokens and a login page, mounted under /outbox/ in the
// application's own mux: an operator token and a read-only one.
func ExampleNewHandler() {
	pool, table, cleanup := testenv.ExampleDB()
	defer cleanup()

	auth, err := adminui.NewTokenAuthorizer(
		adminui.Token{Secret: "an-operator-token-0123456789", Name: "oncall", Role: adminui.RoleOperate},
		adminui.Token{Secret: "a-read-only-token-0123456789", Name: "dashboards", Role: adminui.RoleRead},
	)
	if err != nil {
		panic(err)
	}
	ui, err := adminui.NewHandler(adminui.Config{DB: pool, Tables: []outbox.Table{table}, Authorizer: auth})
	if err != nil {
		panic(err)
	}
	defer ui.Close()
	mux := http.NewServeMux()
	mux.Handle("/outbox/", http.StripPrefix("/outbox", ui))

	for _, token := range []string{"", "a-read-only-token-0123456789"} {
		req := httptest.NewRequest("GET", "/outbox/api/overview", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		fmt.Println(rec.Code)
	}
	// Output:
	// 401
	// 200
}

// Behind an authenticating proxy (oauth2-proxy, an OIDC-aware ingress) that
// sets X-Forwarded-User and X-Forwarded-Groups and strips them from clients'
// requests: members of sre may operate, of dev read.
func ExampleHeaderAuthorizer() {
	pool, table, cleanup := testenv.ExampleDB()
	defer cleanup()

	ui, err := adminui.NewHandler(adminui.Config{DB: pool, Tables: []outbox.Table{table},
		Authorizer: adminui.HeaderAuthorizer{OperateGroups: []string{"sre"}, ReadGroups: []string{"dev"}}})
	if err != nil {
		panic(err)
	}
	defer ui.Close()
	req := httptest.NewRequest("GET", "/api/session", nil)
	req.Header.Set("X-Forwarded-User", "jane@example.com")
	req.Header.Set("X-Forwarded-Groups", "dev,payments")
	rec := httptest.NewRecorder()
	ui.ServeHTTP(rec, req)
	fmt.Println(rec.Code)
	// Output:
	// 200
}

// mTLS: the server verifies client certificates (tls.Config.ClientAuth =
// RequireAndVerifyClientCert); the authorizer maps the certificate's
// subject to a role.
func ExampleAuthorizerFunc() {
	pool, table, cleanup := testenv.ExampleDB()
	defer cleanup()

	operators := []string{"oncall.ops.example.com"}
	auth := adminui.AuthorizerFunc(func(r *http.Request) adminui.Principal {
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 {
			return adminui.Principal{}
		}
		var cert *x509.Certificate = r.TLS.VerifiedChains[0][0]
		p := adminui.Principal{Name: cert.Subject.CommonName, Role: adminui.RoleRead}
		if slices.Contains(operators, cert.Subject.CommonName) {
			p.Role = adminui.RoleOperate
		}
		return p
	})
	ui, err := adminui.NewHandler(adminui.Config{DB: pool, Tables: []outbox.Table{table}, Authorizer: auth})
	if err != nil {
		panic(err)
	}
	defer ui.Close()
	rec := httptest.NewRecorder()
	ui.ServeHTTP(rec, httptest.NewRequest("GET", "/api/overview", nil)) // no client certificate
	fmt.Println(rec.Code)
	// Output:
	// 401
}
