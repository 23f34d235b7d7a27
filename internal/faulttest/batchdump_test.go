package faulttest

import (
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/IBM/sarama"

	"github.com/fxoutbox/outbox"
)

// dumpBatches logs the record batches of topic's partition from offset
// from to offset to (inclusive), as the broker stores them: each batch's
// offsets, producer id and epoch, first sequence, whether it is
// transactional, and for a control batch whether it commits or aborts; then
// the aborted transactions and last stable offset a read_committed fetch
// from the same offset reports. It is what a duplicate under exactly-once
// needs to be told apart: one batch stored twice by the broker, two
// transactions both committed, or an aborted one a consumer did not skip.
func dumpBatches(t *testing.T, brokers []string, topic string, partition int32, from, to int64) {
	t.Helper()
	client := offsetClient(t, brokers)
	leader, err := client.Leader(topic, partition)
	if err != nil {
		t.Logf("batches of %s/%d: no leader: %v", topic, partition, err)
		return
	}
	fetch := func(iso sarama.IsolationLevel, offset int64) (*sarama.FetchResponseBlock, error) {
		req := &sarama.FetchRequest{Version: 11, MaxWaitTime: 100, MinBytes: 1, MaxBytes: 8 << 20, Isolation: iso}
		req.AddBlock(topic, partition, offset, 8<<20, -1)
		resp, err := leader.Fetch(req)
		if err != nil {
			return nil, err
		}
		blk := resp.GetBlock(topic, partition)
		if blk == nil {
			return nil, fmt.Errorf("no block in the fetch response")
		}
		if blk.Err != sarama.ErrNoError {
			return nil, blk.Err
		}
		return blk, nil
	}
	var lines []string
	for offset := from; offset <= to; {
		blk, err := fetch(sarama.ReadUncommitted, offset)
		if err != nil {
			t.Logf("batches of %s/%d from %d: %v", topic, partition, offset, err)
			return
		}
		next := offset
		for _, rs := range blk.RecordsSet {
			b := rs.RecordBatch
			if b == nil {
				continue
			}
			last := b.FirstOffset + int64(b.LastOffsetDelta)
			if last < offset || b.FirstOffset > to {
				next = max(next, last+1)
				continue
			}
			kind := "data"
			if b.Control {
				kind = "control"
				// A control record's key is its version and type (0
				// abort, 1 commit), two int16s.
				if len(b.Records) > 0 && len(b.Records[0].Key) >= 4 {
					kind = map[uint16]string{0: "ABORT", 1: "COMMIT"}[binary.BigEndian.Uint16(b.Records[0].Key[2:4])]
				}
			}
			lines = append(lines, fmt.Sprintf("  %d-%d %s pid %d epoch %d seq %d txn %v leader-epoch %d", b.FirstOffset, last, kind,
				b.ProducerID, b.ProducerEpoch, b.FirstSequence, b.IsTransactional, b.PartitionLeaderEpoch))
			next = max(next, last+1)
		}
		if next == offset {
			break
		}
		offset = next
	}
	committed, err := fetch(sarama.ReadCommitted, from)
	if err != nil {
		t.Logf("batches of %s/%d from %d read_committed: %v", topic, partition, from, err)
	} else {
		var aborted []string
		for _, a := range committed.AbortedTransactions {
			aborted = append(aborted, fmt.Sprintf("pid %d from %d", a.ProducerID, a.FirstOffset))
		}
		lines = append(lines, fmt.Sprintf("  read_committed from %d: last stable offset %d, high water mark %d, aborted transactions [%s]",
			from, committed.LastStableOffset, committed.HighWaterMarkOffset, strings.Join(aborted, ", ")))
	}
	t.Logf("record batches of %s/%d, offsets %d-%d, as the broker stores them:\n%s", topic, partition, from, to, strings.Join(lines, "\n"))
}

// dumpOpen logs, for each partition of topics whose last stable offset is
// behind its high-water mark (a transaction is open there, or its marker
// never came), the record batches from the last stable offset on: the
// batches whose transaction is undecided, and their producers.
func dumpOpen(t *testing.T, brokers []string, topics ...string) {
	t.Helper()
	client := offsetClient(t, brokers)
	for _, topic := range topics {
		hw, lso, err := offsets(context.Background(), client, topic)
		if err != nil {
			t.Logf("open transactions on %s: %v", topic, err)
			continue
		}
		for _, p := range slices.Sorted(maps.Keys(hw)) {
			if lso[p] < hw[p] {
				t.Logf("%s/%d: last stable offset %d, high-water mark %d: a transaction is undecided", topic, p, lso[p], hw[p])
				dumpBatches(t, brokers, topic, p, lso[p], min(hw[p]-1, lso[p]+200))
			}
		}
	}
}

// progressTopic is the relay's default progress topic of table
// (Config.ProgressTopic).
func progressTopic(table outbox.Table) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-' {
			return r
		}
		return '_'
	}, "fxoutbox.progress."+table.String())
}
