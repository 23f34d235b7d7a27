package outbox

import (
	"errors"
	"fmt"
	"strconv"
)

// PermanentError marks an error that will happen again for the same event
// however often it is retried: a message too large or a missing topic when
// the relay publishes, a payload that cannot be decoded when an inbox
// handler consumes it. Both engines take the same mark; what they do with
// it is theirs (their PoisonPolicy decides):
//
//   - the relay counts it against the event (attempts, last_error) and
//     parks the event after relay.Config.MaxAttempts; every other publish
//     error is transient, retried with backoff and never counted. A
//     relay.Publisher marks its permanent errors with Permanent.
//   - the inbox parks the record at once, without the remaining attempts
//     (other handler errors count as attempts; inbox.Transient ones do not).
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return "permanent: " + e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent wraps err as a PermanentError (nil stays nil).
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// IsPermanent reports whether err is, or wraps, a PermanentError.
func IsPermanent(err error) bool {
	var pe *PermanentError
	return errors.As(err, &pe)
}

// PoisonPolicy says what an engine does with an event that keeps failing:
// the relay's (relay.Config.Poison) with an event it cannot publish, an
// inbox's (inbox.Config.Poison) with a record whose handler keeps failing.
type PoisonPolicy int

const (
	// Park sets the event aside, with its reason, and lets the events of
	// other keys (and, in the inbox, the partition) move on. The default.
	//
	// Relay: after MaxAttempts permanent failures, or at once when the
	// event can never go as stored (unreadable row, malformed headers,
	// invalid topic, too large, missing topic), the event is no longer
	// claimed, and later events of its key are published without it
	// (consumers see a gap in that key's sequence). List parked events with
	// admin.ListParked (or `outboxctl parked list`) and put them back with
	// admin.Requeue (`outboxctl parked requeue`) once the cause is fixed.
	//
	// Inbox: the record is stored in the parked table after MaxAttempts
	// (at once for a Permanent error).
	Park PoisonPolicy = iota
	// Hold never parks a failing event: it is retried with backoff, and
	// later events of its key wait behind it, so the key's order is kept
	// at the price of blocking the key; the other keys flow.
	//
	// Relay: retries are paced up to MaxBackoff apart, with the event's
	// attempts and last error recorded.
	//
	// Inbox: other keys go on until Concurrency x 64 records of the
	// partition are read past it, and the partition's committed offset
	// stays behind it. A Permanent error, a record without identity and
	// (with ParkUnrouted) an unrouted record are still parked.
	Hold
)

// String returns "park" or "hold", as OUTBOX_POISON and
// OUTBOX_INBOX_POISON spell them.
func (p PoisonPolicy) String() string {
	switch p {
	case Park:
		return "park"
	case Hold:
		return "hold"
	}
	return "PoisonPolicy(" + strconv.Itoa(int(p)) + ")"
}

// ErrSlotInvalidated says the server invalidated the table's replication
// slot: it pinned more WAL than max_slot_wal_keep_size allows and the
// server removed WAL the slot still needed. A streaming relay that finds its slot
// invalidated publishes by polling (relay.StreamFallback) and logs it;
// a StreamSetupError of StreamCheckSlotLost matches it (errors.Is).
var ErrSlotInvalidated = errors.New("replication slot invalidated")

// StreamSetupError is what admin.CheckStream finds wrong with the server's
// setup for the streaming relay (relay.Stream), which relay.Relay.Start
// also returns, wrapped. Error says what is wrong and the exact SQL or
// setting that fixes it.
type StreamSetupError struct {
	Table string // the outbox table, schema.name
	Check string // one of the StreamCheck constants
	// Reason says what is wrong; Fix what to change.
	Reason string
	Fix    string
}

// The checks of admin.CheckStream, in the order it makes them: the Check of
// a StreamSetupError.
const (
	// StreamCheckWALLevel: wal_level is not logical.
	StreamCheckWALLevel = "wal_level"
	// StreamCheckPublication: the table's publication is missing or is not
	// FOR TABLE the table WITH (publish = 'insert').
	StreamCheckPublication = "publication"
	// StreamCheckReplicationRole: the role has neither REPLICATION nor
	// SUPERUSER.
	StreamCheckReplicationRole = "replication_role"
	// StreamCheckReplicationCapacity: max_replication_slots or
	// max_wal_senders is 0, or every slot is taken and the table's slot
	// does not exist yet.
	StreamCheckReplicationCapacity = "replication_capacity"
	// StreamCheckSlot: a slot of the table's slot name exists but is not a
	// pgoutput logical slot of this database.
	StreamCheckSlot = "slot"
	// StreamCheckSlotLost: the table's slot was invalidated (wal_status
	// lost). The error also matches ErrSlotInvalidated.
	StreamCheckSlotLost = "slot_lost"
)

func (e *StreamSetupError) Error() string {
	return fmt.Sprintf("streaming relay of %s: %s: %s", e.Table, e.Reason, e.Fix)
}

// Unwrap returns ErrSlotInvalidated for StreamCheckSlotLost, nil otherwise.
func (e *StreamSetupError) Unwrap() error {
	if e.Check == StreamCheckSlotLost {
		return ErrSlotInvalidated
	}
	return nil
}
