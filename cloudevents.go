package outbox

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/fxoutbox/outbox/internal/textcut"
)

// CloudEventsMode says whether the relay marks its records as CloudEvents.
type CloudEventsMode int

const (
	// CloudEventsOff sends records with the outbox's own headers only
	// (x-event-id, x-event-type, trace context, the event's headers). The
	// default.
	CloudEventsOff CloudEventsMode = iota
	// CloudEventsBinary also sends each record in the binary content mode
	// of the CloudEvents Kafka protocol binding: the headers ce_specversion
	// ("1.0"), ce_id (the event id), ce_source (CloudEvents.Source), ce_type
	// (the event type), ce_time (the row's created_at, RFC 3339, UTC) and
	// content-type ("application/json"), the payload as the value and the
	// partition key as the key, as before. The outbox's own headers stay.
	CloudEventsBinary
)

// String returns "off" or "binary", as OUTBOX_CLOUDEVENTS spells them.
func (m CloudEventsMode) String() string {
	switch m {
	case CloudEventsOff:
		return "off"
	case CloudEventsBinary:
		return "binary"
	}
	return "CloudEventsMode(" + strconv.Itoa(int(m)) + ")"
}

// Headers of the CloudEvents Kafka protocol binding (binary content mode)
// that the relay sets with CloudEventsBinary.
const (
	HeaderCloudEventsSpecVersion = "ce_specversion"
	HeaderCloudEventsID          = "ce_id"
	HeaderCloudEventsSource      = "ce_source"
	HeaderCloudEventsType        = "ce_type"
	HeaderCloudEventsTime        = "ce_time"
	HeaderContentType            = "content-type"
)

// maxCloudEventsSourceBytes caps CloudEvents.Source: it is sent with every
// record.
const maxCloudEventsSourceBytes = 1024

// CloudEvents says whether and how the relay marks its records as
// CloudEvents. The relay (relay.Config.CloudEvents) sends the headers; the
// writers (Limits.CloudEvents) count them in the record size, so that an
// event accepted at Add still fits MaxRecordBytes with them: give both the
// same value (the fxoutbox module does). The zero value is off.
type CloudEvents struct {
	// Mode is CloudEventsOff (default) or CloudEventsBinary
	// (environment: off or binary).
	Mode CloudEventsMode `env:"OUTBOX_CLOUDEVENTS"`
	// Source is the ce_source attribute of every event: a URI-reference
	// naming the context the events come from, e.g. "/order-service" or
	// "urn:acme:order-service". Consumers take source and id together as
	// an event's identity. Required with CloudEventsBinary, at most 1024
	// bytes, no white space. Default none
	// (fxoutbox: "/" + Config.Writer.Service).
	Source string `env:"OUTBOX_CLOUDEVENTS_SOURCE"`
}

// Validate reports an unknown Mode, or a Source that is missing or not a
// URI-reference while Mode is CloudEventsBinary.
func (c CloudEvents) Validate() error {
	switch c.Mode {
	case CloudEventsOff:
		return nil
	case CloudEventsBinary:
	default:
		return &ConfigError{Field: "CloudEvents.Mode", Reason: fmt.Sprintf(
			"is %v: use outbox.CloudEventsOff or outbox.CloudEventsBinary (OUTBOX_CLOUDEVENTS=off or binary)", c.Mode)}
	}
	bad := func(reason string) error {
		return &ConfigError{Field: "CloudEvents.Source", Reason: reason +
			": set the URI-reference that names where the events come from, e.g. /order-service (OUTBOX_CLOUDEVENTS_SOURCE)"}
	}
	switch {
	case c.Source == "":
		return bad("is empty, and CloudEvents.Mode is binary, whose records need a ce_source")
	case len(c.Source) > maxCloudEventsSourceBytes:
		return bad(fmt.Sprintf("is %d bytes, over %d", len(c.Source), maxCloudEventsSourceBytes))
	case !utf8.ValidString(c.Source) || strings.IndexFunc(c.Source, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0:
		return bad(fmt.Sprintf("%s holds white space, control characters or invalid UTF-8", textcut.Quote(c.Source, 64)))
	}
	if _, err := url.Parse(c.Source); err != nil {
		return bad(fmt.Sprintf("%s is not a URI-reference", textcut.Quote(c.Source, 64)))
	}
	return nil
}
