// Package inbox is the consume side of the outbox: a Kafka consumer group
// whose records are applied once per consumer, each in the consumer's own
// PostgreSQL transaction, on the producer's trace.
//
//	c, err := inbox.New(pool, uow, &inbox.Config{
//		Group:   "billing",
//		Brokers: []string{"kafka:9092"},
//		Routes: []inbox.Route{{
//			Topic: "order-service.order.confirmed",
//			Handler: func(ctx context.Context, tx unitofwork.Tx, m *inbox.Message) error {
//				_, err := tx.Exec(ctx, `INSERT INTO invoices (order_id) VALUES ($1)`, string(m.Key))
//				return err
//			},
//		}},
//	})
//	err = c.Start(ctx)
//	defer c.Stop(ctx)
//
// For each record the consumer starts a process span (its parent is the
// trace context the record carries, when it carries one), begins a
// transaction through the unit of work and inserts (consumer name, event
// id) into the inbox table with ON CONFLICT DO NOTHING, both in one round
// trip ([unitofwork.UnitOfWork.DoBatch]), and skips the record if the row
// existed; otherwise it calls the handler with the transaction (a
// unitofwork.Tx: events the handler adds commit with it and continue the
// trace) and commits. A record so costs the round trips of the handler's
// own transaction (BEGIN, its statements, COMMIT) and none for the inbox
// row. Only then is the record's offset marked; sarama
// commits marked offsets every second and when the partition is released.
//
// Guarantees, for each consumer name (Config.Name, default the group):
//
//   - Once: a handler's committed effects happen once per event id across
//     redeliveries, crashes (between the database commit and the offset
//     commit the record is redelivered and skipped), offset resets and
//     rebalances. Deduplication is on the x-event-id header, never on
//     offsets: a re-sent event has new offsets. While the old and the new
//     owner of a partition both hold a record for a moment, the second
//     insert of its inbox row waits for the first transaction, then skips
//     (or applies, if the first rolled back).
//   - Order: records of one key are applied one at a time in partition
//     order. Records of different keys in one partition are applied in
//     parallel (Config.Concurrency per partition: an idle worker takes the
//     next record whose key has no earlier record in progress or waiting,
//     so distinct keys run in parallel whatever they hash to); the
//     committed offset never passes a record that is neither applied,
//     skipped nor parked.
//   - Nothing lost: a record whose transaction did not commit is never
//     marked; it is retried, or left to the partition's next owner.
//
// Side effects outside the transaction (HTTP calls) are not covered: they
// repeat when a try rolls back. Record an event with tx.Add instead.
//
// Batches: with Config.BatchSize above 1, a worker applies the records
// that are ready when it takes one (of distinct keys, up to BatchSize) in
// one transaction: their inbox rows in one INSERT sent with BEGIN, then
// each new record's handler in offset order on the same tx, with its own
// ctx and span, then one COMMIT. Nothing waits for a batch to fill. If
// anything in the batch fails, it all rolls back and each record is
// applied alone, as without batching; the guarantees above hold either
// way. Use it when handlers allow their writes to commit with other
// records' writes, and records queue up: it saves the per-transaction
// costs (round trips, commits), not the inbox row.
//
// Failures: a transient failure (the database unreachable or restarting,
// serialization failure 40001, deadlock 40P01, timeouts, a try that
// outlives Config.TryTimeout, an error wrapped with [Transient]) rolls back
// and is retried with backoff (Config.MinBackoff to MaxBackoff) without
// counting against the record, however long it lasts. A handler panic
// counts as a handler error.
// Failures of the inbox's own statements and of the commit are always
// transient. Any other handler error counts as an attempt; after
// Config.MaxAttempts the record is parked (Config.Poison = Park, the
// default): stored in <table>_parked with its key, value, headers, reason
// and attempts, together with its inbox row, and its partition moves on.
// With Hold it is retried forever and its key waits. [outbox.Permanent] parks at
// once. Attempts are counted in memory: a restart starts them again.
// Parked records are listed, retried and deleted with [Consumer.List],
// [Consumer.Retry] and [Consumer.Delete].
// With Config.DeadLetterTopic, the transaction that parks a record also
// records an outbox event to that topic ([DeadLetterEventType], payload
// [DeadLetter]), so a dead letter exists exactly when the parked row does.
//
// Records of other producers that are CloudEvents in the binary content
// mode of the Kafka protocol binding (headers ce_id and ce_source, no
// x-event-id) are deduplicated on their CloudEvents identity, source and id
// ([CloudEventID]), and routed by ce_type when they have no x-event-type.
// Other records without x-event-id are parked with [ErrNoEventID], unless
// Config.Identity gives them one: [EventIDOrPosition] uses
// "<topic>/<partition>/<offset>". Records whose x-event-type no route takes
// are skipped (Config.ParkUnrouted parks them).
//
// Transactions: the default DefaultSaramaConfig reads committed
// (sarama.ReadCommitted). The records of an aborted Kafka transaction were
// never sent, by the producer's account: those of a batch the relay's
// exactly-once mode aborted (it publishes the batch again, with the same
// event ids) and those of any other transactional producer that aborted are
// never delivered, so never applied. While a transaction is open, its
// partitions' records from its first one on wait until it ends: a producer
// that died holds them for its transaction timeout plus the broker's
// transaction.abort.timed.out.transaction.cleanup.interval.ms. Set
// Config.Sarama.Consumer.IsolationLevel to sarama.ReadUncommitted to read
// every record at once, aborted ones included; a Sarama configuration of
// your own keeps the level it has (sarama.NewConfig's is ReadUncommitted).
// ReadCommitted needs Sarama.Version 0.11 or later (New refuses it below).
//
// Rebalances and stopping: when a partition is revoked, its session ends,
// or Stop is called, the consumer starts no new record of it; records in
// progress get Config.DrainTimeout to commit, then their transactions are
// cancelled and roll back, and ConsumeClaim returns. The default
// DefaultSaramaConfig keeps Consumer.Group.Rebalance.Timeout (20s) below
// Net.ReadTimeout (30s): sarama waits for a JoinGroup answer only the read
// timeout, and a larger rebalance timeout makes a group whose members were
// killed rejoin in a loop (IBM/sarama#2820). Static membership
// (group.instance.id) keeps a stopped member in the group until its session
// times out; its partitions wait that long.
//
// Retention: inbox rows older than Config.Retention (default 30 days) are
// deleted in batches of 1000 every CleanupInterval. Keep it longer than the
// topics' retention plus the longest offset reset you may do: a record
// redelivered after its row is gone is applied again.
//
// Telemetry: one span per record, "process <topic>", kind consumer, with
// messaging.system=kafka, messaging.destination.name,
// messaging.destination.partition.id, messaging.kafka.offset,
// messaging.message.id, messaging.consumer.group.name; the metrics named by
// the Metric constants; logs through Config.Logger with the consumer, topic,
// partition and offset of each failure. [Consumer.Health] is for readiness
// probes.
//
// Guarantees, settings and operating parked records: [the inbox guide].
//
// [the inbox guide]: https://github.com/fxoutbox/outbox/blob/main/docs/inbox.md
package inbox
