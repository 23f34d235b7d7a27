package settingsdoc

import (
	"context"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox/outboxconfig"
	"github.com/fxoutbox/outbox/relay"
)

// The defaults the relay's field comments state, which the reference
// shows, are the ones relay.New applies (its named constants), so that the
// generated page cannot drift from the code.
func TestRelayDefaultsInComments(t *testing.T) {
	r, err := relay.New(&pgxpool.Pool{}, relay.PublisherFunc(func(context.Context, []relay.Message) error { return nil }), nil)
	if err != nil {
		t.Fatal(err)
	}
	defaults := reflect.ValueOf(r.Config())
	docs := &comments{root: filepath.Join("..", ".."), byType: map[string]map[string]string{}}
	checked := 0
	for _, v := range outboxconfig.Variables() {
		name, ok := strings.CutPrefix(v.Field, "Relay.")
		if !ok || strings.Contains(name, ".") {
			continue
		}
		doc, err := docs.of(reflect.TypeFor[outboxconfig.Config](), v.Field)
		if err != nil {
			t.Fatal(err)
		}
		stated, _, _ := strings.Cut(defaultOf(doc), ",")
		stated, _, _ = strings.Cut(stated, " ")
		var ok2 bool
		switch def := defaults.FieldByName(name).Interface().(type) {
		case time.Duration:
			d, err := time.ParseDuration(stated)
			ok2 = err == nil && d == def
		case int:
			ok2 = stated == strconv.Itoa(def) || strings.ReplaceAll(stated, ",", "") == strconv.Itoa(def)
		default:
			continue
		}
		checked++
		if !ok2 {
			t.Errorf("relay.Config.%s's comment says the default is %q, relay.New applies %v", name, stated, defaults.FieldByName(name))
		}
	}
	if checked < 12 {
		t.Errorf("only %d defaults checked", checked)
	}
}
