package adminui_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/fxoutbox/outbox/internal/testenv"
)

// chromePath finds a headless Chromium: OUTBOX_CHROME, Debian's
// chromium-headless-shell or chromium, or one on the PATH.
func chromePath() string {
	if p := os.Getenv("OUTBOX_CHROME"); p != "" {
		return p
	}
	for _, p := range []string{"/usr/lib/chromium/chromium-headless-shell", "/usr/lib/chromium/chrome-headless-shell", "/usr/lib/chromium/chromium"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	for _, name := range []string{"chromium-headless-shell", "chrome-headless-shell", "headless_shell", "chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// browser starts a headless Chromium for the test and returns a tab's
// context, and a counter of the JavaScript dialogs any page opened (each is
// dismissed). The browser stops when the test ends.
func browser(t *testing.T) (context.Context, *atomic.Int32) {
	t.Helper()
	path := chromePath()
	if path == "" {
		msg := "no headless Chromium: install Debian's chromium-headless-shell (apt-get install chromium-headless-shell, as .ci/run does) or set OUTBOX_CHROME"
		if os.Getenv("OUTBOX_TEST_REQUIRE") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	dir := t.TempDir()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.UserDataDir(dir),
		chromedp.DisableGPU, chromedp.NoSandbox, chromedp.WindowSize(1280, 900))
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(allocCtx)
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		cancel()
		cancelAlloc()
		t.Fatalf("start %s: %v", path, err)
	}
	var dialogs atomic.Int32
	var wg sync.WaitGroup
	events := chromedp.Events(ctx, page.JavascriptDialogOpening)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ev, err := range events {
			if err != nil {
				return
			}
			dialogs.Add(1)
			t.Errorf("a page opened a JavaScript dialog: %q", ev.Message)
			_, _ = chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: false})
		}
	}()
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
		wg.Wait()
	})
	return ctx, &dialogs
}

