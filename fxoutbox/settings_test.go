package fxoutbox

import (
	"context"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/inbox"
	"github.com/fxoutbox/outbox/internal/envconfig"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// TestEverySettingReachable walks relay.Config, unitofwork.Config and
// inbox.Config by reflection: each field must have a setting (a path in
// fxoutbox's Config or InboxConfig of the same type, and environment
// variables that the loader reads) or be listed as code-only (loggers,
// providers, functions, a *sarama.Config). A field added to an engine's
// Config without either fails here.
func TestEverySettingReachable(t *testing.T) {
	read := map[string]bool{}
	record := func(k string) (string, bool) { read[k] = true; return "", false }
	if _, err := configFrom(record); err != nil {
		t.Fatal(err)
	}
	if _, err := inboxConfigFrom(record); err != nil {
		t.Fatal(err)
	}
	for _, engine := range []struct {
		name     string
		typ      reflect.Type
		fx       reflect.Type
		settings []setting
		codeOnly []string
	}{
		{"relay.Config", reflect.TypeFor[relay.Config](), reflect.TypeFor[Config](), relaySettings, relayFromFx},
		{"unitofwork.Config", reflect.TypeFor[unitofwork.Config](), reflect.TypeFor[Config](), unitOfWorkSettings, unitOfWorkFromFx},
		{"inbox.Config", reflect.TypeFor[inbox.Config](), reflect.TypeFor[InboxConfig](), inboxSettings, inboxCodeOnly},
	} {
		byField := map[string]setting{}
		for _, s := range engine.settings {
			if _, ok := engine.typ.FieldByName(s.Field); !ok {
				t.Errorf("%s has no field %s, which a setting names", engine.name, s.Field)
			}
			byField[s.Field] = s
		}
		for _, f := range reflect.VisibleFields(engine.typ) {
			s, ok := byField[f.Name]
			code := slices.Contains(engine.codeOnly, f.Name)
			switch {
			case ok && code:
				t.Errorf("%s.%s is both a setting and code-only", engine.name, f.Name)
			case code:
			case !ok:
				t.Errorf("%s.%s has no fx path and no environment variable: add it to fxoutbox's Config and ConfigFromEnv "+
					"(and the settings table of docs/configuration.md), or list it as code-only", engine.name, f.Name)
			default:
				if s.Fx == "" && s.Env == "" {
					t.Errorf("%s.%s: setting with neither an fx path nor a variable", engine.name, f.Name)
				}
				if s.Fx != "" {
					if ft, ok := fieldType(engine.fx, s.Fx); !ok {
						t.Errorf("%s.%s: fx path %s.%s does not exist", engine.name, f.Name, engine.fx.Name(), s.Fx)
					} else if ft != f.Type {
						t.Errorf("%s.%s is a %v but %s.%s a %v", engine.name, f.Name, f.Type, engine.fx.Name(), s.Fx, ft)
					}
				}
				for _, v := range strings.Split(s.Env, ", ") {
					if v != "" && !read[v] {
						t.Errorf("%s.%s: the environment loader does not read %s", engine.name, f.Name, v)
					}
				}
			}
		}
	}
}

// fieldType follows a dotted path of fields from t.
func fieldType(t reflect.Type, path string) (reflect.Type, bool) {
	for _, name := range strings.Split(path, ".") {
		f, ok := t.FieldByName(name)
		if !ok {
			return nil, false
		}
		t = f.Type
	}
	if path == "DisableListen" { // relay.Config.Listen, inverted
		return reflect.TypeFor[bool](), true
	}
	return t, true
}

// The relay settings that fx and the environment could not reach before
// (CleanupInterval, CleanupBatch, StatsInterval) reach the relay, and so do
// the others, through the one mapping.
func TestRelayConfigFromSettings(t *testing.T) {
	env := map[string]string{
		"OUTBOX_CLEANUP_INTERVAL": "2m", "OUTBOX_CLEANUP_BATCH": "10", "OUTBOX_STATS_INTERVAL": "3s",
		"OUTBOX_BATCH_SIZE": "7", "OUTBOX_LISTEN": "off", "OUTBOX_MAX_RECORD_BYTES": "5000",
	}
	c, err := configFrom(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatal(err)
	}
	rc := (&instance{}).relayConfig(c)
	if rc.CleanupInterval != 2*time.Minute || rc.CleanupBatch != 10 || rc.StatsInterval != 3*time.Second ||
		rc.BatchSize != 7 || rc.Listen || rc.MaxMessageBytes != 5000 {
		t.Errorf("relay config = %+v", rc)
	}
	for k, v := range map[string]string{"OUTBOX_CLEANUP_INTERVAL": "-1m", "OUTBOX_CLEANUP_BATCH": "0", "OUTBOX_STATS_INTERVAL": "often"} {
		if _, err := configFrom(func(name string) (string, bool) { return v, name == k }); err == nil || !strings.Contains(err.Error(), k) {
			t.Errorf("%s=%s: err = %v, want an error naming it", k, v, err)
		}
	}
}

// The defaults Config's field comments state for the relay's settings are
// the relay's own (its named constants, which relay.New applies), so that
// fxoutbox writes no default of its own.
func TestRelayDefaultsInComments(t *testing.T) {
	r, err := relay.New(&pgxpool.Pool{}, relay.PublisherFunc(func(context.Context, []relay.Message) error { return nil }), nil)
	if err != nil {
		t.Fatal(err)
	}
	defaults := reflect.ValueOf(r.Config())
	f, err := parser.ParseFile(token.NewFileSet(), "config.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	docs := map[string]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		if ts, ok := n.(*ast.TypeSpec); ok && ts.Name.Name == "Config" {
			for _, fl := range ts.Type.(*ast.StructType).Fields.List {
				for _, id := range fl.Names {
					docs[id.Name] = strings.Join(strings.Fields(fl.Doc.Text()), " ")
				}
			}
		}
		return true
	})
	re := regexp.MustCompile(`Default ([0-9][0-9a-zA-Z]*)`)
	checked := 0
	for _, s := range relaySettings {
		m := re.FindStringSubmatch(docs[s.Fx])
		if s.Fx != s.Field || m == nil {
			continue
		}
		checked++
		var got any
		switch def := defaults.FieldByName(s.Field).Interface().(type) {
		case time.Duration:
			d, err := time.ParseDuration(m[1])
			if err != nil || d != def {
				got = m[1]
			}
		case int:
			if m[1] != strconv.Itoa(def) {
				got = m[1]
			}
		default:
			t.Errorf("%s: a default of type %T in the comment", s.Fx, def)
		}
		if got != nil {
			t.Errorf("Config.%s says Default %v, the relay's default is %v", s.Fx, got, defaults.FieldByName(s.Field))
		}
	}
	if checked < 10 {
		t.Errorf("only %d comments checked", checked)
	}
}

