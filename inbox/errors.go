package inbox

import (
	"context"
	"errors"
	"log/slog"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/dberr"
	"github.com/fxoutbox/outbox/internal/parklog"
	"github.com/fxoutbox/outbox/internal/textcut"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

var (
	// ErrNoEventID is the reason a record without an identity is parked: it
	// has no x-event-id header, nor the ce_id and ce_source headers of a
	// CloudEvent (another producer wrote it). Configure Config.Identity
	// (e.g. EventIDOrPosition) to accept such records.
	ErrNoEventID = errors.New("inbox: the record has no x-event-id header (nor CloudEvents ce_id and ce_source headers), so it cannot be deduplicated: set Config.Identity (e.g. inbox.EventIDOrPosition) to accept records of other producers")
	// ErrNoRoute is the reason a record is parked when Config.ParkUnrouted
	// is set and no route takes its topic and event type.
	ErrNoRoute = errors.New("inbox: no route takes the record's topic and event type")
	// ErrNotFound is returned by Retry and Delete for a parked record that
	// does not exist (or belongs to another consumer name).
	ErrNotFound = errors.New("inbox: no such parked record")
)

// The error.type values the inbox reports on metrics, spans and logs.
// Database values name the SQLSTATE class, as the relay's do.
const (
	ErrorTypeHandler                = "handler"           // the handler failed (counts as an attempt)
	ErrorTypePermanent              = "handler.permanent" // the handler returned a Permanent error
	ErrorTypeNoEventID              = "no_event_id"       // the record has no identity
	ErrorTypeNoRoute                = "no_route"          // no route for the record (ParkUnrouted)
	ErrorTypeDatabase               = dberr.Database      // any other database failure
	ErrorTypeDatabaseConnection     = dberr.Connection    // unreachable, connection lost, server shutting down
	ErrorTypeDatabaseTimeout        = dberr.Timeout       // statement or lock timeout, deadline
	ErrorTypeDatabaseConflict       = dberr.Conflict      // serialization failure, deadlock, lock not available
	ErrorTypeDatabaseResources      = dberr.Resources     // out of disk, memory, connections
	ErrorTypeDatabaseSchema         = dberr.Schema        // table missing: migrations not applied
	ErrorTypeDatabasePermission     = dberr.Permission    // the role lacks a privilege
	ErrorTypeTimeout                = "timeout"           // a deadline outside the database
	ErrorTypeCanceled               = "canceled"          // the consumer stopped or lost the partition
	ErrorTypeDatabaseAuthentication = dberr.Authentication
)

// Transient marks a handler error as temporary (a dependency that is down):
// the record is retried with backoff and the error does not count as an
// attempt. Errors of the handler's database statements are recognised
// without it (lost connection, 40001, 40P01, timeouts).
func Transient(err error) error {
	if err == nil {
		return nil
	}
	return &markedError{err: err}
}

// markedError is a Transient error.
type markedError struct{ err error }

func (e *markedError) Error() string { return e.err.Error() }
func (e *markedError) Unwrap() error { return e.err }

// handlerError is an error the handler returned.
type handlerError struct{ err error }

func (e *handlerError) Error() string { return e.err.Error() }
func (e *handlerError) Unwrap() error { return e.err }

// kind says how a failure of one try is treated.
type kind int

const (
	kindTransient kind = iota // retried with backoff, not counted
	kindAttempt               // counts as an attempt
	kindPermanent             // parks at once
)

// classify says whether err, from one try at a record, is held against it.
// Errors outside the handler (begin, the inbox row, the outbox insert,
// commit) never are: they are the database's, not the record's.
func classify(err error) kind {
	if outbox.IsPermanent(err) {
		return kindPermanent
	}
	var me *markedError
	if errors.As(err, &me) {
		return kindTransient
	}
	var he *handlerError
	if !errors.As(err, &he) {
		if errors.Is(err, pgx.ErrTxCommitRollback) {
			// The handler swallowed an error of its own statement.
			return kindAttempt
		}
		return kindTransient
	}
	if transientDB(he.err) {
		return kindTransient
	}
	return kindAttempt
}

// transientDB reports a database failure that goes away by itself.
func transientDB(err error) bool {
	switch t := errorType(err); t {
	case ErrorTypeDatabaseConnection, ErrorTypeDatabaseTimeout, ErrorTypeDatabaseConflict, ErrorTypeDatabaseResources, ErrorTypeTimeout:
		return true
	}
	return pgconn.SafeToRetry(err)
}

// errorType classifies err into one of the ErrorType values.
func errorType(err error) string {
	if err == nil {
		return ""
	}
	if outbox.IsPermanent(err) {
		return ErrorTypePermanent
	}
	switch {
	case errors.Is(err, ErrNoEventID):
		return ErrorTypeNoEventID
	case errors.Is(err, ErrNoRoute):
		return ErrorTypeNoRoute
	}
	if t := dberr.PgType(err); t != "" {
		return t
	}
	switch {
	case errors.Is(err, context.Canceled):
		return ErrorTypeCanceled
	case pgconn.Timeout(err):
		return ErrorTypeDatabaseTimeout
	case errors.Is(err, context.DeadlineExceeded):
		return ErrorTypeTimeout
	case dberr.IsConnection(err):
		return ErrorTypeDatabaseConnection
	}
	var he *handlerError
	if errors.As(err, &he) {
		return ErrorTypeHandler
	}
	return ErrorTypeDatabase
}

// reason is the text stored as a parked record's last_error (its
// error_type is stored beside it), shown by outboxctl and sent in the
// dead-letter event: the handler's own error text, without the inbox's
// wrapping, or the inbox's reason (no identity, no route). The same cause
// should give the same text, so that parked records group by it: keep
// record-specific details (ids, offsets, amounts, times) out of the errors
// a handler returns, and log them instead.
func reason(err error) string {
	for {
		switch e := err.(type) {
		case *handlerError:
			err = e.err
		case *markedError:
			err = e.err
		case *outbox.PermanentError:
			err = e.Err
		default:
			return text(textcut.Clip(err.Error(), 4000))
		}
	}
}

// newParkLog returns a consumer's log of parked records: the first
// parklog.First (10) records parked for one cause (topic and reason) are
// logged one by one, with their event ids and positions; the further
// records of the cause are counted and logged as one summary line per cause
// every parklog.Interval (10 s) ("parked 1,998 more records of consumer C
// from topic X: <reason>"), and once more when the consumer stops. The
// counts are exact: every parked record is in a line of its own or in a
// summary. A cause with no record parked for a whole interval starts over
// with lines of their own.
func newParkLog(logger *slog.Logger, consumer string) *parklog.Log {
	return parklog.New(logger, parklog.First, parklog.Interval, func(log *slog.Logger, c parklog.Cause, n int64) {
		if c == (parklog.Cause{}) {
			log.Error("outbox inbox: parked "+parklog.More(n, "record")+" of consumer "+consumer+" for other causes (too many different causes to count apart); see outboxctl inbox parked list --consumer "+consumer,
				"consumer", consumer, "records", n)
			return
		}
		log.Error("outbox inbox: parked "+parklog.More(n, "record")+" of consumer "+consumer+" from topic "+c.Topic+": "+c.Reason+"; see outboxctl inbox parked list --consumer "+consumer,
			"consumer", consumer, "records", n, "topic", c.Topic, "reason", c.Reason)
	})
}
