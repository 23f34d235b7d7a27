// Package cloudevents holds no code: its tests check, with the CloudEvents
// Go SDK (github.com/cloudevents/sdk-go/v2 and its Kafka binding
// protocol/kafka_sarama), a decoder the outbox did not write, that the
// relay's records in CloudEvents binary mode (OUTBOX_CLOUDEVENTS=binary) are
// valid CloudEvents carrying what was written, and that the inbox applies
// the SDK's own records once. The SDK is a dependency of this examples
// module only, never of the library.
package cloudevents
