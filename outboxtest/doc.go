// Package outboxtest helps applications test the handlers that record
// outbox events, with or without a database, in the style of river's
// rivertest.
//
// # Unit tests without a database
//
// A handler that depends on [unitofwork.Doer] instead of
// *unitofwork.UnitOfWork takes a [Recorder] in its unit tests. The
// recorder's Do runs the handler's function with a Tx whose Add validates
// events with the same code as the real writer (same errors, same derived
// topic and key for the same Service and Topics) and records them when the
// function returns nil; an error or a panic records nothing, as a rollback
// would. Assert on what was recorded with [RequireEvent], [RequireEvents] and
// [RequireNoEvents], and decode a payload with [Payload]:
//
//	rec := outboxtest.NewRecorder(t, &outboxtest.RecorderConfig{UnitOfWork: unitofwork.Config{Service: "payment-service"}})
//	h := payments.Handler{UOW: rec}
//	if err := h.Capture(ctx, "p-1", 1250); err != nil {
//		t.Fatal(err)
//	}
//	ev := outboxtest.RequireEvent(t, rec, outboxtest.Want{Type: "payment.captured.v1", Key: "p-1"})
//	got := outboxtest.Payload[payments.Captured](t, ev)
//
// # Several outboxes, AddTx and transactions of your own
//
// A [Recorder] is also a [unitofwork.TxAdder] (AddTx) and starts
// transactions (Begin, so pgx.BeginFunc takes it). Give each outbox its own
// recorder, built from that outbox's configuration. Inside a recorder's Do,
// unitofwork.PgxTx(tx) returns the recorder's transaction as a pgx.Tx, and
// another recorder's AddTx on it validates the events with its own
// configuration (service, topic naming, limits) and records them in that
// recorder when the transaction commits, as docs/configuration.md's pattern does with
// two real outboxes:
//
//	payments := outboxtest.NewRecorder(t, &outboxtest.RecorderConfig{UnitOfWork: unitofwork.Config{Service: "payment-service"}})
//	audit := outboxtest.NewRecorder(t, &outboxtest.RecorderConfig{UnitOfWork: unitofwork.Config{Service: "audit"}})
//	h := &Handler{Payments: payments, Audit: audit} // a unitofwork.Doer and a unitofwork.TxAdder
//	...
//	outboxtest.RequireEvent(t, payments, outboxtest.Want{Type: "payment.created.v1"})
//	outboxtest.RequireEvent(t, audit, outboxtest.Want{Type: "entry.recorded.v1", Topic: "audit.entry.recorded"})
//
// AddTx refuses a pgx.Tx no recorder created ([ErrForeignTx]): test such
// code against PostgreSQL, below.
//
// The recorder's Tx has no database: its Exec, Query, QueryRow, CopyFrom
// and SendBatch fail with [ErrNoDB] unless [RecorderConfig.DB] names one to
// delegate to. A [RecordingDB] records the handler's SQL with neither a
// database nor a mock library, answers it as its rules say, and is
// asserted on with [RequireSQL], [RequireNoSQL] and [RequireRolledBack]:
//
//	db := &outboxtest.RecordingDB{}
//	rec := outboxtest.NewRecorder(t, &outboxtest.RecorderConfig{UnitOfWork: uc, DB: db})
//	...
//	outboxtest.RequireSQL(t, db, outboxtest.WantSQL{SQL: "INSERT INTO shipments", Args: []any{"o-1", "dhl"}})
//
// A pgx.Tx, a pool or a mock works too. Each Do begins a transaction on
// the DB (a savepoint on a pgx.Tx) and commits it when its function
// returns nil, or rolls it back when the function fails, so that a failed
// Do leaves none of its writes behind, as in production.
//
// # Tests against PostgreSQL
//
// [RequireInserted], [RequireManyInserted] and [RequireNotInserted] read the
// rows of an outbox table through the connection they are given. Which one
// sees the events depends on how they were written:
//
//   - UnitOfWork.Do inserts the events a function added just before it
//     commits, so they are visible, through the pool, once Do has returned
//     nil (and never inside the function itself).
//   - UnitOfWork.AddTx inserts them at once into the caller's transaction,
//     so a test can assert inside that transaction, passing the pgx.Tx, and
//     roll it back afterwards: nothing is committed.
//
// [Table] gives a test a fresh migrated outbox table of its own, dropped when
// the test ends.
//
// Every function reports failures through [T], which *testing.T satisfies,
// and stops the test (Fatalf) when an expectation is not met.
package outboxtest
