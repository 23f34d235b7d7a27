// Package relay is the publish side of the outbox: it claims unpublished
// rows, publishes them to Kafka and records their delivery, in one short
// database transaction per batch.
//
//	pub, err := relay.NewSaramaPublisher(brokers, relay.DefaultSaramaConfig())
//	r, err := relay.New(pool, pub, &relay.Config{})
//	err = r.Start(ctx) // and r.Stop(ctx) on shutdown; r.Health(ctx, maxAge) for readiness
//
// # The loop
//
// A started [Relay] runs Workers goroutines (1). Each batch claims up to
// BatchSize events (50), publishes them through its [Publisher] (acks=all,
// idempotent: see [NewSaramaPublisher]), marks the acknowledged ones
// published and commits. While events wait it claims the next batch at
// once, twice as large after a full one, up to MaxBatchSize (500; 5000
// under ExactlyOnce, whose batches are Kafka transactions); once
// caught up it waits for its ticker (PollInterval, 500ms) or a wake-up:
// [Relay.Wake], which the fxoutbox module calls when an in-process unit of
// work commits, or, with Listen, a NOTIFY from writers in other processes.
// [Relay.RunOnce] runs one batch without the loop.
//
// # Order per key, with many replicas
//
// Several relays, in one process or many, may share a table. Under the
// default [PerKey] ordering partition keys hash into Lanes (64); a claim
// takes transaction-scoped advisory locks on lanes no other relay holds
// and then, in a new statement, reads those lanes' events in id order. One
// relay at a time publishes a lane and sees everything the previous holder
// marked, so each key's first deliveries keep write order through crashes.
// [Unordered] uses the classic FOR UPDATE SKIP LOCKED claim instead.
//
// # Modes
//
// Mode [Stream] follows the table's committed inserts in a logical
// replication slot (pgoutput) instead of polling, through the same publish
// path; see [Streaming from the WAL]. Delivery [ExactlyOnce] makes each batch
// one Kafka transaction with a progress record per lane (streaming: with the
// stream's record), so each event reaches each read_committed consumer once;
// see [Exactly once]. Progress
// [ProgressCursor] records each lane's position once per batch instead of
// marking every event; see [Cursor progress].
//
// # Failures
//
// A batch that fails as a whole (database, broker unavailable) charges
// nothing and backs off exponentially with jitter, up to MaxBackoff. A
// failure of single events holds back only those events and their keys,
// retried with paced backoff while every other key flows. Events the relay
// cannot read or send, that the broker refuses sent alone, or whose topic
// does not exist are parked ([outbox.Park]) at once; other permanent
// failures after MaxAttempts (5); under [outbox.Hold] nothing is parked. A
// parked event keeps its row (parked_at set) under ProgressMarks; under
// ProgressCursor it moves to the table <name>_parked, with its reason,
// attempts, first and last try, in the transaction that moves its lane past
// it. Package admin and the outboxctl command list, requeue and delete
// parked events. Each batch runs under
// BatchTimeout (30s); published rows are deleted after Retention (72h).
//
// # Observability
//
// Each event gets a "publish <topic>" producer span whose parent is the
// trace stored with the event, and its context travels in the traceparent
// header. The relay exports the OpenTelemetry messaging client metrics and
// its own (see [MetricPublished] and the constants beside it): published
// events, errors by cause, step durations, latency, and the table-wide
// backlog, oldest age and parked events, reported by one relay per table.
// [Relay.Health] serves readiness probes. [Operating] lists every metric as
// Prometheus names it, with alert rules and a dashboard; logs never carry
// payloads or header values.
//
// [Streaming from the WAL]: https://github.com/fxoutbox/outbox/blob/main/docs/streaming.md
// [Exactly once]: https://github.com/fxoutbox/outbox/blob/main/docs/exactly-once.md
// [Cursor progress]: https://github.com/fxoutbox/outbox/blob/main/docs/progress.md
// [Operating]: https://github.com/fxoutbox/outbox/blob/main/docs/operating.md
package relay
