package outbox

import (
	"errors"
	"fmt"

	"github.com/fxoutbox/outbox/internal/textcut"
)

// ErrInvalidEvent is matched (errors.Is) by every error about an event that
// cannot be recorded. The concrete error is an *EventError naming the field.
var ErrInvalidEvent = errors.New("invalid outbox event")

// ErrInvalidConfig is matched (errors.Is) by every configuration error. The
// concrete error is a *ConfigError naming the field.
var ErrInvalidConfig = errors.New("invalid outbox configuration")

// EventError says which field of which event is wrong and what to do.
type EventError struct {
	Index  int    // position of the event in the Add call
	Type   string // the event's Type, possibly empty
	Field  string // e.g. "AggregateID", "Payload", "Headers"
	Reason string
}

// Error names the event by its index and its Type, quoted and cut to a
// short prefix (a Type may be long or hold control bytes).
func (e *EventError) Error() string {
	t := "without type"
	if e.Type != "" {
		t = "type " + textcut.Quote(e.Type, 64)
	}
	return fmt.Sprintf("outbox: event %d (%s): %s %s", e.Index, t, e.Field, e.Reason)
}

// Is makes errors.Is(err, ErrInvalidEvent) true.
func (e *EventError) Is(target error) bool { return target == ErrInvalidEvent }

// ConfigError says which configuration field is wrong and what to do.
type ConfigError struct {
	Field  string
	Reason string
	Err    error // underlying cause, if any
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("outbox: config %s: %s", e.Field, e.Reason)
}

// Is makes errors.Is(err, ErrInvalidConfig) true.
func (e *ConfigError) Is(target error) bool { return target == ErrInvalidConfig }

// Unwrap returns the underlying cause.
func (e *ConfigError) Unwrap() error { return e.Err }
