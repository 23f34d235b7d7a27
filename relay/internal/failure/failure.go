// Package failure classifies the relay's failures: the low-cardinality
// error.type of an error (Type), the stable reason stored for a failed
// event (Reason), and which failures condemn a whole topic (TopicLevel).
// The relay and its producer (kafkaproducer) share it, so that a cause has
// one name wherever it is reported.
package failure

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fxoutbox/outbox/internal/dberr"
	"github.com/fxoutbox/outbox/internal/tablesql"
)

// ErrHeld is reported for a message not sent, or not marked, because an
// earlier event of its key failed in the same batch (or, from the
// producer, an earlier record of its partition was rejected). It is
// transient and not counted against the event. The relay exports it as
// relay.ErrHeld.
var ErrHeld = errors.New("relay: held behind a failed event of the same key")

// ErrCannotSend marks a message the relay refuses before sending: no retry
// can change it, so it is parked at once (unless the policy is Hold).
var ErrCannotSend = errors.New("cannot be sent")

// TopicLevel reports a permanent error that condemns every message to the
// topic, not one message: it is charged to each event without isolating
// it.
func TopicLevel(err error) bool {
	return KafkaTopicLevel(err) || errors.Is(err, ErrCannotSend)
}

// KafkaTopicLevel reports a broker error that condemns a whole topic: the
// topic is missing, its name invalid, or producing to it not authorized.
func KafkaTopicLevel(err error) bool {
	return errors.Is(err, sarama.ErrUnknownTopicOrPartition) || errors.Is(err, sarama.ErrInvalidTopic) ||
		errors.Is(err, sarama.ErrTopicAuthorizationFailed)
}

// The error.type values the relay reports (Type), on metrics (error.type), on
// failed publish spans and in its logs, and stores at the start of an
// event's last_error ("[kafka.message_too_large] the broker refused ...", see Reason). They name
// the cause, never a message, so the set stays small:
//
//	broker_unreachable   no connection to a broker: dial refused or timed out, DNS, connection
//	                     reset or closed, sarama's "out of brokers", I/O timeouts talking to it
//	authentication       SASL failed at the broker (wrong credentials or mechanism)
//	tls                  TLS handshake or certificate verification failed (x509)
//	kafka.<code>         the broker answered with a Kafka protocol error, by its protocol name in
//	                     lower case: kafka.message_too_large, kafka.unknown_topic_or_partition,
//	                     kafka.not_leader_or_follower, kafka.topic_authorization_failed, ...
//	invalid_topic        the relay refused to send: the topic name is not a valid Kafka topic
//	message_too_large    the relay refused to send: the record is over MaxMessageBytes
//	invalid_headers      the relay refused to send: the row's stored headers are not a JSON object of strings
//	configuration        the producer rejected its configuration (sarama.ConfigurationError)
//	held                 not sent or not marked: an earlier event of the same key failed in the batch
//	database.connection  PostgreSQL unreachable or the connection was lost (SQLSTATE 08, 57P01-57P03,
//	                     53300, dial and I/O errors)
//	database.timeout     a statement or the batch ran out of time (57014, 25P03, BatchTimeout)
//	database.authentication  the server refused the login (SQLSTATE 28)
//	database.permission  the relay's role lacks a privilege on the table (42501)
//	database.schema      the table or a column is missing: migrations not applied (42P01, 42703)
//	database.conflict    lock not available, deadlock or serialization failure (40, 55P03)
//	database.resources   the server is out of disk, memory or another resource (53)
//	database             any other database failure
//	timeout              a deadline ran out outside the database (BatchTimeout while publishing)
//	canceled             the relay was stopping and abandoned the operation
//	_OTHER               none of the above
//
// Database values appear only on errors of the relay's database steps
// (claim, mark, commit, cleanup, table statistics); an error that carries
// an ErrorType() string method (as semconv.ErrorType reads it) reports that
// value. docs/operating.md lists them for users.
const (
	BrokerUnreachable = "broker_unreachable"
	Authentication    = "authentication"
	TLS               = "tls"
	InvalidTopic      = "invalid_topic"
	MessageTooLarge   = "message_too_large"
	InvalidHeaders    = "invalid_headers"
	Configuration     = "configuration"
	Held              = "held"
	Database          = "database"
	Timeout           = "timeout"
	Canceled          = "canceled"
	Other             = tablesql.ErrorTypeOther
)

