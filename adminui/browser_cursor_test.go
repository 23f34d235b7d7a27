package adminui_test

import (
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/migrations"
)

// The admin UI on a table in cursor mode: its parked events are in the
// parked table (here moved there by the cursor migration, as the table's
// lanes have positions), and the overview, the parked page, an event's page
// and a requeue from the parked page work on them as on a marked table's.
func TestBrowserCursor(t *testing.T) {
	s := newSetup(t)
	if err := migrations.Cursor.Up(s.ctx, s.pool, s.table); err != nil {
		t.Fatal(err)
	}
	s.exec(t, "INSERT INTO "+sqlname.Ident(sqlname.Cursor(s.table))+" (lane, lanes, done, base) SELECT g, 4, pg_current_snapshot(), 0 FROM generate_series(0, 3) g")
	if err := migrations.Cursor.Up(s.ctx, s.pool, s.table); err != nil { // moves the rows parked in place
		t.Fatal(err)
	}
	parked := sqlname.Ident(sqlname.Parked(s.table))
	countParked := func(where string) int {
		t.Helper()
		var n int
		if err := s.pool.QueryRow(s.ctx, "SELECT count(*) FROM "+parked+" WHERE "+where).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := countParked("true"); n != 68 || s.count(t, "parked_at IS NOT NULL") != 0 {
		t.Fatalf("%d events in the parked table, %d parked in place; want 68 and 0", n, s.count(t, "parked_at IS NOT NULL"))
	}
	ctx, dialogs := browser(t)
	step(t, ctx, "open the login page", chromedp.Navigate(s.url+"parked"), chromedp.WaitVisible(chromedp.ID("token")))
	step(t, ctx, "log in", chromedp.SendKeys(chromedp.ID("token"), operateToken), chromedp.Click(chromedp.ID("login")),
		chromedp.WaitVisible(chromedp.ID("table-name")))

	step(t, ctx, "open the overview", chromedp.Navigate(s.url), chromedp.WaitVisible(chromedp.CSS("section[data-table] svg")))
	if n := eval[string](t, ctx, `document.querySelector('[data-field="parked"]').textContent`); n != "68" {
		t.Fatalf("overview shows %s parked, want 68", n)
	}

	step(t, ctx, "open the parked page", chromedp.Navigate(s.url+"parked"), chromedp.WaitVisible(chromedp.ID("groups")))
	step(t, ctx, "filter by topic", chromedp.SendKeys(chromedp.ID("f-topic"), "payments"), chromedp.Click(chromedp.ID("apply")))
	waitJS(t, ctx, `location.search.includes("topic=payments") && document.readyState === "complete"`)
	if m := eval[string](t, ctx, `document.getElementById("matching").textContent`); m != "25" {
		t.Fatalf("filtered by topic: %s matching, want 25", m)
	}
	step(t, ctx, "open an event", chromedp.Click(chromedp.CSS("a.event-link")), chromedp.WaitVisible(chromedp.ID("payload")))
	if st := eval[string](t, ctx, `document.getElementById("state").textContent`); st != "parked" {
		t.Fatalf("event state %q, want parked", st)
	}

	const back = "topic = 'orders' AND parked_at IS NULL AND published_at IS NULL AND attempts = 0"
	before := s.count(t, back)
	step(t, ctx, "open the parked page", chromedp.Navigate(s.url+"parked"), chromedp.WaitVisible(chromedp.ID("groups")))
	step(t, ctx, "requeue the orders group", chromedp.Click(chromedp.CSS(`button.act[data-action="requeue"][data-topic="orders"]`)),
		chromedp.WaitVisible(chromedp.ID("confirm-yes")))
	if txt := eval[string](t, ctx, `document.getElementById("confirm-text").textContent`); !strings.Contains(txt, "Requeue 40 parked events") {
		t.Fatalf("confirmation: %q", txt)
	}
	step(t, ctx, "confirm", chromedp.Click(chromedp.ID("confirm-yes")))
	waitJS(t, ctx, `!document.querySelector('button.act[data-topic="orders"]') && document.getElementById("confirm").hidden && document.readyState === "complete"`)
	if n := countParked("topic = 'orders'"); n != 0 {
		t.Fatalf("%d orders events still in the parked table", n)
	}
	// Back in the table, waiting, with new ids (and the requeue's txid).
	if n := s.count(t, back) - before; n != 40 {
		t.Fatalf("%d orders events back in the table, want 40", n)
	}
	if m := eval[string](t, ctx, `document.getElementById("matching").textContent`); m != "28" {
		t.Fatalf("after the requeue %s matching, want 28", m)
	}
	if dialogs.Load() != 0 {
		t.Fatalf("%d dialogs", dialogs.Load())
	}
}
