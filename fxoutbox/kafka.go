package fxoutbox

import (
	"github.com/IBM/sarama"

	"github.com/fxoutbox/outbox/internal/partitioner"
	"github.com/fxoutbox/outbox/relay"
)

// partitionerName names sc's partitioner for the start-up line.
func partitionerName(sc *sarama.Config) string {
	if p, ok := partitioner.Of(sc.Producer.Partitioner); ok {
		return relay.Partitioner(p).String()
	}
	return "custom (Sarama.Producer.Partitioner)"
}