// Type classifies err by its cause into one of the low-cardinality values
// listed above; "" for nil. The relay uses it for metrics, spans, logs and
// the reasons it stores alike.
func Type(err error) string {
	if err == nil {
		return ""
	}
	var et interface{ ErrorType() string }
	if errors.As(err, &et) {
		if s := et.ErrorType(); s != "" {
			return s
		}
	}
	if errors.Is(err, ErrHeld) {
		return Held
	}
	if errors.Is(err, ErrCannotSend) {
		var tl TooLarge
		if errors.As(err, &tl) {
			return MessageTooLarge
		}
		if errors.As(err, new(BadHeaders)) {
			return InvalidHeaders
		}
		return InvalidTopic
	}
	if errors.Is(err, sarama.ErrSASLAuthenticationFailed) || errors.Is(err, sarama.ErrUnsupportedSASLMechanism) ||
		errors.Is(err, sarama.ErrIllegalSASLState) || errors.Is(err, sarama.ErrUnknownScramMechanism) {
		return Authentication
	}
	if isTLS(err) {
		return TLS
	}
	var kerr sarama.KError
	if errors.As(err, &kerr) {
		if name, ok := kafkaErrorNames[kerr]; ok {
			return "kafka." + name
		}
		return Other
	}
	var cerr sarama.ConfigurationError
	if errors.As(err, &cerr) {
		return Configuration
	}
	// A database error reaching here did not come through a database step
	// (e.g. a Publisher that writes to PostgreSQL): still name it.
	if t := dberr.PgType(err); t != "" {
		return t
	}
	switch {
	case errors.Is(err, sarama.ErrOutOfBrokers) || errors.Is(err, sarama.ErrNotConnected) ||
		errors.Is(err, sarama.ErrBrokerNotFound) || errors.Is(err, sarama.ErrClosedClient) || dberr.IsConnection(err):
		return BrokerUnreachable
	case errors.Is(err, context.DeadlineExceeded):
		return Timeout
	case errors.Is(err, context.Canceled):
		return Canceled
	}
	return Other
}

// DatabaseType classifies an error of one of the relay's database steps.
func DatabaseType(err error) string {
	if t := dberr.PgType(err); t != "" {
		return t
	}
	switch {
	case errors.Is(err, context.Canceled):
		return Canceled
	case errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err):
		return dberr.Timeout
	case dberr.IsConnection(err):
		return dberr.Connection
	}
	return Database
}

// isTLS reports a failed TLS handshake or certificate verification.
func isTLS(err error) bool {
	var (
		rh  tls.RecordHeaderError
		ae  tls.AlertError
		cve *tls.CertificateVerificationError
		ua  x509.UnknownAuthorityError
		he  x509.HostnameError
		ci  x509.CertificateInvalidError
		se  x509.SystemRootsError
	)
	return errors.As(err, &rh) || errors.As(err, &ae) || errors.As(err, &cve) || errors.As(err, &ua) ||
		errors.As(err, &he) || errors.As(err, &ci) || errors.As(err, &se)
}

// TooLarge is the relay's refusal of a record of Size bytes, over its
// MaxMessageBytes (Max).
type TooLarge struct{ Size, Max int }

func (e TooLarge) Error() string {
	return fmt.Sprintf("message of %d bytes exceeds MaxMessageBytes %d", e.Size, e.Max)
}

// BadHeaders is the relay's refusal of a row whose stored headers are not
// a JSON object of strings; its text is Err's.
type BadHeaders struct{ Err error }

func (e BadHeaders) Error() string { return e.Err.Error() }
func (e BadHeaders) Unwrap() error { return e.Err }

// DBStep marks Err as an error of one of the relay's database steps, so
// that Type (and semconv.ErrorType) name it by its database cause. Its text
// is Err's.
type DBStep struct{ Err error }

