package migrations

import (
	"testing"

	"github.com/fxoutbox/outbox"
)

func TestRender(t *testing.T) {
	got := Outbox.render("CREATE INDEX outbox_event_unpublished_idx ON outbox_event (id); -- outbox_events stays", outbox.Table{Schema: "app", Name: "ev"})
	want := `CREATE INDEX "ev_unpublished_idx" ON "app"."ev" (id); -- outbox_events stays`
	if got != want {
		t.Errorf("render = %s\nwant     %s", got, want)
	}
}

func TestRenderStream(t *testing.T) {
	tbl := outbox.Table{Schema: "app", Name: "Ev"}
	got := Stream.render("CREATE PUBLICATION outbox_event_fxoutbox FOR TABLE outbox_event;", tbl)
	want := `CREATE PUBLICATION "` + tbl.Publication() + `" FOR TABLE "app"."Ev";`
	if got != want {
		t.Errorf("render = %s\nwant     %s", got, want)
	}
}
