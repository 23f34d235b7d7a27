package relay_test

import (
	"fmt"
	"hash/fnv"
	"testing"

	"github.com/IBM/sarama"

	"github.com/fxoutbox/outbox/internal/partitioner"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
)

// javaMurmur2 are murmur2 hashes as Apache Kafka's Java client computes
// them (org.apache.kafka.common.utils.Utils.murmur2, the vectors of Kafka's
// UtilsTest.testMurmur2, and the empty key), as signed Java ints.
var javaMurmur2 = map[string]int32{
	"21":                         -973932308,
	"foobar":                     -790332482,
	"a-little-bit-long-string":   -985981536,
	"a-little-bit-longer-string": -1486304829,
	"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
	"abc": 479470107,
	"":    275646681,
}

// partitionOf is where the sarama partitioner c puts key among n partitions.
func partitionOf(t *testing.T, c sarama.PartitionerConstructor, key string, n int32) int32 {
	t.Helper()
	p, err := c("topic").Partition(&sarama.ProducerMessage{Topic: "topic", Key: sarama.ByteEncoder(key)}, n)
	if err != nil {
		t.Fatalf("partition %q: %v", key, err)
	}
	return p
}

// The default partitioner, the one relay.DefaultSaramaConfig (and so
// NewSaramaPublisher with a nil configuration) uses, puts every key where
// Apache Kafka's Java client does: Java's formula over Kafka's own murmur2
// vectors for several partition counts, and the Java producer's choices
// for 200 keys on 12 partitions.
func TestDefaultPartitionerIsJavas(t *testing.T) {
	def := relay.DefaultSaramaConfig().Producer.Partitioner
	if p, ok := partitioner.Of(def); !ok || p != int(relay.Murmur2) {
		t.Fatalf("DefaultSaramaConfig's partitioner is %v (known %v), want murmur2", p, ok)
	}
	for key, h := range javaMurmur2 {
		for _, n := range []int32{1, 2, 3, 7, 12, 50, 1000} {
			want := (h & 0x7fffffff) % n // Java: Utils.toPositive(murmur2(key)) % n
			if got := partitionOf(t, def, key, n); got != want {
				t.Errorf("key %q on %d partitions: partition %d, Java's is %d", key, n, got, want)
			}
		}
	}
	for i, want := range testenv.JavaOrderPartitions12 {
		key := fmt.Sprintf("order-%d", i)
		if got := partitionOf(t, def, key, 12); got != want {
			t.Errorf("key %q on 12 partitions: partition %d, the Java producer's is %d", key, got, want)
		}
	}
}

// FNV1a is the placement of the relay before murmur2 became its default
// (sarama's NewHashPartitioner: FNV-1a as a signed number, sign dropped),
// and it differs from Java's for most keys, which is why it is no longer
// the default. CRC32 is librdkafka's consistent hash.
func TestFNV1aAndCRC32Partitioners(t *testing.T) {
	same := 0
	for i, java := range testenv.JavaOrderPartitions12 {
		key := fmt.Sprintf("order-%d", i)
		h := fnv.New32a()
		h.Write([]byte(key))
		want := int32(h.Sum32()) % 12
		if want < 0 {
			want = -want
		}
		got := partitionOf(t, partitioner.Sarama(int(relay.FNV1a)), key, 12)
		if got != want {
			t.Errorf("fnv1a: key %q on partition %d, want %d", key, got, want)
		}
		if got == java {
			same++
		}
	}
	if same > 50 {
		t.Errorf("fnv1a put %d of 200 keys where Java does: it should differ for most (chance is 1 in 12)", same)
	}
	// librdkafka: rd_crc32(key) % partitions, unsigned.
	for _, key := range []string{"order-1", "foobar", "a-little-bit-long-string"} {
		want := int32(crc32IEEE(key) % 12)
		if got := partitionOf(t, partitioner.Sarama(int(relay.CRC32)), key, 12); got != want {
			t.Errorf("crc32: key %q on partition %d, want %d", key, got, want)
		}
	}
}

// crc32IEEE is the IEEE CRC-32 of s, bit by bit (as librdkafka's rdcrc32).
func crc32IEEE(s string) uint32 {
	c := ^uint32(0)
	for i := 0; i < len(s); i++ {
		c ^= uint32(s[i])
		for k := 0; k < 8; k++ {
			if c&1 != 0 {
				c = c>>1 ^ 0xedb88320
			} else {
				c >>= 1
			}
		}
	}
	return ^c
}