// envconfig.Outbox, which the environment loader fills, maps field by field
// onto Config (configFromPrefix copies by name), and its TopicCheck values
// are Config's.
func TestEnvconfigMatchesConfig(t *testing.T) {
	cfg := reflect.TypeFor[Config]()
	for _, f := range reflect.VisibleFields(reflect.TypeFor[envconfig.Outbox]()) {
		if f.Name == "Warnings" || f.Name == "Names" {
			continue
		}
		if f.Name == "EventTypes" { // converted one by one
			if !reflect.TypeFor[envconfig.EventType]().ConvertibleTo(reflect.TypeFor[EventType]()) {
				t.Error("envconfig.EventType does not convert to EventType")
			}
			continue
		}
		if cf, ok := cfg.FieldByName(f.Name); !ok || !f.Type.ConvertibleTo(cf.Type) {
			t.Errorf("envconfig.Outbox.%s (%v) has no Config field of that name and a convertible type", f.Name, f.Type)
		}
	}
	if envconfig.TopicsOff != int(TopicsOff) || envconfig.TopicsCheck != int(TopicsCheck) || envconfig.TopicsCreate != int(TopicsCreate) {
		t.Error("envconfig's TopicCheck values differ from fxoutbox's")
	}
}

// The relay's config errors reach the user naming the fxoutbox field and
// its variable.
func TestRelayErrorNamesVariable(t *testing.T) {
	for field, want := range map[string]string{
		"BatchSize":       "BatchSize [OUTBOX_BATCH_SIZE]",
		"CleanupBatch":    "CleanupBatch [OUTBOX_CLEANUP_BATCH]",
		"MaxMessageBytes": "Limits.MaxRecordBytes [OUTBOX_MAX_RECORD_BYTES]",
		"Stream.MaxLag":   "Stream.MaxLag [OUTBOX_STREAM_MAX_LAG, OUTBOX_STREAM_MAX_LAG_BYTES]",
	} {
		err := settingError(&outbox.ConfigError{Field: field, Reason: "is -1"}, relaySettings)
		var ce *outbox.ConfigError
		if !errors.As(err, &ce) || ce.Field != want {
			t.Errorf("%s: %v, want the field %q", field, err, want)
		}
	}
	r, _ := relay.New(&pgxpool.Pool{}, relay.PublisherFunc(func(context.Context, []relay.Message) error { return nil }), &relay.Config{StatsInterval: -1})
	if r != nil {
		t.Fatal("relay.New took StatsInterval -1")
	}
	if settingError(nil, relaySettings) != nil {
		t.Error("settingError(nil) is not nil")
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
