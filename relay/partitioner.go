package relay

import (
	"reflect"
	"strconv"
	"strings"

	"github.com/IBM/sarama"

	"github.com/fxoutbox/outbox"
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
// In a sarama configuration of your own, set Producer.Partitioner to
// p.Sarama() (relay.DefaultSaramaConfig sets Murmur2's).
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

// partitioners lists the Partitioner values with their names and sarama's
// constructors.
var partitioners = []struct {
	p    Partitioner
	name string
	c    sarama.PartitionerConstructor
}{
	{Murmur2, "murmur2", sarama.NewMurmur2Partitioner},
	{FNV1a, "fnv1a", sarama.NewHashPartitioner},
	{CRC32, "crc32", sarama.NewConsistentCRCHashPartitioner},
}

// PartitionerNames is how ParsePartitioner and the errors about a
// partitioner list the accepted names.
const PartitionerNames = `"murmur2" (the default: Apache Kafka's Java client, kafkajs), "fnv1a" (sarama's; fxoutbox's before murmur2) or "crc32" (librdkafka's)`

// String returns the name ParsePartitioner accepts: "murmur2", "fnv1a" or
// "crc32"; "default" for the zero value.
func (p Partitioner) String() string {
	if p == 0 {
		return "default"
	}
	for _, x := range partitioners {
		if x.p == p {
			return x.name
		}
	}
	return "Partitioner(" + strconv.Itoa(int(p)) + ")"
}

// Sarama returns sarama's constructor of the partitioner, for
// sarama.Config.Producer.Partitioner; Murmur2's for the zero value, nil for
// an invalid Partitioner.
func (p Partitioner) Sarama() sarama.PartitionerConstructor {
	if p == 0 {
		p = Murmur2
	}
	for _, x := range partitioners {
		if x.p == p {
			return x.c
		}
	}
	return nil
}

// Valid reports whether p is the zero value or one of the constants.
func (p Partitioner) Valid() bool { return p == 0 || p.Sarama() != nil }

// ParsePartitioner returns the Partitioner named s ("murmur2", "fnv1a" or
// "crc32", in any case), or a *outbox.ConfigError listing the names.
func ParsePartitioner(s string) (Partitioner, error) {
	for _, x := range partitioners {
		if strings.EqualFold(strings.TrimSpace(s), x.name) {
			return x.p, nil
		}
	}
	return 0, &outbox.ConfigError{Field: "Partitioner", Reason: strconv.Quote(s) + " is not " + PartitionerNames}
}

// PartitionerOf tells which Partitioner a sarama partitioner constructor
// is: ok is false for nil and for any constructor but the three that
// Partitioner.Sarama returns (a partitioner of your own, sarama's random,
// round-robin, manual or reference-hash ones).
func PartitionerOf(c sarama.PartitionerConstructor) (p Partitioner, ok bool) {
	if c == nil {
		return 0, false
	}
	// Top-level functions: equal code pointers are the same function.
	ptr := reflect.ValueOf(c).Pointer()
	for _, x := range partitioners {
		if reflect.ValueOf(x.c).Pointer() == ptr {
			return x.p, true
		}
	}
	return 0, false
}
