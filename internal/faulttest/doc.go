// Package faulttest holds fault-injection tests that run the relay against a
// real Apache Kafka broker and crash that broker: a SIGKILL while the relay
// publishes and writers commit, followed by a restart on the same data
// directory; and a broker that is down when the relay starts.
//
// The tests run only with OUTBOX_TEST_REAL_KAFKA=1 (make test-kafka sets it)
// and need DATABASE_URL and what scripts/kafka.sh needs (Java 17+, Maven the
// first time). They leave the broker in KAFKA_BROKERS alone, because the
// other packages' tests use it at the same time: they run a broker of their
// own through scripts/kafka.sh, with KAFKA_STATE_DIR=<repo>/.cache/kafka-faulttest
// on 127.0.0.1:39192 (controller 39193; OUTBOX_FAULTTEST_KAFKA_PORT moves
// both), crash it with `scripts/kafka.sh kill`, restart it with
// `scripts/kafka.sh up`, and destroy it when the package's tests end.
//
// OUTBOX_FAULTTEST_SARAMA_LOG=1 sends sarama's own log to stderr, to watch
// the producer through the crash.
package faulttest
