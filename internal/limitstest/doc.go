// Package limitstest proves on real parts that what the unit of work accepts
// is exactly what PostgreSQL stores and the relay can send:
//
//   - the payload rules of record.Prepare (the writers' validator) (jsonb's input rules and the length
//     of jsonb's text output) agree with PostgreSQL 15 on a corpus of tricky
//     and randomly generated payloads;
//   - payloads PostgreSQL refuses, or that expand beyond the limits once
//     stored, are refused at Add with outbox.ErrInvalidEvent;
//   - the largest event Add accepts with the default limits reaches Kafka
//     through a relay with its defaults (and through the fxoutbox module),
//     byte for byte, and one byte more is refused at Add.
//
// It needs DATABASE_URL and KAFKA_BROKERS; run it against Apache Kafka with
// KAFKA_BROKERS=127.0.0.1:39092 as well as against kfake.
package limitstest
