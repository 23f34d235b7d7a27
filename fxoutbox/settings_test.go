package fxoutbox

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/inbox"
	"github.com/fxoutbox/outbox/outboxconfig"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// TestEverySettingReachable walks relay.Config, unitofwork.Config and
// inbox.Config by reflection: each field must be a setting (reachable from
// fxoutbox's Config or InboxConfig, where they are nested, with a variable
// the loader reads: its env tag, or that of the shared setting Config sets
// it from) or be listed as code-only (loggers, providers, functions, a
// *sarama.Config). A field added to an engine's Config without an env tag
// or a place in the code-only list fails here; with the tag it needs
// nothing else.
func TestEverySettingReachable(t *testing.T) {
	read := map[string]bool{}
	record := func(k string) (string, bool) { read[k] = true; return "", false }
	if _, err := configFrom(record); err != nil {
		t.Fatal(err)
	}
	if _, err := inboxConfigFrom(record); err != nil {
		t.Fatal(err)
	}
	vars := map[string][]string{} // "Config.Relay.BatchSize" -> its variables
	for _, v := range outboxconfig.Variables() {
		if !read[v.Name] {
			t.Errorf("%s.%s: the environment loader does not read %s", v.Config, v.Field, v.Name)
		}
		for path := v.Config + "." + v.Field; path != v.Config; path = path[:strings.LastIndexByte(path, '.')] {
			vars[path] = append(vars[path], v.Name)
		}
	}
	// The engines' fields Config sets from one shared setting.
	shared := map[string]string{
		"Config.Relay.Table": "Config.Table", "Config.Writer.Table": "Config.Table",
		"Config.Relay.MaxMessageBytes": "Config.Writer.Limits.MaxRecordBytes", "Config.Relay.Listen": "Config.DisableListen",
	}
	for _, engine := range []struct {
		name     string
		typ      reflect.Type
		path     string // where Config or InboxConfig nests it
		codeOnly []string
	}{
		{"relay.Config", reflect.TypeFor[relay.Config](), "Config.Relay", []string{"Logger", "TracerProvider", "MeterProvider", "Propagator"}},
		{"unitofwork.Config", reflect.TypeFor[unitofwork.Config](), "Config.Writer", []string{"Propagator", "OnCommit", "Logger", "TxOptions"}},
		{"inbox.Config", reflect.TypeFor[inbox.Config](), "InboxConfig.Consumer", []string{"Sarama", "Routes", "Logger", "TracerProvider", "MeterProvider", "Propagator"}},
	} {
		if ft, ok := fieldType(reflect.TypeFor[Config](), reflect.TypeFor[InboxConfig](), engine.path); !ok || ft != engine.typ {
			t.Fatalf("%s is not a %s", engine.path, engine.name)
		}
		for _, f := range reflect.VisibleFields(engine.typ) {
			path := engine.path + "." + f.Name
			code := slices.Contains(engine.codeOnly, f.Name)
			_, tagged := f.Tag.Lookup("env")
			from := shared[path]
			switch {
			case code && (tagged || from != ""):
				t.Errorf("%s.%s is both a setting and code-only", engine.name, f.Name)
			case code:
			case tagged && from != "":
				t.Errorf("%s.%s has an env tag but Config sets it from %s", engine.name, f.Name, from)
			case from != "":
				if len(vars[from]) == 0 {
					t.Errorf("%s.%s: its setting %s has no variable", engine.name, f.Name, from)
				}
			case !tagged:
				t.Errorf("%s.%s has no environment variable: give it an env tag (e.g. `env:\"OUTBOX_...\"`), or list it as code-only", engine.name, f.Name)
			case len(vars[path]) == 0:
				t.Errorf("%s.%s: its env tag names no variable the loader reads", engine.name, f.Name)
			}
		}
	}
}

// fieldType follows a dotted path of fields from Config or InboxConfig.
func fieldType(cfg, inboxCfg reflect.Type, path string) (reflect.Type, bool) {
	head, rest, _ := strings.Cut(path, ".")
	t := map[string]reflect.Type{"Config": cfg, "InboxConfig": inboxCfg}[head]
	for _, name := range strings.Split(rest, ".") {
		f, ok := t.FieldByName(name)
		if !ok {
			return nil, false
		}
		t = f.Type
	}
	return t, true
}

