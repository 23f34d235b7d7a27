package record

import (
	"iter"
	"strings"
	"time"

	"github.com/fxoutbox/outbox"
)

// reserved are the headers the outbox sets on every record itself.
var reserved = map[string]bool{
	outbox.HeaderEventID:   true,
	outbox.HeaderEventType: true,
	"traceparent":          true,
	"tracestate":           true,
	"baggage":              true,
}

// ReservedHeader reports whether name is set by the outbox itself and so
// cannot be an event's own header (compared case-insensitively).
func ReservedHeader(name string) bool { return reserved[strings.ToLower(name)] }

// CloudEventsHeader reports whether the relay sets the header name itself
// in CloudEventsBinary mode (compared case-insensitively): an event's own
// header of that name is then refused at Add, and one stored in a row is
// replaced by the relay's. Other ce_ headers (ce_subject, extensions) are
// the event's to set.
func CloudEventsHeader(name string) bool {
	switch strings.ToLower(name) {
	case outbox.HeaderCloudEventsSpecVersion, outbox.HeaderCloudEventsID, outbox.HeaderCloudEventsSource,
		outbox.HeaderCloudEventsType, outbox.HeaderCloudEventsTime, outbox.HeaderContentType:
		return true
	}
	return false
}

// CloudEventsHeaders yields, name and value, the headers of the
// CloudEvents Kafka protocol binding's binary content mode that the relay
// sends with an event in c's mode (none unless CloudEventsBinary): the
// required attributes, time, and the payload's content type; the record's
// key and value are its own. id is the event id's text and created the
// ce_time value (CloudEventsTime). The relay sends these; Prepare counts
// them in the record's size, with ce_time at its widest.
func CloudEventsHeaders(c outbox.CloudEvents, id, eventType, created string) iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		if c.Mode != outbox.CloudEventsBinary {
			return
		}
		_ = yield(outbox.HeaderCloudEventsSpecVersion, cloudEventsSpecVersion) &&
			yield(outbox.HeaderCloudEventsID, id) &&
			yield(outbox.HeaderCloudEventsSource, c.Source) &&
			yield(outbox.HeaderCloudEventsType, eventType) &&
			yield(outbox.HeaderCloudEventsTime, created) &&
			yield(outbox.HeaderContentType, cloudEventsContentType)
	}
}

// CloudEventsTime is an event's ce_time: its created_at in RFC 3339, UTC.
func CloudEventsTime(created time.Time) string { return created.UTC().Format(time.RFC3339Nano) }

// widestCloudEventsTime is the longest ce_time the relay sends for a
// created_at of a four-digit year: nanoseconds in full. PostgreSQL keeps
// microseconds, so the relay's values are at most 27 bytes.
// The CloudEvents values the relay sends: the spec version and the
// content type of the payload (JSON).
const (
	cloudEventsSpecVersion = "1.0"
	cloudEventsContentType = "application/json"
)

const widestCloudEventsTime = "2006-01-02T15:04:05.999999999Z"
