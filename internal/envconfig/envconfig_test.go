package envconfig

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

func lookupIn(env map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := env[k]; return v, ok }
}

func environOf(env map[string]string) []string {
	var out []string
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	return out
}

// The variables of the project's scripts, exported in the shell that runs
// a service (eval "export $(scripts/pg.sh up)" and the like, KAFKA_PORT
// for a second broker), are neither typos nor warnings.
func TestScriptVariablesAreNoTypos(t *testing.T) {
	env := map[string]string{"OUTBOX_SERVICE": "svc", "KAFKA_BROKERS": "127.0.0.1:9092"}
	for _, n := range ScriptVariables {
		env[n] = "1"
	}
	c, err := Read("", lookupIn(env), environOf(env)...)
	if err != nil {
		t.Fatalf("Read with the scripts' variables set: %v", err)
	}
	if len(c.Warnings) != 0 {
		t.Errorf("Read warns about the scripts' variables: %q", c.Warnings)
	}
	// A typo of a setting is still one, and an unknown variable still a
	// warning.
	env["OUTBOX_BATCHSIZE"] = "5"
	if _, err := Read("", lookupIn(env), environOf(env)...); err == nil || !strings.Contains(err.Error(), "OUTBOX_BATCH_SIZE") {
		t.Errorf("Read with OUTBOX_BATCHSIZE = %v, want the typo error", err)
	}
	delete(env, "OUTBOX_BATCHSIZE")
	env["KAFKA_OPTS"] = "-Xmx1g"
	if c, err := Read("", lookupIn(env), environOf(env)...); err != nil || len(c.Warnings) != 1 || !strings.Contains(c.Warnings[0], "KAFKA_OPTS") {
		t.Errorf("Read with KAFKA_OPTS: warnings %q, %v; want one naming it", c.Warnings, err)
	}
}

// ScriptVariables lists every OUTBOX_ and KAFKA_ variable that the scripts
// read and that is not a setting.
func TestScriptVariablesListed(t *testing.T) {
	settings := map[string]bool{}
	if _, err := Read("", func(k string) (string, bool) { settings[k] = true; return "", false }); err != nil {
		t.Fatal(err)
	}
	for _, n := range InboxVariables {
		settings[n] = true
	}
	files, _ := filepath.Glob("../../scripts/*.sh")
	read := regexp.MustCompile(`\$\{((?:OUTBOX|KAFKA)_[A-Z0-9_]+)`)
	found := 0
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range read.FindAllStringSubmatch(string(src), -1) {
			name := m[1]
			found++
			if !settings[name] && !slices.Contains(ScriptVariables, name) {
				t.Errorf("%s reads %s, which is neither a setting nor in ScriptVariables", f, name)
			}
		}
	}
	if found < 10 {
		t.Fatalf("found %d variables read in %v: is the pattern right?", found, files)
	}
	for _, n := range ScriptVariables {
		if settings[n] {
			t.Errorf("%s is a setting and in ScriptVariables", n)
		}
	}
}

func TestEventTypes(t *testing.T) {
	got, err := eventTypes("payment:payment.created.v1, refund:refund.issued.v1=ledger.refunds\n=audit.entries")
	want := []EventType{
		{AggregateType: "payment", Type: "payment.created.v1"},
		{AggregateType: "refund", Type: "refund.issued.v1", Topic: "ledger.refunds"},
		{Topic: "audit.entries"},
	}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("eventTypes = %+v, %v; want %+v", got, err, want)
	}
	for _, v := range []string{"payment", "payment:", ":created", "a:b=", "a:b=bad topic!", ","} {
		if _, err := eventTypes(v); err == nil || !strings.Contains(err.Error(), "OUTBOX_EVENT_TYPES") {
			t.Errorf("eventTypes(%q) = %v, want an error naming OUTBOX_EVENT_TYPES", v, err)
		}
	}
}

// Rename names the variables as set in any error's text, keeping its
// chain; Text does it for a message.
func TestRenameAnyError(t *testing.T) {
	n, err := NewNames("AUDIT_", []string{"AUDIT_KAFKA_BROKERS=x:1"})
	if err != nil {
		t.Fatal(err)
	}
	cause := errors.New("connection refused")
	got := n.Rename(fmt.Errorf("topic check (OUTBOX_TOPICS=create): connect to Kafka at KAFKA_BROKERS=x:1: %w", cause))
	if want := "topic check (AUDIT_OUTBOX_TOPICS=create): connect to Kafka at AUDIT_KAFKA_BROKERS=x:1: connection refused"; got.Error() != want || !errors.Is(got, cause) {
		t.Errorf("Rename = %q (keeps the cause: %t), want %q", got, errors.Is(got, cause), want)
	}
	if got := n.Rename(got); got.Error() != "topic check (AUDIT_OUTBOX_TOPICS=create): connect to Kafka at AUDIT_KAFKA_BROKERS=x:1: connection refused" {
		t.Errorf("Rename twice = %q", got)
	}
	if got := n.Text("set OUTBOX_SCHEMA and OUTBOX_TABLE"); got != "set AUDIT_OUTBOX_SCHEMA and AUDIT_OUTBOX_TABLE" {
		t.Errorf("Text = %q", got)
	}
	if (Names{}).Rename(cause) != cause || n.Rename(nil) != nil {
		t.Error("Rename changed an error it had nothing to rename in")
	}
}
