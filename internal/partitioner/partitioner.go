// Package partitioner maps relay.Partitioner's values to their names and
// to sarama's partitioner constructors, for the relay, the fxoutbox module
// and the reading of OUTBOX_PARTITIONER. A value is relay.Partitioner's
// number: 1 murmur2, 2 fnv1a, 3 crc32; 0 is no choice (murmur2).
package partitioner

import (
	"reflect"
	"strings"

	"github.com/IBM/sarama"
)

// hashes are the partitioners by value (index 0 unused).
var hashes = []struct {
	name string
	c    sarama.PartitionerConstructor
}{
	{},
	{"murmur2", sarama.NewMurmur2Partitioner},
	{"fnv1a", sarama.NewHashPartitioner},
	{"crc32", sarama.NewConsistentCRCHashPartitioner},
}

// Names is how the errors about a partitioner list the accepted names.
const Names = `"murmur2" (the default: Apache Kafka's Java client, kafkajs), "fnv1a" (sarama's; fxoutbox's before murmur2) or "crc32" (librdkafka's)`

// Name returns the name of value p; false when p names none.
func Name(p int) (string, bool) {
	if p < 1 || p >= len(hashes) {
		return "", false
	}
	return hashes[p].name, true
}

// Parse returns the value named s (in any case, spaces around it
// ignored); false when s names none.
func Parse(s string) (int, bool) {
	for p := 1; p < len(hashes); p++ {
		if strings.EqualFold(strings.TrimSpace(s), hashes[p].name) {
			return p, true
		}
	}
	return 0, false
}

// Sarama returns sarama's constructor of value p, murmur2's for 0, nil for
// a value that names no partitioner.
func Sarama(p int) sarama.PartitionerConstructor {
	if p == 0 {
		p = 1
	}
	if p < 1 || p >= len(hashes) {
		return nil
	}
	return hashes[p].c
}

// Valid reports whether p is 0 or names a partitioner.
func Valid(p int) bool { return Sarama(p) != nil }

// Of tells which value a sarama partitioner constructor is: false for nil
// and for any constructor but the three Sarama returns (a partitioner of
// the user's own, sarama's random, round-robin, manual or reference-hash
// ones).
func Of(c sarama.PartitionerConstructor) (int, bool) {
	if c == nil {
		return 0, false
	}
	// Top-level functions: equal code pointers are the same function.
	ptr := reflect.ValueOf(c).Pointer()
	for p := 1; p < len(hashes); p++ {
		if reflect.ValueOf(hashes[p].c).Pointer() == ptr {
			return p, true
		}
	}
	return 0, false
}
