// Package faulttest holds fault-injection tests that run the relay against a
// real Apache Kafka broker and crash that broker: a SIGKILL while the relay
// publishes and writers commit, followed by a restart on the same data
// directory; and a broker that is down when the relay starts.
//
// The broker-crash tests run only with OUTBOX_TEST_REAL_KAFKA=1 (make test-kafka sets it)
// and need DATABASE_URL and what scripts/kafka.sh needs (Java 17+, Maven the
// first time). They leave the broker in KAFKA_BROKERS alone, because the
// other packages' tests use it at the same time: they run a broker of their
// own through scripts/kafka.sh, with KAFKA_STATE_DIR=<repo>/.cache/kafka-faulttest
// on 127.0.0.1:29192 (controller 29193, below the ephemeral port range; OUTBOX_FAULTTEST_KAFKA_PORT moves
// both), crash it with `scripts/kafka.sh kill`, restart it with
// `scripts/kafka.sh up`, and destroy it when the package's tests end.
//
// The other fault tests break something else and need no broker of their
// own, so they also run in make test (KAFKA_BROKERS: the development broker
// there, Apache Kafka under make test-kafka):
//
//   - TestRelayKilledBetweenAckAndCommit: a relay process (the test binary
//     re-executed as TestHelperRelayProcess) SIGKILLs itself between a
//     batch's Kafka ack and its commit; a fresh relay finishes the job.
//   - TestFrozenRelayLosesItsLanes: a relay process is SIGSTOPped while it
//     holds a batch; a second relay publishes the other lanes at once and
//     the frozen relay's lanes once PostgreSQL ends its idle transaction.
//   - TestRelaySurvivesPostgresRestart: PostgreSQL restarts under a relay
//     with Listen and writers; the cluster is the tests' own, run by
//     scripts/pg.sh in <repo>/.cache/pg-faulttest on 127.0.0.1:55433
//     (OUTBOX_FAULTTEST_PG_PORT; a free port when 55433 is taken).
//   - TestOrdersServiceSIGTERMLosesNothing: the example service
//     (examples/cmd/orders, built by the test) gets SIGTERM under load, on its
//     own development broker (examples/cmd/devkafka on a free port).
//   - TestRelayProcessesKilledEveryHalfSecond: three relay processes on a
//     40k backlog with writers on, one SIGKILLed every 0.5 s for 10 s
//     (OUTBOX_FAULTTEST_KILL_FOR) and replaced; each kill may repeat the
//     batch it cut.
//   - TestRelaySurvivesPostgresCrash: the tests' own PostgreSQL cluster
//     crashed (pg_ctl stop -m immediate) while two relays drain a 60k
//     backlog; the batches' asynchronous commits of the crash's last
//     moments are lost with it, and only what the relays delivered then may
//     come twice.
//   - TestFrozenRelayHoldsOnlyItsLanes: a relay process SIGSTOPped in its
//     first batch holds back only the lanes of the rows it claimed: a new
//     key in another lane is published at once by a second relay.
//
// TestBrokerCrashMidDrainKeepsKeyOrder (real broker only) SIGKILLs the
// broker three times while two relays drain a 60k-event backlog and checks
// each key's first deliveries; OUTBOX_FAULTTEST_DRAIN_ROUNDS=N repeats it.
//
// TestBrokerOutage30sParksNothing (real broker only) keeps the broker down
// for 30 s and checks that nothing was charged an attempt or parked.
//
// TestPoisonRequeuedRightAfterFix (real broker only) parks the events of a
// topic that does not exist, creates it and requeues them at once
// (admin.Requeue): every one is delivered, none parked again.
//
// On a three-node cluster of its own (real broker only, three JVMs on
// 127.0.0.1:29292-29297, OUTBOX_FAULTTEST_CLUSTER_PORT moves the six
// ports), TestBelowMinISRParksNothing keeps a topic below its
// min.insync.replicas (3, one node SIGKILLed for 20 s) and
// TestLeaderKillsKeepPerKeyOrder SIGKILLs the node leading most partitions
// three times (OUTBOX_FAULTTEST_KILLS).
//
// The streaming relay (relay.Stream) has four: on the tests' own
// PostgreSQL cluster, TestStreamSlotInvalidatedResumesFromTheTable (with
// marks and with cursor progress: the server invalidates the slot while the
// relay is stopped, max_slot_wal_keep_size 1MB for the test, reset after;
// the relay drops the lost slot, publishes from the table by polling from
// its last checkpoint, and streams from a new slot, counting the loss
// once), TestStreamSlotInvalidatedCountedOnce (a relay whose role may not
// call pg_drop_replication_slot meets the lost slot again every
// RetryInterval and counts it once, then delivers every event) and
// TestStreamSurvivesPostgresCrash (pg_ctl stop -m immediate under load);
// with the package's broker (real broker only),
// TestStreamBrokerOutageConfirmsNothingUnpublished (the position the relay
// confirms never passes the WAL position at which the broker died). Each
// runs exactly once too (see below).
//
// # Exactly once
//
// OUTBOX_TEST_DELIVERY=exactly-once runs every relay of the battery (in this
// process, the re-exec'd relay processes, the orders service of the SIGTERM
// test) with relay.ExactlyOnce, the streaming tests' relays included: they
// run under cursor progress whatever OUTBOX_TEST_PROGRESS says (exactly-once
// streaming records cursor progress only), and the marks variant of
// TestStreamSlotInvalidatedResumesFromTheTable runs at least once, saying
// so. The checks then wait until no
// Kafka transaction is open on the topic, require every committed event
// read_uncommitted (aborted records included), and read the topic
// read_committed allowing zero duplicates, with nothing lost and each key's
// events in write order. An exactly-once relay never calls its publisher,
// so the relay process's hooks sit in its database there: at the statement
// marking a batch's rows published, which follows the batch's Kafka commit
// ("kill": SIGKILL between the Kafka commit and the mark; "freeze": a
// committed batch held). Unset, everything runs at least once, as before.
//
// Five scenarios run exactly once whatever OUTBOX_TEST_DELIVERY says (real
// broker only, on the package's broker), each checked as above and also
// read_committed by Apache Kafka's console consumer
// (testenv.ConsoleConsume, --isolation-level read_committed):
//
//   - TestExactlyOnceRelaysKilledAfterCommit: four relay processes, each
//     SIGKILLing itself between a batch's Kafka commit and its mark after
//     1-3 batches, restarted for 8 s (tens of kills); the lanes' next
//     owners read the progress back.
//   - TestExactlyOnceFrozenRelayIsFenced: a relay process SIGSTOPped with a
//     transaction open (records written, the last stable offset behind),
//     kept frozen past its lease while another relay publishes everything,
//     then woken: its stale batch must fail and nothing it sent commits.
//   - TestExactlyOnceBrokerKills: the broker SIGKILLed twice while two
//     relays drain a backlog with writers on.
//   - TestExactlyOnceLastStableOffsetStall: a relay process SIGKILLed with a
//     transaction open, alone (the broker aborts it after the relay's
//     TransactionTimeout, 10 s, plus its cleanup interval, 1 s with
//     scripts/kafka.sh) and next to another relay (which takes the lanes and
//     fences their owner, aborting it at once); it logs how long read_committed consumers were
//     held back and asserts only TransactionTimeout + 1 s + 5 s.
//   - TestExactlyOncePostgresCrash: the tests' own PostgreSQL cluster
//     crashed (pg_ctl stop -m immediate) while two relays drain a backlog,
//     no writer on (so no other commit flushes the relays' marks).
//
// # Cursor progress
//
// OUTBOX_TEST_PROGRESS=cursor runs every polling, per-key, at-least-once
// relay of the battery with relay.ProgressCursor: in this process, the
// re-exec'd relay processes (FAULTTEST_HELPER_PROGRESS) and the orders
// service of the SIGTERM test (OUTBOX_PROGRESS=cursor, whose
// OUTBOX_MIGRATE=true applies the cursor migration; the test checks that
// the service's table ended in cursor mode). Each world's table gets
// migrations.Cursor.Up before any event is written. The relay refuses cursor
// progress with exactly-once delivery and with streaming, so the
// exactly-once scenarios, the streaming ones, and every scenario under
// OUTBOX_TEST_DELIVERY=exactly-once, run with marks as without the
// variable, and log that the cursor variant is skipped.
//
// Rows are never marked then, so the checks read the lanes' positions:
// "waiting" is admin.ReadStatus's backlog (tablesql.ReadCounts) plus the
// parked rows, "published" the rows less those, in one snapshot, and the
// per-row conditions (the frozen relay's rows, the killed batch) are
// tablesql.Delivered (the lane's done snapshot holds the row) or the row
// delivered in its lane's open window, as the backlog counts it (a window
// whose last batch stopped at its limit stays open until its lane's next
// event, so Delivered alone may never count every row). The relay
// process's hooks sit at the statement that saves a batch's lanes'
// positions ("UPDATE <table>_cursor c SET done = ..."), which follows the
// batch's Kafka ack in its transaction and precedes its commit, as the
// mark does with marks: "KILL" there loses the save, "HOLDING" holds it,
// "STALE" reports how the late save went (the session is gone). Once
// everything is delivered, check also requires that no row was marked nor
// written after its INSERT, and that the backlog is 0.
//
// OUTBOX_FAULTTEST_SARAMA_LOG=1 sends sarama's own log to stderr, to watch
// the producer through the crash.
package faulttest
