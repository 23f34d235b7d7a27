package outbox

import (
	"errors"
	"regexp"
	"strings"
	"unicode"
)

// TopicFunc derives the topic of an event that names none. service is the
// writer's configured service name.
type TopicFunc func(service string, e Event) (string, error)

var versionSuffix = regexp.MustCompile(`[._-]?[vV][0-9]+$`)

// TopicPerEvent names one topic per event type, as
// "<service>.<aggregate-type>.<event-name>": the event name is the event type
// without its aggregate prefix and version suffix, in kebab case.
//
//	service "order-service", aggregate "Order", type "order.confirmed.v1"      -> "order-service.order.confirmed"
//	service "product-service", aggregate "Product", type "ProductPriceChanged.v1" -> "product-service.product.price-changed"
//
// It is the default TopicFunc.
func TopicPerEvent(service string, e Event) (string, error) {
	if service == "" {
		return "", errors.New("cannot be derived: the writer has no Service configured; set Service or the event's Topic")
	}
	agg := kebab(e.AggregateType)
	name := versionSuffix.ReplaceAllString(e.Type, "")
	// Strip the aggregate prefix in either spelling: "order.confirmed" or "OrderConfirmed".
	for _, p := range []string{e.AggregateType + ".", agg + ".", e.AggregateType} {
		if len(name) > len(p) && strings.EqualFold(name[:len(p)], p) {
			name = name[len(p):]
			break
		}
	}
	name = kebab(strings.ReplaceAll(name, ".", "-"))
	if agg == "" || name == "" {
		return "", errors.New("cannot be derived from the aggregate type and event type: set the event's Topic")
	}
	return service + "." + agg + "." + name, nil
}

// TopicPerAggregate names one topic per aggregate type, as
// "<service>.<aggregate-type>"; consumers tell events apart by the
// x-event-type header. It suits a consumer that wants every event of one
// aggregate in order; the price is that it cannot take one event type alone.
func TopicPerAggregate(service string, e Event) (string, error) {
	if service == "" {
		return "", errors.New("cannot be derived: the writer has no Service configured; set Service or the event's Topic")
	}
	agg := kebab(e.AggregateType)
	if agg == "" {
		return "", errors.New("cannot be derived from the aggregate type: set the event's Topic")
	}
	return service + "." + agg, nil
}

// kebab turns "PriceChanged", "price_changed" or "price changed" into
// "price-changed". Runs of capitals stay together ("HTTPRequest" -> "http-request").
func kebab(s string) string {
	var b strings.Builder
	rs := []rune(strings.TrimSpace(s))
	for i, r := range rs {
		switch {
		case r == '_' || r == ' ' || r == '-':
			if b.Len() > 0 && !strings.HasSuffix(b.String(), "-") {
				b.WriteByte('-')
			}
		case unicode.IsUpper(r):
			if i > 0 && b.Len() > 0 && !strings.HasSuffix(b.String(), "-") &&
				(unicode.IsLower(rs[i-1]) || unicode.IsDigit(rs[i-1]) || (i+1 < len(rs) && unicode.IsLower(rs[i+1]))) {
				b.WriteByte('-')
			}
			b.WriteRune(unicode.ToLower(r))
		default:
			b.WriteRune(r)
		}
	}
	return strings.Trim(b.String(), "-")
}
