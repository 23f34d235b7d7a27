// Package unitofwork is the write side of the outbox: one PostgreSQL
// transaction holds a handler's business statements and the events they
// produce, so an event exists if and only if its business change committed.
//
//	err := uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
//		if _, err := tx.Exec(ctx, `UPDATE orders SET status = 'confirmed' WHERE id = $1`, id); err != nil {
//			return err
//		}
//		return tx.Add(ctx, outbox.Event{AggregateType: "order", AggregateID: id, Type: "order.confirmed.v1", Payload: p})
//	})
//
// Add validates each event at once (an invalid event fails the handler, with
// an error naming the field) and buffers it; Do writes all buffered events
// with one multi-row INSERT just before COMMIT, so a transaction pays one
// extra round trip however many events it records. An error or a panic in
// the function rolls everything back: no event survives.
//
// Every event carries the W3C trace context of the ctx passed to Add
// (through the configured OpenTelemetry propagator, W3C by default), so the relay's publish
// span and the Kafka consumer continue the trace of the request that wrote it.
//
// Ordering: events of one key are published in the order their rows were
// inserted, and Kafka keeps that order per key within a topic. Writers that
// change the same aggregate concurrently must lock it (SELECT ... FOR
// UPDATE) inside Do, as they would to keep the business data consistent;
// then its events are inserted and committed in order. With the default
// per-event topics (outbox.TopicPerEvent) two event types of one aggregate
// go to two topics, and a consumer of both may see them in either order;
// choose outbox.TopicPerAggregate when a consumer needs one aggregate's
// events in order across types.
//
// Statements that start every transaction of a kind (a consumer's inbox
// row, a lock on the aggregate) can travel with BEGIN in one round trip:
// [UnitOfWork.DoBatch] is Do with a pgx.Batch sent together with BEGIN.
//
// Teams with their own transaction helpers call [UnitOfWork.AddTx] with the
// pgx.Tx they manage. With an OnCommit hook and a *pgxpool.Pool, a commit
// watcher calls the hook once that transaction commits, so the relay is
// woken as after Do (see [UnitOfWork.AddTx]); [UnitOfWork.Close] stops it.
//
// Several outbox tables in one transaction: each table has its own
// UnitOfWork; run Do on one and add to the others with AddTx on the
// transaction's pgx.Tx ([PgxTx]):
//
//	err := orders.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
//		if err := tx.Add(ctx, orderPlaced); err != nil {
//			return err
//		}
//		return audit.AddTx(ctx, unitofwork.PgxTx(tx), auditEntry)
//	})
//
// Both tables' events commit or roll back together, and each UnitOfWork's
// OnCommit runs after the commit.
//
// Handlers that depend on the [Doer] and [TxAdder] interfaces rather than
// on *UnitOfWork can be unit tested without a database: package outboxtest
// provides a recorder that implements both (one per outbox, the second's
// AddTx joining the first one's transaction through PgxTx) and assertions
// on the events recorded.
//
// How to write such tests: [Testing your handlers].
//
// [Testing your handlers]: https://github.com/fxoutbox/outbox/blob/main/docs/testing.md#testing-your-handlers
package unitofwork
