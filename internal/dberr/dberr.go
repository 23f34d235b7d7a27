// Package dberr names database failures by their cause, for the error.type
// of metrics, spans and logs: the one classification the relay and the
// inbox share.
package dberr

import (
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
)

// The database error types, low-cardinality values of error.type.
const (
	Database       = "database"                // any other database failure
	Connection     = "database.connection"     // unreachable, connection lost, server shutting down
	Timeout        = "database.timeout"        // statement or lock timeout, deadline
	Authentication = "database.authentication" // the server refused the credentials
	Permission     = "database.permission"     // the role lacks a privilege
	Schema         = "database.schema"         // table or column missing: migrations not applied
	Conflict       = "database.conflict"       // serialization failure, deadlock, lock not available
	Resources      = "database.resources"      // out of disk, memory, connections
)

// PgType names a PostgreSQL error by its SQLSTATE, or a failure to
// connect; "" for an error that is neither.
func PgType(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		code := pe.Code
		switch {
		case strings.HasPrefix(code, "08"), code == "57P01", code == "57P02", code == "57P03", code == "53300":
			return Connection
		case code == "57014", code == "25P03":
			return Timeout
		case strings.HasPrefix(code, "28"):
			return Authentication
		case code == "42501":
			return Permission
		case code == "42P01", code == "42703", code == "42883", code == "3F000":
			return Schema
		case strings.HasPrefix(code, "40"), code == "55P03":
			return Conflict
		case strings.HasPrefix(code, "53"):
			return Resources
		}
		return Database
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		if PgType(ce.Unwrap()) == Authentication {
			return Authentication
		}
		return Connection
	}
	return ""
}

// IsConnection reports a failure of the network connection itself (not a
// context's deadline, which also satisfies net.Error).
func IsConnection(err error) bool {
	var oe *net.OpError
	var de *net.DNSError
	return errors.As(err, &oe) || errors.As(err, &de) ||
		errors.Is(err, pgconn.ErrConnClosed) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// Is reports an error from PostgreSQL or from connecting to it.
func Is(err error) bool {
	return errors.As(err, new(*pgconn.PgError)) || errors.As(err, new(*pgconn.ConnectError))
}
