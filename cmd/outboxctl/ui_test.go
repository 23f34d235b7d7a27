package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/outboxconfig"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startUI runs `outboxctl ui` on a free loopback port until the test ends
// and returns its base URL and its stderr.
func (w *world) startUI(vars map[string]string, args ...string) (string, *lockedBuffer) {
	w.t.Helper()
	ctx, cancel := context.WithCancel(w.ctx)
	var errb lockedBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, append([]string{"ui", "--addr", "127.0.0.1:0"}, args...), env{
			stdin: strings.NewReader(""), stdout: io.Discard, stderr: &errb,
			getenv: func(k string) string {
				if k == "DATABASE_URL" {
					return os.Getenv("DATABASE_URL")
				}
				return vars[k]
			},
			config:      func() (outboxconfig.Config, error) { return outboxconfig.Config{Table: w.table}, nil },
			inboxConfig: func() (outboxconfig.InboxConfig, error) { return outboxconfig.InboxConfig{}, nil },
		})
	}()
	w.t.Cleanup(func() {
		cancel()
		if code := <-done; code != exitOK {
			w.t.Errorf("outboxctl ui exited with %d: %s", code, errb.String())
		}
	})
	re := regexp.MustCompile(`on (http://127\.0\.0\.1:\d+/)`)
	var m []string
	testenv.Eventually(w.t, 20*time.Second, func() (bool, string) {
		m = re.FindStringSubmatch(errb.String())
		return m != nil, "outboxctl ui did not start: " + errb.String()
	})
	return m[1], &errb
}

func get(t *testing.T, url, token string) int {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func TestUIGeneratesAndPrintsAToken(t *testing.T) {
	w := newWorld(t)
	w.seed()
	url, errb := w.startUI(nil)
	m := regexp.MustCompile(`token \(printed once.*\): (\S+)`).FindStringSubmatch(errb.String())
	if m == nil {
		t.Fatalf("no token printed: %s", errb.String())
	}
	if code := get(t, url+"api/overview", ""); code != http.StatusUnauthorized {
		t.Fatalf("without the token: %d", code)
	}
	if code := get(t, url+"api/overview", m[1]); code != http.StatusOK {
		t.Fatalf("with the token: %d", code)
	}
	if !strings.Contains(errb.String(), "read only") {
		t.Fatalf("the start line does not say read only: %s", errb.String())
	}
	// Read only: an action with the session's CSRF token is refused.
	req, _ := http.NewRequest("GET", url+"api/session", nil)
	req.Header.Set("Authorization", "Bearer "+m[1])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	csrf := regexp.MustCompile(`"csrf_token": "([^"]+)"`).FindStringSubmatch(string(b))
	if csrf == nil {
		t.Fatalf("api/session: %s", b)
	}
	req, _ = http.NewRequest("POST", url+"api/actions", strings.NewReader(`{"action": "requeue", "matching": true}`))
	req.Header.Set("Authorization", "Bearer "+m[1])
	req.Header.Set("X-CSRF-Token", csrf[1])
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("a read-only action: %d", resp.StatusCode)
	}
	if n := w.count("parked_at IS NOT NULL"); n != 3000 {
		t.Fatalf("%d parked, want 3000", n)
	}
}

func TestUITokenFromEnvironment(t *testing.T) {
	w := newWorld(t)
	url, errb := w.startUI(map[string]string{"OUTBOX_UI_TOKEN": "env-token-0123456789abcdef"}, "--allow-write")
	if strings.Contains(errb.String(), "env-token") || !strings.Contains(errb.String(), "read and write") {
		t.Fatalf("start lines: %s", errb.String())
	}
	if code := get(t, url+"api/overview", "env-token-0123456789abcdef"); code != http.StatusOK {
		t.Fatalf("with OUTBOX_UI_TOKEN: %d", code)
	}
	if code := get(t, url, ""); code != http.StatusOK { // the login page, after the redirect
		t.Fatalf("the page without a token: %d", code)
	}
}

func TestUIRefusesAWeakToken(t *testing.T) {
	w := newWorld(t)
	var errb bytes.Buffer
	code := run(w.ctx, []string{"ui", "--addr", "127.0.0.1:0"}, env{stdout: io.Discard, stderr: &errb,
		getenv: func(k string) string {
			return map[string]string{"DATABASE_URL": os.Getenv("DATABASE_URL"), "OUTBOX_UI_TOKEN": "short"}[k]
		},
		config:      func() (outboxconfig.Config, error) { return outboxconfig.Config{Table: w.table}, nil },
		inboxConfig: func() (outboxconfig.InboxConfig, error) { return outboxconfig.InboxConfig{}, nil },
	})
	if code != exitUsage || !strings.Contains(errb.String(), "at least 16 bytes") {
		t.Fatalf("a short OUTBOX_UI_TOKEN: %d %s", code, errb.String())
	}
}
