package adminui_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fxoutbox/outbox/adminui"
)

func slogTo(w io.Writer) *slog.Logger { return slog.New(slog.NewTextHandler(w, nil)) }

func jsonNum(n int64) string { return strconv.FormatInt(n, 10) }

func between(s, from, to string) string {
	_, rest, ok := strings.Cut(s, from)
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(rest, to)
	return v
}

// act runs an action as alice and waits for it.
func (s *setup) act(t *testing.T, csrf string, a adminui.ActionRequest) adminui.Job {
	t.Helper()
	code, b, _ := s.do(t, "POST", "api/actions", operateToken, a, "X-CSRF-Token", csrf)
	if code != http.StatusAccepted {
		t.Fatalf("action %+v: %d %s", a, code, b)
	}
	var job adminui.Job
	if err := json.Unmarshal(b, &job); err != nil {
		t.Fatal(err)
	}
	job = s.wait(t, operateToken, job)
	if job.State != "done" {
		t.Fatalf("job %+v", job)
	}
	return job
}

// cookieClient is a browser-like client with a cookie jar.
type cookieClient struct {
	t   *testing.T
	s   *setup
	c   *http.Client
	jar http.CookieJar
}

func (c *cookieClient) client() *http.Client {
	if c.c == nil {
		c.jar, _ = cookiejar.New(nil)
		c.c = &http.Client{Jar: c.jar, Timeout: 30 * time.Second,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	return c.c
}

func (c *cookieClient) get(path string) string {
	c.t.Helper()
	resp, err := c.client().Get(c.s.url + path)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func (c *cookieClient) post(path string, form url.Values) (int, *http.Response) {
	c.t.Helper()
	resp, err := c.client().PostForm(c.s.url+path, form)
	if err != nil {
		c.t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp
}
