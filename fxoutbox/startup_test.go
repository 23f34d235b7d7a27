package fxoutbox_test

import (
	"encoding/json"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"

	"github.com/fxoutbox/outbox/fxoutbox"
	"github.com/fxoutbox/outbox/internal/testenv"
)

// startUpLine starts and stops the outbox with cfg and returns the
// attributes of its "outbox relay starting" line.
func startUpLine(t *testing.T, cfg fxoutbox.Config) map[string]any {
	t.Helper()
	l := &logs{}
	log := slog.New(slog.NewJSONHandler(l, nil))
	app := fxtest.New(t, fx.NopLogger, fx.Supply(testenv.Pool(t), log, cfg), fxoutbox.Module)
	app.RequireStart()
	app.RequireStop()
	for _, s := range strings.Split(l.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(s), &m) == nil && m["msg"] == "outbox relay starting" {
			return m
		}
	}
	t.Fatalf("no start-up line:\n%s", l.String())
	return nil
}

// The start-up line names the mode the relay runs in: a polling relay its
// interval and wake-ups; a streaming one its lag limits, slot and
// publication, and no poll interval or LISTEN it does not use.
func TestStartUpLineNamesTheMode(t *testing.T) {
	pool := testenv.Pool(t)
	brokers := testenv.Brokers(t)

	t.Run("poll", func(t *testing.T) {
		tbl := testenv.Table(t, pool)
		line := startUpLine(t, fxoutbox.Config{Table: tbl, Brokers: brokers, Writer: unitofwork.Config{Service: "svc"}, Relay: relay.Config{PollInterval: 250 * time.Millisecond}})
		if want := "poll 250ms, wake-ups in process and by LISTEN " + sqlname.Channel(tbl) + ", 1 worker(s), batch 50-500"; line["mode"] != want {
			t.Errorf("mode = %q, want %q", line["mode"], want)
		}
		if _, ok := line["slot"]; ok {
			t.Errorf("a polling relay's start-up line names a slot: %v", line)
		}
		line = startUpLine(t, fxoutbox.Config{Table: tbl, Brokers: brokers, DisableListen: true, Writer: unitofwork.Config{Service: "svc"}})
		if want := "poll 500ms, wake-ups in process, 1 worker(s), batch 50-500"; line["mode"] != want {
			t.Errorf("mode without LISTEN = %q, want %q", line["mode"], want)
		}
	})

	t.Run("stream", func(t *testing.T) {
		tbl := testenv.Table(t, pool)
		slot := testenv.Streaming(t, pool, tbl, false)
		t.Setenv("OUTBOX_SERVICE", "svc")
		t.Setenv("KAFKA_BROKERS", strings.Join(brokers, ","))
		t.Setenv("OUTBOX_SCHEMA", tbl.Schema)
		t.Setenv("OUTBOX_RELAY_MODE", "stream")
		t.Setenv("OUTBOX_STREAM_MAX_LAG", "10s")
		t.Setenv("OUTBOX_STREAM_MAX_LAG_BYTES", "536870912")
		cfg, err := fxoutbox.ConfigFromEnv()
		if err != nil {
			t.Fatal(err)
		}
		line := startUpLine(t, cfg)
		if want := "stream, lag limits 10s and 512 MiB, sweep 2s, 1 worker(s), batch 50-500"; line["mode"] != want {
			t.Errorf("mode = %q, want %q", line["mode"], want)
		}
		if line["slot"] != slot || line["publication"] != tbl.Publication() {
			t.Errorf("slot = %v, publication = %v; want %s, %s", line["slot"], line["publication"], slot, tbl.Publication())
		}
	})
}
