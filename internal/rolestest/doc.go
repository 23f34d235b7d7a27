// Package rolestest proves migrations/roles.example.sql on a real
// PostgreSQL server: a migration role that is not a superuser applies the
// migrations and then the script; the writer and relay roles it grants can
// do all that unitofwork and relay do, and nothing more. The streaming
// relay's role the script describes (REPLICATION, member of the relay role)
// streams the table's inserts, and the relay role without REPLICATION is
// refused as admin.CheckStream says.
//
// The tests create roles with random names (LOGIN, with a password, so they
// also work where DATABASE_URL's server does not trust local connections)
// and drop them at the end. They need DATABASE_URL to name a role that can
// create roles and schemas (make test's throwaway cluster connects as a
// superuser).
package rolestest
