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
// OUTBOX_FAULTTEST_SARAMA_LOG=1 sends sarama's own log to stderr, to watch
// the producer through the crash.
package faulttest
