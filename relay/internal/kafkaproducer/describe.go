package kafkaproducer

import (
	"context"
	"errors"

	"github.com/IBM/sarama"
)

// How the id's last transaction ended, before a Txn that remembers nothing
// of it (a new process, or another relay's id taken over) initialises it.
//
// SettleTopics ends the records of the producer id that no marker decides.
// A new holder of the id cannot know, from the records alone, whether the
// transaction that left them was committed: a broker that restarted right
// after a commit skips the markers of the partitions it leads, and the
// coordinator has decided commit. Aborting them then loses events whose
// commit the previous holder saw (and acted on: a stream confirmed its
// slot past them, a polling relay marked their rows). So before its first
// InitProducerID, a Txn asks the coordinator (DescribeTransactions, Kafka
// 3.0+) how the id's last transaction stands: committing or committed, with
// which producer id and epoch. If InitProducerID then answers the same
// producer id with the next epoch, nothing ended between the two requests
// (a transaction aborted by the fence bumps the epoch once more), and the
// records left without a marker are that committed transaction's:
// SettleTopics commits them. Otherwise, or when the coordinator cannot say
// (an older broker), it aborts them, as before.

// priorTxn is what DescribeTransactions said of the id's last transaction.
type priorTxn struct {
	pid       int64
	epoch     int16
	committed bool // PrepareCommit or CompleteCommit
}

// describe asks the id's coordinator how its last transaction stands; nil
// when it cannot say (no such id, an older broker, an error): the caller
// then assumes nothing. It retries the coordinator's transient answers as
// the other requests do, until ctx ends.
//
// The request needs a connection whose configured version is at least
// Kafka 3.0 (sarama refuses it otherwise, and the relay's default is 2.8):
// it goes over a connection of its own to the coordinator, with that
// version, negotiated down by ApiVersions like any other.
func (t *Txn) describe(ctx context.Context) *priorTxn {
	conf := *t.p.client.Config()
	if !conf.Version.IsAtLeast(sarama.V3_0_0_0) {
		conf.Version = sarama.V3_0_0_0
	}
	var st *sarama.TransactionState
	err := t.coordinated(ctx, "describe the transactional id", func(b *sarama.Broker) (sarama.KError, error) {
		// A failure of the connection of its own is answered as the
		// coordinator's unavailability (look it up again, retry): an error
		// would make coordinated close b, the client's connection, which
		// the relay's other producers share.
		side := sarama.NewBroker(b.Addr())
		if err := side.Open(&conf); err != nil {
			return sarama.ErrConsumerCoordinatorNotAvailable, nil
		}
		defer func() { _ = side.Close() }()
		resp, err := side.DescribeTransactions(&sarama.DescribeTransactionsRequest{TransactionalIDs: []string{t.id}})
		switch {
		case errors.Is(err, sarama.ErrUnsupportedVersion):
			return sarama.ErrUnsupportedVersion, nil // an older broker: nothing to retry
		case err != nil:
			return sarama.ErrConsumerCoordinatorNotAvailable, nil
		case len(resp.TransactionStates) != 1:
			return sarama.ErrUnknown, nil
		}
		st = &resp.TransactionStates[0]
		return st.ErrorCode, nil
	})
	if err != nil || st == nil {
		return nil
	}
	return &priorTxn{pid: st.ProducerID, epoch: st.ProducerEpoch,
		committed: st.TransactionState == "PrepareCommit" || st.TransactionState == "CompleteCommit"}
}

// committedJustBefore reports whether p (nil: not known) was committed and
// the producer id and epoch that InitProducerID returned come right after
// it: the same producer id, the next epoch.
func (p *priorTxn) committedJustBefore(pid int64, epoch int16) bool {
	return p != nil && p.committed && p.pid == pid && p.epoch+1 == epoch
}
