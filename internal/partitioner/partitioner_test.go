package partitioner_test

import (
	"strings"
	"testing"

	"github.com/IBM/sarama"

	"github.com/fxoutbox/outbox/internal/partitioner"
	"github.com/fxoutbox/outbox/relay"
)

// Each relay.Partitioner has one name and one sarama constructor, and
// back; the zero value is murmur2's, other numbers nothing.
func TestRoundTrip(t *testing.T) {
	for _, p := range []relay.Partitioner{relay.Murmur2, relay.FNV1a, relay.CRC32} {
		name, ok := partitioner.Name(int(p))
		if !ok || name != p.String() || !strings.Contains(partitioner.Names, `"`+name+`"`) {
			t.Errorf("Name(%d) = %q, %v; String %q; Names %s", p, name, ok, p.String(), partitioner.Names)
		}
		if got, ok := partitioner.Parse(" " + strings.ToUpper(name) + " "); !ok || got != int(p) {
			t.Errorf("Parse(%q) = %v, %v, want %d", name, got, ok, p)
		}
		if q, ok := partitioner.Of(partitioner.Sarama(int(p))); !ok || q != int(p) {
			t.Errorf("Of(Sarama(%d)) = %v, %v", p, q, ok)
		}
	}
	if _, ok := partitioner.Parse("java"); ok {
		t.Error(`Parse("java") names a partitioner`)
	}
	if q, ok := partitioner.Of(partitioner.Sarama(0)); !ok || q != int(relay.Murmur2) || !partitioner.Valid(0) {
		t.Error("zero must mean the default (murmur2)")
	}
	if partitioner.Sarama(9) != nil || partitioner.Valid(9) || partitioner.Valid(-1) {
		t.Error("9 and -1 must name nothing")
	}
	for _, c := range []sarama.PartitionerConstructor{nil, sarama.NewRandomPartitioner, sarama.NewReferenceHashPartitioner,
		func(topic string) sarama.Partitioner { return sarama.NewMurmur2Partitioner(topic) }} {
		if p, ok := partitioner.Of(c); ok {
			t.Errorf("Of(a partitioner of another kind) = %v", p)
		}
	}
}
