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
//
// TestBrokerCrashMidDrainKeepsKeyOrder (real broker only) SIGKILLs the
// broker three times while two relays drain a 60k-event backlog and checks
// each key's first deliveries; OUTBOX_FAULTTEST_DRAIN_ROUNDS=N repeats it.
//
// TestBrokerOutage30sParksNothing (real broker only) keeps the broker down
// for 30 s and checks that nothing was charged an attempt or parked.
//
// The streaming relay (relay.Stream) has three: on the tests' own
// PostgreSQL cluster, TestStreamSlotInvalidatedFallsBackToPolling (the
// server invalidates the slot: max_slot_wal_keep_size 1MB for the test,
// reset after; the relay publishes by polling, then streams from a new slot
// once the old one is dropped) and TestStreamSurvivesPostgresCrash (pg_ctl
// stop -m immediate under load); with the package's broker (real broker
// only), TestStreamBrokerOutageConfirmsNothingUnpublished (the position the
// relay confirms never passes the WAL position at which the broker died).
//
// # Exactly once
//
// OUTBOX_TEST_DELIVERY=exactly-once runs every relay of the battery (in this
// process, the re-exec'd relay processes, the orders service of the SIGTERM
// test) with relay.ExactlyOnce; the streaming tests stay at least once (the
// streaming relay has no exactly-once mode). The checks then wait until no
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
// OUTBOX_FAULTTEST_SARAMA_LOG=1 sends sarama's own log to stderr, to watch
// the producer through the crash.
package faulttest