func (e *DBStep) Error() string     { return e.Err.Error() }
func (e *DBStep) Unwrap() error     { return e.Err }
func (e *DBStep) ErrorType() string { return DatabaseType(e.Err) }

// FromDatabase reports an error of a database step, or one from PostgreSQL
// or the connection to it.
func FromDatabase(err error) bool {
	return errors.As(err, new(*DBStep)) || dberr.Is(err)
}

// kafkaErrorNames are the Kafka protocol's names of its error codes
// (org.apache.kafka.common.protocol.Errors), lower case.
var kafkaErrorNames = map[sarama.KError]string{
	sarama.ErrUnknown:                            "unknown_server_error",
	sarama.ErrOffsetOutOfRange:                   "offset_out_of_range",
	sarama.ErrInvalidMessage:                     "corrupt_message",
	sarama.ErrUnknownTopicOrPartition:            "unknown_topic_or_partition",
	sarama.ErrInvalidMessageSize:                 "invalid_fetch_size",
	sarama.ErrLeaderNotAvailable:                 "leader_not_available",
	sarama.ErrNotLeaderForPartition:              "not_leader_or_follower",
	sarama.ErrRequestTimedOut:                    "request_timed_out",
	sarama.ErrBrokerNotAvailable:                 "broker_not_available",
	sarama.ErrReplicaNotAvailable:                "replica_not_available",
	sarama.ErrMessageSizeTooLarge:                "message_too_large",
	sarama.ErrStaleControllerEpochCode:           "stale_controller_epoch",
	sarama.ErrOffsetMetadataTooLarge:             "offset_metadata_too_large",
	sarama.ErrNetworkException:                   "network_exception",
	sarama.ErrOffsetsLoadInProgress:              "coordinator_load_in_progress",
	sarama.ErrConsumerCoordinatorNotAvailable:    "coordinator_not_available",
	sarama.ErrNotCoordinatorForConsumer:          "not_coordinator",
	sarama.ErrInvalidTopic:                       "invalid_topic_exception",
	sarama.ErrMessageSetSizeTooLarge:             "record_list_too_large",
	sarama.ErrNotEnoughReplicas:                  "not_enough_replicas",
	sarama.ErrNotEnoughReplicasAfterAppend:       "not_enough_replicas_after_append",
	sarama.ErrInvalidRequiredAcks:                "invalid_required_acks",
	sarama.ErrIllegalGeneration:                  "illegal_generation",
	sarama.ErrInconsistentGroupProtocol:          "inconsistent_group_protocol",
	sarama.ErrInvalidGroupId:                     "invalid_group_id",
	sarama.ErrUnknownMemberId:                    "unknown_member_id",
	sarama.ErrInvalidSessionTimeout:              "invalid_session_timeout",
	sarama.ErrRebalanceInProgress:                "rebalance_in_progress",
	sarama.ErrInvalidCommitOffsetSize:            "invalid_commit_offset_size",
	sarama.ErrTopicAuthorizationFailed:           "topic_authorization_failed",
	sarama.ErrGroupAuthorizationFailed:           "group_authorization_failed",
	sarama.ErrClusterAuthorizationFailed:         "cluster_authorization_failed",
	sarama.ErrInvalidTimestamp:                   "invalid_timestamp",
	sarama.ErrUnsupportedSASLMechanism:           "unsupported_sasl_mechanism",
	sarama.ErrIllegalSASLState:                   "illegal_sasl_state",
	sarama.ErrUnsupportedVersion:                 "unsupported_version",
	sarama.ErrTopicAlreadyExists:                 "topic_already_exists",
	sarama.ErrInvalidPartitions:                  "invalid_partitions",
	sarama.ErrInvalidReplicationFactor:           "invalid_replication_factor",
	sarama.ErrInvalidReplicaAssignment:           "invalid_replica_assignment",
	sarama.ErrInvalidConfig:                      "invalid_config",
	sarama.ErrNotController:                      "not_controller",
	sarama.ErrInvalidRequest:                     "invalid_request",
	sarama.ErrUnsupportedForMessageFormat:        "unsupported_for_message_format",
	sarama.ErrPolicyViolation:                    "policy_violation",
	sarama.ErrOutOfOrderSequenceNumber:           "out_of_order_sequence_number",
	sarama.ErrDuplicateSequenceNumber:            "duplicate_sequence_number",
	sarama.ErrInvalidProducerEpoch:               "invalid_producer_epoch",
	sarama.ErrInvalidTxnState:                    "invalid_txn_state",
	sarama.ErrInvalidProducerIDMapping:           "invalid_producer_id_mapping",
	sarama.ErrInvalidTransactionTimeout:          "invalid_transaction_timeout",
	sarama.ErrConcurrentTransactions:             "concurrent_transactions",
	sarama.ErrTransactionCoordinatorFenced:       "transaction_coordinator_fenced",
	sarama.ErrTransactionalIDAuthorizationFailed: "transactional_id_authorization_failed",
	sarama.ErrSecurityDisabled:                   "security_disabled",
	sarama.ErrOperationNotAttempted:              "operation_not_attempted",
	sarama.ErrKafkaStorageError:                  "kafka_storage_error",
	sarama.ErrLogDirNotFound:                     "log_dir_not_found",
	sarama.ErrSASLAuthenticationFailed:           "sasl_authentication_failed",
	sarama.ErrUnknownProducerID:                  "unknown_producer_id",
	sarama.ErrReassignmentInProgress:             "reassignment_in_progress",
	sarama.ErrDelegationTokenAuthDisabled:        "delegation_token_auth_disabled",
	sarama.ErrDelegationTokenNotFound:            "delegation_token_not_found",
	sarama.ErrDelegationTokenOwnerMismatch:       "delegation_token_owner_mismatch",
	sarama.ErrDelegationTokenRequestNotAllowed:   "delegation_token_request_not_allowed",
	sarama.ErrDelegationTokenAuthorizationFailed: "delegation_token_authorization_failed",
	sarama.ErrDelegationTokenExpired:             "delegation_token_expired",
	sarama.ErrInvalidPrincipalType:               "invalid_principal_type",
	sarama.ErrNonEmptyGroup:                      "non_empty_group",
	sarama.ErrGroupIDNotFound:                    "group_id_not_found",
	sarama.ErrFetchSessionIDNotFound:             "fetch_session_id_not_found",
	sarama.ErrInvalidFetchSessionEpoch:           "invalid_fetch_session_epoch",
	sarama.ErrListenerNotFound:                   "listener_not_found",
	sarama.ErrTopicDeletionDisabled:              "topic_deletion_disabled",
	sarama.ErrFencedLeaderEpoch:                  "fenced_leader_epoch",
	sarama.ErrUnknownLeaderEpoch:                 "unknown_leader_epoch",
	sarama.ErrUnsupportedCompressionType:         "unsupported_compression_type",
	sarama.ErrStaleBrokerEpoch:                   "stale_broker_epoch",
	sarama.ErrOffsetNotAvailable:                 "offset_not_available",
	sarama.ErrMemberIdRequired:                   "member_id_required",
	sarama.ErrPreferredLeaderNotAvailable:        "preferred_leader_not_available",
	sarama.ErrGroupMaxSizeReached:                "group_max_size_reached",
	sarama.ErrFencedInstancedId:                  "fenced_instance_id",
	sarama.ErrEligibleLeadersNotAvailable:        "eligible_leaders_not_available",
	sarama.ErrElectionNotNeeded:                  "election_not_needed",
	sarama.ErrNoReassignmentInProgress:           "no_reassignment_in_progress",
	sarama.ErrGroupSubscribedToTopic:             "group_subscribed_to_topic",
	sarama.ErrInvalidRecord:                      "invalid_record",
	sarama.ErrUnstableOffsetCommit:               "unstable_offset_commit",
	sarama.ErrThrottlingQuotaExceeded:            "throttling_quota_exceeded",
	sarama.ErrProducerFenced:                     "producer_fenced",
	sarama.ErrInvalidUpdateVersion:               "invalid_update_version",
}
