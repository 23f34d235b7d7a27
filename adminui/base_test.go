package adminui

import (
	"net/http/httptest"
	"testing"
)

func TestBase(t *testing.T) {
	for _, c := range []struct{ uri, rest, want string }{
		{"/admin/parked?topic=x", "parked", "/admin/"},
		{"/admin/", "", "/admin/"},
		{"/parked", "parked", "/"},
		{"/a/b/api/jobs/12", "api/jobs/12", "/a/b/"},
		{"//evil.example.com/parked", "parked", "/"},
		{"/other", "parked", "/"},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RequestURI = c.uri
		if got := base(r, c.rest); got != c.want {
			t.Errorf("base(%q, %q) = %q, want %q", c.uri, c.rest, got, c.want)
		}
	}
}
