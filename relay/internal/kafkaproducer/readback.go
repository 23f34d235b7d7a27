package kafkaproducer

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"time"

	"github.com/IBM/sarama"
)

// LastCommitted returns the value of the last committed record of each of
// keys in partition partition of topic, as a read_committed consumer sees
// the partition now: records of aborted transactions, and of transactions
// still open (past the last stable offset), do not count. A key the
// partition holds no record of is not in the map.
//
// It reads backwards from the last stable offset, in windows that grow 4x
// (the newest window first), until it found every key or reached the log's
// start, so keys written recently cost one fetch. Callers make sure no
// transaction they care about is still open (a Txn's Init decides its id's
// transactions) before they call it.
func LastCommitted(ctx context.Context, client sarama.Client, topic string, partition int32, keys []string) (values map[string][]byte, err error) {
	fail := func(what string, err error) (map[string][]byte, error) {
		return nil, fmt.Errorf("relay: read back %s of topic %q partition %d: %w", what, topic, partition, err)
	}
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			_ = client.RefreshMetadata(topic)
			sleepCtx(ctx, 100*time.Millisecond)
		}
		if err := ctx.Err(); err != nil {
			return fail("the last record", err)
		}
		leader, err := client.Leader(topic, partition)
		if err != nil {
			if attempt < 20 {
				continue
			}
			return fail("the leader", err)
		}
		start, err := listOffset(client, leader, topic, partition, sarama.OffsetOldest)
		if err == nil {
			var stable int64
			if stable, err = listOffset(client, leader, topic, partition, sarama.OffsetNewest); err == nil {
				values, err = lastIn(ctx, client, leader, topic, partition, keys, start, stable)
				if err == nil {
					return values, nil
				}
			}
		}
		if attempt >= 20 || ctx.Err() != nil {
			return fail("the last record", err)
		}
		_ = leader.Close()
	}
}

// listOffset asks leader for the log start offset (sarama.OffsetOldest) or
// the last stable offset (sarama.OffsetNewest, read_committed).
func listOffset(client sarama.Client, leader *sarama.Broker, topic string, partition int32, which int64) (int64, error) {
	req := sarama.NewOffsetRequest(client.Config().Version)
	req.IsolationLevel = sarama.ReadCommitted
	req.AddBlock(topic, partition, which, 1)
	resp, err := leader.GetAvailableOffsets(req)
	if err != nil {
		return 0, err
	}
	blk := resp.GetBlock(topic, partition)
	switch {
	case blk == nil:
		return 0, sarama.ErrIncompleteResponse
	case blk.Err != sarama.ErrNoError:
		return 0, blk.Err
	case req.Version == 0 && len(blk.Offsets) > 0:
		return blk.Offsets[0], nil
	}
	return blk.Offset, nil
}

// lastIn scans [start, stable) backwards in growing windows for the last
// committed record of each key.
func lastIn(ctx context.Context, client sarama.Client, leader *sarama.Broker, topic string, partition int32, keys []string, start, stable int64) (map[string][]byte, error) {
	want := make(map[string]bool, len(keys))
	for _, k := range keys {
		want[k] = true
	}
	found := map[string][]byte{}
	end := stable
	for window := int64(256); end > start && len(want) > 0; window *= 4 {
		from := max(start, end-window)
		last := map[string][]byte{}
		err := scan(ctx, client, leader, topic, partition, from, end, func(r *sarama.Record) {
			if want[string(r.Key)] {
				last[string(r.Key)] = r.Value
			}
		})
		if err != nil {
			return nil, err
		}
		for k, v := range last {
			found[k] = v
			delete(want, k)
		}
		end = from
	}
	return found, nil
}

// scan hands each committed data record of [from, to) to f, in order.
func scan(ctx context.Context, client sarama.Client, leader *sarama.Broker, topic string, partition int32, from, to int64, f func(*sarama.Record)) error {
	for off := from; off < to; {
		if err := ctx.Err(); err != nil {
			return err
		}
		req := &sarama.FetchRequest{Version: 11, MaxWaitTime: 0, MinBytes: 1, MaxBytes: 16 << 20, Isolation: sarama.ReadCommitted, SessionEpoch: -1}
		req.AddBlock(topic, partition, off, 4<<20, -1)
		resp, err := leader.Fetch(req)
		if err != nil {
			return err
		}
		blk := resp.GetBlock(topic, partition)
		if blk == nil {
			return sarama.ErrIncompleteResponse
		}
		if blk.Err != sarama.ErrNoError {
			return blk.Err
		}
		aborted := slices.Clone(blk.AbortedTransactions)
		slices.SortFunc(aborted, func(a, b *sarama.AbortedTransaction) int { return int(a.FirstOffset - b.FirstOffset) })
		abortedPIDs := map[int64]bool{}
		next := off
		for _, rs := range blk.RecordsSet {
			b := rs.RecordBatch
			if b == nil {
				continue
			}
			for len(aborted) > 0 && aborted[0].FirstOffset <= b.LastOffset() {
				abortedPIDs[aborted[0].ProducerID] = true
				aborted = aborted[1:]
			}
			next = max(next, b.LastOffset()+1)
			if b.Control {
				if len(b.Records) > 0 && len(b.Records[0].Key) >= 4 && binary.BigEndian.Uint16(b.Records[0].Key[2:4]) == 0 {
					delete(abortedPIDs, b.ProducerID) // an abort marker ends the aborted transaction
				}
				continue
			}
			if b.IsTransactional && abortedPIDs[b.ProducerID] {
				continue
			}
			for _, r := range b.Records {
				if o := b.FirstOffset + r.OffsetDelta; o >= off && o < to {
					f(r)
				}
			}
		}
		if next == off {
			// Nothing up to the last stable offset: the range is done (it
			// ends there), or compaction removed it.
			if blk.LastStableOffset <= off || len(blk.RecordsSet) == 0 {
				return nil
			}
			return fmt.Errorf("fetch at offset %d returned no record batch", off)
		}
		off = next
	}
	return nil
}
