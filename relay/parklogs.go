package relay

import (
	"log/slog"
	"strings"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/parklog"
	"github.com/fxoutbox/outbox/relay/internal/failure"
)

// logFieldMax is how much of a stored field (topic, event type) a log line
// shows, as in a reason.
const logFieldMax = failure.LogFieldMax

// newParkLog returns the relay's log of parked events: the first
// parklog.First (10) events parked for one cause (topic and reason) are
// logged one by one, with their ids; the further events of the cause are
// counted and logged as one summary line per cause every parklog.Interval
// (10 s) ("parked 1,998 more events for topic X: <reason>"), and once more
// when the relay stops. The counts are exact: every parked event is in a
// line of its own or in a summary. A cause with no event parked for a whole
// interval starts over with lines of their own. Permanent failures of
// events not parked yet (charged until MaxAttempts) are logged the same way
// ("N more permanent failures for topic X ...").
func newParkLog(logger *slog.Logger) *parklog.Log {
	return parklog.New(logger, parklog.First, parklog.Interval, func(log *slog.Logger, c parklog.Cause, n int64) {
		if c == (parklog.Cause{}) {
			log.Error("outbox relay: parked "+parklog.More(n, "event")+" for other causes (too many different causes to count apart); see outboxctl status and outboxctl parked list",
				"events", n)
			return
		}
		log.Error("outbox relay: parked "+parklog.More(n, "event")+" for topic "+c.Topic+": "+c.Reason+"; see outboxctl parked list --topic "+shellWord(c.Topic),
			"events", n, "topic", c.Topic, "reason", c.Reason)
	})
}

// shellWord quotes s for a shell command line when it is not a valid topic
// name (those need no quotes).
func shellWord(s string) string {
	if outbox.ValidateTopic(s) == nil {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func newFailedLog(logger *slog.Logger) *parklog.Log {
	return parklog.New(logger, parklog.First, parklog.Interval, func(log *slog.Logger, c parklog.Cause, n int64) {
		noun := "permanent failures"
		if n == 1 {
			noun = "permanent failure"
		}
		if c == (parklog.Cause{}) {
			log.Warn("outbox relay: "+parklog.Thousands(n)+" more "+noun+" for other causes (too many different causes to count apart), retried until MaxAttempts, then parked",
				"failures", n)
			return
		}
		log.Warn("outbox relay: "+parklog.Thousands(n)+" more "+noun+" for topic "+c.Topic+": "+c.Reason+"; retried until MaxAttempts, then parked",
			"failures", n, "topic", c.Topic, "reason", c.Reason)
	})
}
