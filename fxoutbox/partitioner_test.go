package fxoutbox

import (
	"context"
	"strings"
	"testing"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/fx/fxtest"

	"github.com/fxoutbox/outbox/internal/partitioner"
	"github.com/fxoutbox/outbox/relay"
)

// OUTBOX_PARTITIONER names one of the three hashes, in any case; anything
// else is an error naming the variable and the valid values.
func TestPartitionerFromEnv(t *testing.T) {
	for v, want := range map[string]relay.Partitioner{"murmur2": relay.Murmur2, "FNV1A": relay.FNV1a, " crc32 ": relay.CRC32, "": 0} {
		c, err := configFrom(envOf(map[string]string{"OUTBOX_PARTITIONER": v}))
		if err != nil || c.Partitioner != want {
			t.Errorf("OUTBOX_PARTITIONER=%q: %v, %v; want %v", v, c.Partitioner, err, want)
		}
	}
	for _, v := range []string{"java", "murmur", "fnv", "consistent_random", "default"} {
		_, err := configFrom(envOf(map[string]string{"OUTBOX_PARTITIONER": v}))
		checkConfigError(t, "OUTBOX_PARTITIONER="+v, err, "OUTBOX_PARTITIONER")
		for _, name := range []string{`"murmur2"`, `"fnv1a"`, `"crc32"`, `"` + v + `"`} {
			if err != nil && !strings.Contains(err.Error(), name) {
				t.Errorf("OUTBOX_PARTITIONER=%s: the error does not say %s: %v", v, name, err)
			}
		}
	}
}

// Which partitioner the relay's producer gets: murmur2 by default;
// Config.Partitioner when set, over a Sarama configuration's stock hash
// too; Sarama's own when Config.Partitioner is unset; an error when both
// name a partitioner and Sarama's is none of the three hashes, or when the
// value is invalid.
func TestPartitionerRule(t *testing.T) {
	withPartitioner := func(c sarama.PartitionerConstructor) *sarama.Config {
		sc := relay.DefaultSaramaConfig()
		sc.Producer.Partitioner = c
		return sc
	}
	for _, tc := range []struct {
		name string
		cfg  Config
		want relay.Partitioner // 0: Sarama's own, kept
	}{
		{"defaults", Config{}, relay.Murmur2},
		{"default sarama config", Config{Sarama: relay.DefaultSaramaConfig()}, relay.Murmur2},
		{"fnv1a", Config{Partitioner: relay.FNV1a}, relay.FNV1a},
		{"crc32", Config{Partitioner: relay.CRC32}, relay.CRC32},
		{"fnv1a over the default sarama config", Config{Partitioner: relay.FNV1a, Sarama: relay.DefaultSaramaConfig()}, relay.FNV1a},
		{"murmur2 over sarama's FNV-1a", Config{Partitioner: relay.Murmur2, Sarama: withPartitioner(sarama.NewHashPartitioner)}, relay.Murmur2},
		{"unset keeps sarama's FNV-1a", Config{Sarama: withPartitioner(sarama.NewHashPartitioner)}, relay.FNV1a},
		{"unset keeps a partitioner of your own", Config{Sarama: withPartitioner(sarama.NewRoundRobinPartitioner)}, 0},
	} {
		var before relay.Partitioner
		if tc.cfg.Sarama != nil {
			before, _ = partitionerOf(tc.cfg.Sarama.Producer.Partitioner)
		}
		sc, err := tc.cfg.SaramaConfig()
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		p, ok := partitionerOf(sc.Producer.Partitioner)
		switch {
		case tc.want == 0 && ok:
			t.Errorf("%s: partitioner %v, want the Sarama configuration's own", tc.name, p)
		case tc.want != 0 && p != tc.want:
			t.Errorf("%s: partitioner %v (known %v), want %v", tc.name, p, ok, tc.want)
		}
		if tc.cfg.Sarama != nil {
			if after, _ := partitionerOf(tc.cfg.Sarama.Producer.Partitioner); after != before {
				t.Errorf("%s: the caller's Sarama configuration was changed from %v to %v", tc.name, before, after)
			}
		}
	}
	for name, c := range map[string]Config{
		"both set, sarama's of your own": {Partitioner: relay.FNV1a, Sarama: withPartitioner(sarama.NewRandomPartitioner)},
		"invalid":                        {Partitioner: relay.Partitioner(7)},
	} {
		_, err := c.SaramaConfig()
		checkConfigError(t, name, err, "OUTBOX_PARTITIONER")
	}
}

// A relay.Publisher from fx chooses partitions itself: a Partitioner set
// next to it is an error, not ignored.
func TestPartitionerNeedsTheModulesProducer(t *testing.T) {
	lc := fxtest.NewLifecycle(t)
	_, err := newRelay(relayParams{Lifecycle: lc, Pool: &pgxpool.Pool{}, Publisher: nopPublisher{},
		Config: Config{Brokers: []string{"localhost:9092"}, Partitioner: relay.FNV1a}})
	checkConfigError(t, "Partitioner with a relay.Publisher", err, "OUTBOX_PARTITIONER")
	if _, err := newRelay(relayParams{Lifecycle: lc, Pool: &pgxpool.Pool{}, Publisher: nopPublisher{}}); err != nil {
		t.Errorf("a relay.Publisher without Partitioner: %v", err)
	}
}

type nopPublisher struct{}

func (nopPublisher) Publish(context.Context, []relay.Message) error { return nil }

// partitionerOf tells which relay.Partitioner a sarama constructor is.
func partitionerOf(c sarama.PartitionerConstructor) (relay.Partitioner, bool) {
	p, ok := partitioner.Of(c)
	return relay.Partitioner(p), ok
}