// step runs actions with a timeout, failing the test on error.
func step(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := chromedp.Do(c, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func eval[T any](t *testing.T, ctx context.Context, js string) T {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	v, err := chromedp.Run(c, chromedp.Evaluate[T](js, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatalf("evaluate %s: %v", js, err)
	}
	return v
}

// waitJS waits until the expression is true.
func waitJS(t *testing.T, ctx context.Context, cond string) {
	t.Helper()
	testenv.EventuallyCtx(ctx, t, 20*time.Second, func() (bool, string) {
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		ok, err := chromedp.Run(c, chromedp.Evaluate[bool](cond))
		cancel()
		return err == nil && ok, fmt.Sprintf("still not %s (%v)", cond, err)
	})
}

// screenshot writes docs/images/adminui-<name>.png when UPDATE_SCREENSHOTS=1.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	if os.Getenv("UPDATE_SCREENSHOTS") != "1" {
		return
	}
	c, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	png, err := chromedp.Run(c, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	path := filepath.Join("..", "docs", "images", "adminui-"+name+".png")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s", path)
}

// TestBrowser clicks through the UI in headless Chromium as an operator
// would: log in, filter, open an event, requeue a group and see it leave
// the list; stored XSS payloads open no dialog; requests without a session
// or CSRF token, and a read-only session's, change nothing.
func TestBrowser(t *testing.T) {
	s := newSetup(t)
	ctx, dialogs := browser(t)

	// Not logged in: the page sends to the login page.
	step(t, ctx, "open the parked page", chromedp.Navigate(s.url+"parked"), chromedp.WaitVisible(chromedp.ID("token")))
	if loc := eval[string](t, ctx, "location.pathname + location.search"); loc != "/admin/login?next=parked" {
		t.Fatalf("not sent to the login page: %s", loc)
	}
	step(t, ctx, "log in", chromedp.SendKeys(chromedp.ID("token"), operateToken), chromedp.Click(chromedp.ID("login")),
		chromedp.WaitVisible(chromedp.ID("table-name")))
	if who := eval[string](t, ctx, `document.getElementById("who").textContent + "/" + document.getElementById("role").textContent`); who != "alice/operate" {
		t.Fatalf("logged in as %s", who)
	}
	// A fetch with the session but without the CSRF token is refused.
	code := eval[int](t, ctx, `fetch("api/actions", {method: "POST", headers: {"Content-Type": "application/json"},
		body: JSON.stringify({action: "delete", matching: true})}).then(r => r.status)`)
	if code != 403 {
		t.Fatalf("an action without the CSRF token: %d, want 403", code)
	}

	// The overview.
	step(t, ctx, "open the overview", chromedp.Navigate(s.url), chromedp.WaitVisible(chromedp.CSS("section[data-table] svg")))
	if parked := eval[string](t, ctx, `document.querySelector('[data-field="parked"]').textContent`); parked != "68" {
		t.Fatalf("overview shows %s parked, want 68", parked)
	}
	screenshot(t, ctx, "overview")

	// Parked: grouped by cause; filter by topic.
	step(t, ctx, "open the parked page", chromedp.Navigate(s.url+"parked"), chromedp.WaitVisible(chromedp.ID("groups")))
	screenshot(t, ctx, "parked")
	step(t, ctx, "filter by topic", chromedp.SendKeys(chromedp.ID("f-topic"), "payments"), chromedp.Click(chromedp.ID("apply")))
	waitJS(t, ctx, `location.search.includes("topic=payments") && document.readyState === "complete"`)
	if m := eval[string](t, ctx, `document.getElementById("matching").textContent`); m != "25" {
		t.Fatalf("filtered by topic: %s matching, want 25", m)
	}
	if n := eval[int](t, ctx, `document.querySelectorAll("#events tr.event").length`); n != 20 {
		t.Fatalf("the first page shows %d events, want 20", n)
	}
	// The next keyset page is appended from api/parked.
	step(t, ctx, "next page", chromedp.Click(chromedp.ID("next")))
	waitJS(t, ctx, `document.querySelectorAll("#events tr.event").length === 25 && !document.getElementById("next")`)
	if ok := eval[bool](t, ctx, `location.search.includes("topic=payments") && !location.search.includes("after")`); !ok {
		t.Fatalf("the next page navigated away")
	}

	// An event's detail.
	step(t, ctx, "open an event", chromedp.Click(chromedp.CSS("a.event-link")), chromedp.WaitVisible(chromedp.ID("payload")))
	if st := eval[string](t, ctx, `document.getElementById("state").textContent`); st != "parked" {
		t.Fatalf("event state %q", st)
	}
	screenshot(t, ctx, "event")

	// Requeue the orders group from the parked page, confirm, and see it
	// leave the list.
	step(t, ctx, "open the parked page", chromedp.Navigate(s.url+"parked"), chromedp.WaitVisible(chromedp.ID("groups")))
	step(t, ctx, "requeue the orders group", chromedp.Click(chromedp.CSS(`button.act[data-action="requeue"][data-topic="orders"]`)),
		chromedp.WaitVisible(chromedp.ID("confirm-yes")))
	if txt := eval[string](t, ctx, `document.getElementById("confirm-text").textContent`); !strings.Contains(txt, "Requeue 40 parked events") {
		t.Fatalf("confirmation: %q", txt)
	}
	step(t, ctx, "confirm", chromedp.Click(chromedp.ID("confirm-yes")))
	waitJS(t, ctx, `!document.querySelector('button.act[data-topic="orders"]') && document.getElementById("confirm").hidden && document.readyState === "complete"`)
	if n := s.count(t, "topic = 'orders' AND parked_at IS NOT NULL"); n != 0 {
		t.Fatalf("%d orders events still parked", n)
	}
	if m := eval[string](t, ctx, `document.getElementById("matching").textContent`); m != "28" {
		t.Fatalf("after the requeue %s matching, want 28", m)
	}

	// Stored XSS payloads render as text and open no dialog.
	step(t, ctx, "open the xss events", chromedp.Navigate(s.url+"parked?topic=xss"), chromedp.WaitVisible(chromedp.ID("events")))
	step(t, ctx, "open an xss event", chromedp.Click(chromedp.CSS("a.event-link")), chromedp.WaitVisible(chromedp.ID("payload")))
	if p := eval[string](t, ctx, `document.getElementById("payload").textContent`); !strings.Contains(p, "<script>alert(1)</script>") {
		t.Fatalf("the payload does not show as text: %q", p)
	}
	if n := eval[int](t, ctx, `document.querySelectorAll("main img, main script").length`); n != 0 {
		t.Fatalf("a stored value became %d elements", n)
	}
	step(t, ctx, "open the inbox", chromedp.Navigate(s.url+"inbox"), chromedp.WaitVisible(chromedp.ID("records")))
	step(t, ctx, "open an inbox record", chromedp.Click(chromedp.CSS("#records a")), chromedp.WaitVisible(chromedp.CSS("pre")))
	time.Sleep(300 * time.Millisecond) // a dialog would open by now
	if dialogs.Load() != 0 {
		t.Fatalf("%d dialogs", dialogs.Load())
	}

	// A read-only session sees no action and is refused one.
	step(t, ctx, "log out", chromedp.Navigate(s.url), chromedp.Click(chromedp.CSS("button.link")), chromedp.WaitVisible(chromedp.ID("token")))
	if code := eval[int](t, ctx, `fetch("api/overview").then(r => r.status)`); code != 401 {
		t.Fatalf("after logout api/overview: %d", code)
	}
	step(t, ctx, "log in read-only", chromedp.SendKeys(chromedp.ID("token"), readToken), chromedp.Click(chromedp.ID("login")),
		chromedp.WaitVisible(chromedp.CSS("section[data-table]")))
	step(t, ctx, "open the parked page", chromedp.Navigate(s.url+"parked"), chromedp.WaitVisible(chromedp.ID("groups")))
	if n := eval[int](t, ctx, `document.querySelectorAll("button.act").length`); n != 0 {
		t.Fatalf("a read-only page shows %d action buttons", n)
	}
	code = eval[int](t, ctx, `fetch("api/actions", {method: "POST", headers: {"Content-Type": "application/json",
		"X-CSRF-Token": document.querySelector('meta[name="csrf-token"]').content},
		body: JSON.stringify({action: "delete", matching: true})}).then(r => r.status)`)
	if code != 403 {
		t.Fatalf("a read-only action: %d, want 403", code)
	}
	if n := s.count(t, "parked_at IS NOT NULL"); n != 28 {
		t.Fatalf("%d parked, want 28: a refused request changed rows", n)
	}
}
