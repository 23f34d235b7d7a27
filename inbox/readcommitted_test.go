package inbox_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/testenv"
)

// The records of an aborted Kafka transaction were never sent (the relay's
// exactly-once mode aborts a batch's transaction and publishes the batch
// again; other producers abort records that must not exist). The inbox
// reads committed by default: a transaction that aborted, followed by one
// that committed, has exactly the committed one's records applied, and the
// consumer's offsets move past the aborted ones. A Sarama configuration that
// asks for ReadUncommitted gets it: the aborted records are applied too.
func TestReadCommitted(t *testing.T) {
	t.Parallel()
	uncommitted := sarama.ReadUncommitted
	for _, tc := range []struct {
		name        string
		isolation   *sarama.IsolationLevel // nil: the default's
		appliesBoth bool
	}{
		{"default", nil, false},
		{"read uncommitted on request", &uncommitted, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const partitions = 2
			e := newEnv(t, partitions)
			aborted := events(30, 6)
			committed := events(30, 6)
			for i := range committed {
				committed[i].Seq += 100
			}
			p := newTxnProducer(t, e.brokers)
			e.produceTxn(p, aborted, false)
			last := e.produceTxn(p, committed, true)

			g := group()
			cfg := e.config(g, e.effect("a"))
			if tc.isolation != nil {
				cfg.Sarama.Consumer.IsolationLevel = *tc.isolation
			}
			e.start(cfg)
			// The group's offsets pass the last committed record of each
			// partition only once every record before it, the aborted
			// ones included, is applied, skipped or parked.
			eventually(t, 90*time.Second, "offsets past the committed transaction's records", func() bool {
				offs := e.committed(g, partitions)
				for p, o := range last {
					if offs[p] <= o {
						return false
					}
				}
				return true
			})
			if tc.appliesBoth {
				e.checkOnce(append(aborted, committed...))
			} else {
				e.checkOnce(committed)
			}
		})
	}
}

// newTxnProducer returns a transactional producer (sarama's own, as a
// producer other than the relay would use), closed when the test ends.
func newTxnProducer(t *testing.T, brokers []string) sarama.SyncProducer {
	t.Helper()
	sc := sarama.NewConfig()
	sc.Version = sarama.V2_8_0_0
	sc.ClientID = "fxoutbox-test-txn"
	sc.Producer.Idempotent = true
	sc.Producer.Transaction.ID = testenv.Name("txn-")
	sc.Producer.RequiredAcks = sarama.WaitForAll
	sc.Producer.Return.Successes = true
	sc.Producer.Partitioner = sarama.NewMurmur2Partitioner
	sc.Net.MaxOpenRequests = 1
	p, err := sarama.NewSyncProducer(brokers, sc)
	if err != nil {
		t.Fatalf("transactional producer: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// produceTxn sends events to the env's topic in one Kafka transaction,
// committed or aborted, and returns the offset of the last record it wrote
// to each partition.
func (e *env) produceTxn(p sarama.SyncProducer, events []ev, commit bool) map[int32]int64 {
	e.t.Helper()
	var msgs []*sarama.ProducerMessage
	for i := range events {
		v := &events[i]
		v.ID = uuid.Must(uuid.NewV7()).String()
		b, _ := json.Marshal(payload{Seq: v.Seq})
		msgs = append(msgs, &sarama.ProducerMessage{
			Topic: e.topic, Key: sarama.StringEncoder(v.Key), Value: sarama.ByteEncoder(b),
			Headers: []sarama.RecordHeader{
				{Key: []byte(outbox.HeaderEventID), Value: []byte(v.ID)},
				{Key: []byte(outbox.HeaderEventType), Value: []byte("thing.happened.v1")},
			},
		})
	}
	if err := p.BeginTxn(); err != nil {
		e.t.Fatalf("begin transaction: %v", err)
	}
	if err := p.SendMessages(msgs); err != nil {
		e.t.Fatalf("produce in a transaction: %v", err)
	}
	end, what := p.AbortTxn, "abort"
	if commit {
		end, what = p.CommitTxn, "commit"
	}
	if err := end(); err != nil {
		e.t.Fatalf("%s transaction: %v", what, err)
	}
	last := map[int32]int64{}
	for _, m := range msgs {
		last[m.Partition] = max(last[m.Partition], m.Offset)
	}
	return last
}
