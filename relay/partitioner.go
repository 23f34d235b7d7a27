package relay

import (
	"strconv"

	"github.com/fxoutbox/outbox/internal/partitioner"
)

// Partitioner names the hash with which a SaramaPublisher maps a record key
// to one of its topic's partitions: hash(key) modulo the topic's partition
// count, over all its partitions, so that every event of a key lands on the
// same partition and keeps its order. Producers that write the same keys to
// the same topics must use the same hash, or a key is split over two
// partitions and its consumers can see its events out of order.
//
// The zero value is no choice: where a Partitioner is a setting (the
// fxoutbox module's Config.Partitioner) it means the default, Murmur2.
// In a sarama configuration of your own, set Producer.Partitioner to the
// sarama constructor each constant names (relay.DefaultSaramaConfig sets
// Murmur2's).
type Partitioner int

const (
	// Murmur2 is the default partitioner of Apache Kafka's Java client (and
	// of Kafka Streams, ksqlDB and the tools built on it), of kafkajs 2.x,
	// and librdkafka's "murmur2_random" for keys: (murmur2(key) &
	// 0x7fffffff) % partitions, seed 0x9747b28c; an empty key is hashed like
	// any other, as the Java client does. It is sarama's
	// NewMurmur2Partitioner. The default.
	Murmur2 Partitioner = iota + 1
	// FNV1a is sarama's default, sarama.NewHashPartitioner: the 32-bit
	// FNV-1a hash of the key, taken as a signed number, modulo partitions,
	// its sign dropped. fxoutbox used it before Murmur2 became the default:
	// keep it for topics whose keys must stay on the partitions they have
	// (see "Changing the partitioner" in docs/configuration.md).
	FNV1a
	// CRC32 is librdkafka's "consistent" partitioner, and its default
	// "consistent_random" for non-empty keys (confluent-kafka-go,
	// confluent-kafka-python, node-rdkafka with their defaults): the CRC-32
	// (IEEE) of the key, unsigned, modulo partitions; an empty key goes to
	// partition 0 (consistent_random picks a random one). It is sarama's
	// NewConsistentCRCHashPartitioner.
	CRC32
)

// String returns the partitioner's name: "murmur2", "fnv1a" or "crc32"
// (as OUTBOX_PARTITIONER spells it); "default" for the zero value.
func (p Partitioner) String() string {
	if p == 0 {
		return "default"
	}
	if name, ok := partitioner.Name(int(p)); ok {
		return name
	}
	return "Partitioner(" + strconv.Itoa(int(p)) + ")"
}
