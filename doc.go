// Package outbox is the shared vocabulary of fxoutbox, a transactional outbox
// for uber-go/fx services on PostgreSQL (pgx/v5) and Kafka (IBM/sarama).
//
// A business write and its domain event commit in one PostgreSQL transaction
// (package unitofwork); a relay publishes committed events to Kafka afterwards
// (package relay); package fxoutbox wires both into an fx application; package
// migrations creates the table they share.
//
// This package holds what both sides agree on: the [Event] a handler records,
// the [Table] it lives in, how a topic name is derived ([TopicPerEvent],
// [TopicPerAggregate]), the Kafka header names, the [Limits] an event must
// fit, and the errors callers match with errors.Is and errors.As. It imports
// no other public package of the module (only internal/textcut, which
// shortens values quoted in its errors).
//
// The writers (unitofwork's Tx.Add, outboxtest's recorder) accept exactly
// the payloads PostgreSQL's jsonb accepts and size them as jsonb prints
// them, which is what the relay reads back and sends. One size rule serves
// both sides: the Kafka record an event becomes is counted the same way,
// the unit of work refuses events over
// Limits.MaxRecordBytes and the relay parks messages over its
// MaxMessageBytes, both [DefaultMaxRecordBytes] (the broker's default
// message.max.bytes) unless set.
package outbox
