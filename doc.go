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
// [TopicPerAggregate]), the Kafka header names, and the errors callers match
// with errors.Is and errors.As. It imports no other package of the module.
package outbox
