package outboxtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	"github.com/fxoutbox/outbox/internal/textcut"
)

// Want describes an expected event. Empty fields match anything, so a Want
// names only what the test cares about.
type Want struct {
	// Type is the event type, e.g. "payment.captured.v1".
	Type string
	// AggregateType and AggregateID are the entity the event is about.
	AggregateType string
	AggregateID   string
	// Topic is the Kafka topic, as derived when the event named none.
	Topic string
	// Key is the partition key (by default the AggregateID).
	Key string
	// Headers must each be present with this value; other headers (such as
	// the trace context the writer adds) may be present too.
	Headers map[string]string
	// Payload, when not nil, must equal the stored payload as JSON: it is
	// encoded as Event.Payload is (a json.RawMessage or []byte as it is), and
	// both are compared as decoded JSON values, so key order and white space
	// do not matter.
	Payload any
}

// diff lists how r differs from w, or nothing when r matches.
func (w Want) diff(r Record) []string {
	var d []string
	for _, f := range []struct{ name, want, got string }{
		{"Type", w.Type, r.Type},
		{"AggregateType", w.AggregateType, r.AggregateType},
		{"AggregateID", w.AggregateID, r.AggregateID},
		{"Topic", w.Topic, r.Topic},
		{"Key", w.Key, r.Key},
	} {
		if f.want != "" && f.want != f.got {
			d = append(d, fmt.Sprintf("%s is %s, want %s", f.name, textcut.Quote(f.got, 120), textcut.Quote(f.want, 120)))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(w.Headers)) {
		got, ok := r.Headers[k]
		switch {
		case !ok:
			d = append(d, fmt.Sprintf("header %s is missing, want %s", textcut.Quote(k, 120), textcut.Quote(w.Headers[k], 120)))
		case got != w.Headers[k]:
			d = append(d, fmt.Sprintf("header %s is %s, want %s", textcut.Quote(k, 120), textcut.Quote(got, 120), textcut.Quote(w.Headers[k], 120)))
		}
	}
	if w.Payload != nil {
		if msg := payloadDiff(w.Payload, r.Payload); msg != "" {
			d = append(d, msg)
		}
	}
	return d
}

func payloadDiff(want any, got []byte) string {
	var wantJSON []byte
	switch v := want.(type) {
	case json.RawMessage:
		wantJSON = v
	case []byte:
		wantJSON = v
	default:
		b, err := json.Marshal(want)
		if err != nil {
			return fmt.Sprintf("Want.Payload cannot be encoded as JSON: %v", err)
		}
		wantJSON = b
	}
	wv, err := decodeJSON(wantJSON)
	if err != nil {
		return fmt.Sprintf("Want.Payload is not valid JSON: %v", err)
	}
	gv, err := decodeJSON(got)
	if err != nil || !reflect.DeepEqual(wv, gv) {
		return fmt.Sprintf("Payload is %s, want %s", textcut.Quote(string(got), 120), textcut.Quote(string(wantJSON), 120))
	}
	return ""
}

func decodeJSON(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}

func (w Want) String() string {
	var parts []string
	for _, f := range []struct{ name, v string }{
		{"Type", w.Type}, {"AggregateType", w.AggregateType}, {"AggregateID", w.AggregateID}, {"Topic", w.Topic}, {"Key", w.Key},
	} {
		if f.v != "" {
			parts = append(parts, f.name+"="+textcut.Quote(f.v, 120))
		}
	}
	if len(w.Headers) > 0 {
		parts = append(parts, fmt.Sprintf("%d headers", len(w.Headers)))
	}
	if w.Payload != nil {
		parts = append(parts, "Payload")
	}
	if len(parts) == 0 {
		return "{any event}"
	}
	return "{" + strings.Join(parts, " ") + "}"
}

// describe names a record in a failure message.
func describe(r Record) string {
	return fmt.Sprintf("{Type=%s AggregateType=%s AggregateID=%s Topic=%s Key=%s}",
		textcut.Quote(r.Type, 120), textcut.Quote(r.AggregateType, 120), textcut.Quote(r.AggregateID, 120), textcut.Quote(r.Topic, 120), textcut.Quote(r.Key, 120))
}

// listing lists records for a failure message, each with how it differs
// from want when want is not nil.
func listing(recs []Record, want *Want) string {
	const max = 20
	var b strings.Builder
	for i, r := range recs {
		if i == max {
			fmt.Fprintf(&b, "\n  ... and %d more", len(recs)-max)
			break
		}
		fmt.Fprintf(&b, "\n  %d: %s", i, describe(r))
		if want != nil {
			if d := want.diff(r); len(d) > 0 {
				fmt.Fprintf(&b, ": %s", strings.Join(d, "; "))
			}
		}
	}
	return b.String()
}

// one returns the index of the single record of recs that matches want, or
// fails t and returns -1. what names where the records came from.
func one(t T, what string, recs []Record, want Want, hint string) int {
	t.Helper()
	var matches []int
	for i, r := range recs {
		if len(want.diff(r)) == 0 {
			matches = append(matches, i)
		}
	}
	switch len(matches) {
	case 1:
		return matches[0]
	case 0:
		if len(recs) == 0 {
			t.Fatalf("outboxtest: no event matches %s: %s none", want, what)
		} else {
			t.Fatalf("outboxtest: no event matches %s; %s %d:%s", want, what, len(recs), listing(recs, &want))
		}
	default:
		t.Fatalf("outboxtest: %d events match %s, want exactly one (%s):%s", len(matches), want, hint, listing(recs, nil))
	}
	return -1
}

// many checks that recs match wants one to one, in order.
func many(t T, what string, recs []Record, wants []Want) bool {
	t.Helper()
	var problems []string
	for i := range max(len(recs), len(wants)) {
		switch {
		case i >= len(recs):
			problems = append(problems, fmt.Sprintf("  %d: missing, want %s", i, wants[i]))
		case i >= len(wants):
			problems = append(problems, fmt.Sprintf("  %d: %s is not expected", i, describe(recs[i])))
		default:
			if d := wants[i].diff(recs[i]); len(d) > 0 {
				problems = append(problems, fmt.Sprintf("  %d: %s: %s", i, describe(recs[i]), strings.Join(d, "; ")))
			}
		}
	}
	if len(problems) == 0 {
		return true
	}
	if len(problems) > 20 {
		problems = append(problems[:20], fmt.Sprintf("  ... and %d more", len(problems)-20))
	}
	t.Fatalf("outboxtest: %s %d events, want %d:\n%s", what, len(recs), len(wants), strings.Join(problems, "\n"))
	return false
}

// RequireEvent fails the test unless exactly one event recorded by rec
// matches want, and returns that event.
func RequireEvent(t T, rec *Recorder, want Want) Record {
	t.Helper()
	evs := rec.Events()
	i := one(t, "recorded", evs, want, "name more fields, or use RequireEvents")
	if i < 0 {
		return Record{}
	}
	return evs[i]
}

// RequireEvents fails the test unless the events recorded by rec match
// wants one to one, in the order they were added, with none left over. It
// returns them.
func RequireEvents(t T, rec *Recorder, wants ...Want) []Record {
	t.Helper()
	evs := rec.Events()
	if !many(t, "recorded", evs, wants) {
		return nil
	}
	return evs
}

// RequireNoEvents fails the test if rec recorded any event.
func RequireNoEvents(t T, rec *Recorder) {
	t.Helper()
	if evs := rec.Events(); len(evs) > 0 {
		t.Fatalf("outboxtest: recorded %d events, want none:%s", len(evs), listing(evs, nil))
	}
}

// Payload decodes the JSON payload of r into a P, failing the test if it
// does not decode.
func Payload[P any](t T, r Record) P {
	t.Helper()
	var p P
	if err := json.Unmarshal(r.Payload, &p); err != nil {
		t.Fatalf("outboxtest: payload of %s does not decode into %T: %v (payload %s)", describe(r), p, err, textcut.Quote(string(r.Payload), 120))
	}
	return p
}