// The relay settings reach the relay from the environment, the shared ones
// (the table, the largest record, LISTEN) from where Config sets them.
func TestRelayConfigFromSettings(t *testing.T) {
	env := map[string]string{
		"OUTBOX_CLEANUP_INTERVAL": "2m", "OUTBOX_CLEANUP_BATCH": "10", "OUTBOX_STATS_INTERVAL": "3s", "OUTBOX_TABLE": "orders_outbox",
		"OUTBOX_BATCH_SIZE": "7", "OUTBOX_LISTEN": "off", "OUTBOX_MAX_RECORD_BYTES": "5000",
	}
	c, err := configFrom(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatal(err)
	}
	rc, err := c.RelayConfig()
	if err != nil || rc.CleanupInterval != 2*time.Minute || rc.CleanupBatch != 10 || rc.StatsInterval != 3*time.Second ||
		rc.BatchSize != 7 || rc.Listen || rc.MaxMessageBytes != 5000 || rc.Table.Name != "orders_outbox" {
		t.Errorf("relay config = %+v, %v", rc, err)
	}
	if rc, err := (Config{}).RelayConfig(); err != nil || !rc.Listen || rc.MaxMessageBytes != outbox.DefaultMaxRecordBytes || rc.Table != (outbox.Table{}).WithDefaults() {
		t.Errorf("default relay config: listen %t, max message bytes %d, table %v, %v", rc.Listen, rc.MaxMessageBytes, rc.Table, err)
	}
	for k, v := range map[string]string{"OUTBOX_CLEANUP_INTERVAL": "-1m", "OUTBOX_CLEANUP_BATCH": "0", "OUTBOX_STATS_INTERVAL": "often"} {
		if _, err := configFrom(func(name string) (string, bool) { return v, name == k }); err == nil || !strings.Contains(err.Error(), k) {
			t.Errorf("%s=%s: err = %v, want an error naming it", k, v, err)
		}
	}
}

// A shared setting is set once: a nested copy with another value is an
// error naming the field to set instead.
func TestSharedSettingsSetOnce(t *testing.T) {
	tbl := outbox.Table{Name: "orders_outbox"}
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Table: tbl, Relay: relay.Config{Table: outbox.Table{Name: "other"}}}, "Relay.Table"},
		{Config{Table: tbl, Writer: unitofwork.Config{Table: outbox.Table{Name: "other"}}}, "Writer.Table"},
		{Config{Relay: relay.Config{MaxMessageBytes: 5000}}, "Relay.MaxMessageBytes"},
		{Config{Relay: relay.Config{Listen: true}, DisableListen: true}, "Relay.Listen"},
	} {
		var ce *outbox.ConfigError
		if _, err := tc.cfg.WithDefaults(); !errors.As(err, &ce) || !strings.HasPrefix(ce.Field, tc.want) {
			t.Errorf("%s set twice: %v, want a ConfigError on %s", tc.want, err, tc.want)
		}
	}
	same := Config{Table: tbl, Relay: relay.Config{Table: tbl, MaxMessageBytes: outbox.DefaultMaxRecordBytes, Listen: true}, Writer: unitofwork.Config{Table: tbl}}
	if _, err := same.WithDefaults(); err != nil {
		t.Errorf("nested copies equal to the shared settings: %v", err)
	}
}

// The relay's config errors reach the user naming the fxoutbox field and
// its variable.
func TestRelayErrorNamesVariable(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Relay: relay.Config{BatchSize: -1}}, "Relay.BatchSize [OUTBOX_BATCH_SIZE]"},
		{Config{Relay: relay.Config{CleanupBatch: -1}}, "Relay.CleanupBatch [OUTBOX_CLEANUP_BATCH]"},
		{Config{Writer: unitofwork.Config{Limits: outbox.Limits{MaxPayloadBytes: 2 << 20}}}, "Writer.Limits.MaxPayloadBytes [OUTBOX_MAX_PAYLOAD_BYTES]"},
		{Config{Relay: relay.Config{Mode: relay.Stream, Stream: relay.StreamConfig{MaxLag: -1}}}, "Relay.Stream.MaxLag [OUTBOX_STREAM_MAX_LAG]"},
		{Config{Table: outbox.Table{Name: "a;b"}}, "Table.Name [OUTBOX_TABLE]"},
	} {
		_, err := tc.cfg.RelayConfig()
		var ce *outbox.ConfigError
		if !errors.As(err, &ce) || ce.Field != tc.want {
			t.Errorf("%v, want the field %q", err, tc.want)
		}
	}
}

// The default progress topic and transactional id are as the comments
// and docs/exactly-once.md say: without a schema, fxoutbox.progress.<table>.
func TestProgressTopicDefault(t *testing.T) {
	for _, tc := range []struct {
		table         outbox.Table
		topic, prefix string
	}{
		{outbox.Table{}, "fxoutbox.progress.outbox_event", "fxoutbox.outbox_event"},
		{outbox.Table{Schema: "shop", Name: "audit_outbox"}, "fxoutbox.progress.shop.audit_outbox", "fxoutbox.shop.audit_outbox"},
	} {
		pub, err := relay.NewSaramaPublisher([]string{"127.0.0.1:1"}, nil) // no I/O
		if err != nil {
			t.Fatal(err)
		}
		defer pub.Close()
		r, err := relay.New(&pgxpool.Pool{}, pub, &relay.Config{Table: tc.table, Delivery: relay.ExactlyOnce})
		if err != nil {
			t.Fatal(err)
		}
		if rc := r.Config(); rc.ProgressTopic != tc.topic || rc.TransactionalID != tc.prefix {
			t.Errorf("table %v: progress topic %q, transactional ids %q; want %q, %q", tc.table, rc.ProgressTopic, rc.TransactionalID, tc.topic, tc.prefix)
		}
	}
}
