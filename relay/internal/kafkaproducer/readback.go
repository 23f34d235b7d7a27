package kafkaproducer

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/IBM/sarama"
)

// Last is what a partition holds of one key: its last committed record
// (Value, when Found), and the values of the key's records after it whose
// transactions are not decided yet (Pending, newest first).
type Last struct {
	Value   []byte
	Found   bool
	Pending [][]byte
}

// LastCommitted returns, for each of keys, its last committed record in
// partition partition of topic and its records of undecided transactions
// after it (see Last). Records of aborted transactions do not count.
//
// It reads up to the high watermark, read_uncommitted, and decides each
// transactional record by the first transaction marker of its producer
// after it: commit, abort, or none yet (undecided). Reading committed would
// stop at the last stable offset, which any producer's open transaction
// holds back, hiding the decided records after it. It reads backwards, in
// windows that grow 4x (the newest first), until every key has a committed
// record or the log's start is reached, so keys written recently cost one
// fetch.
func LastCommitted(ctx context.Context, client sarama.Client, topic string, partition int32, keys []string) (map[string]Last, error) {
	fail := func(what string, err error) (map[string]Last, error) {
		return nil, fmt.Errorf("relay: read back %s of topic %q partition %d: %w", what, topic, partition, err)
	}
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			_ = client.RefreshMetadata(topic)
			sleepCtx(ctx, 100*time.Millisecond)
		}
		if err := ctx.Err(); err != nil {
			return fail("the last records", err)
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
			var end int64
			if end, err = listOffset(client, leader, topic, partition, sarama.OffsetNewest); err == nil {
				var out map[string]Last
				if out, err = lastIn(ctx, leader, topic, partition, keys, start, end); err == nil {
					return out, nil
				}
			}
		}
		if attempt >= 20 || ctx.Err() != nil {
			return fail("the last records", err)
		}
		_ = leader.Close()
	}
}

// listOffset asks leader for the log start offset (sarama.OffsetOldest) or
// the high watermark (sarama.OffsetNewest).
func listOffset(client sarama.Client, leader *sarama.Broker, topic string, partition int32, which int64) (int64, error) {
	return listOffsetAs(client, leader, topic, partition, which, sarama.ReadUncommitted)
}

// stableOffset asks leader for partition's last stable offset: the first
// offset of its earliest undecided transaction, or its high watermark.
func stableOffset(client sarama.Client, leader *sarama.Broker, topic string, partition int32) (int64, error) {
	return listOffsetAs(client, leader, topic, partition, sarama.OffsetNewest, sarama.ReadCommitted)
}

// listOffsetAs is listOffset for a reader of isolation level iso.
func listOffsetAs(client sarama.Client, leader *sarama.Broker, topic string, partition int32, which int64, iso sarama.IsolationLevel) (int64, error) {
	req := sarama.NewOffsetRequest(client.Config().Version)
	req.IsolationLevel = iso
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

// Transaction markers, by the type in a control record's key.
const (
	markerAbort  = 0
	markerCommit = 1
)

// lastIn scans [start, end) backwards in growing windows (see
// LastCommitted).
func lastIn(ctx context.Context, leader *sarama.Broker, topic string, partition int32, keys []string, start, end int64) (map[string]Last, error) {
	out := make(map[string]Last, len(keys))
	open := len(keys) // keys without a committed record yet
	for _, k := range keys {
		out[k] = Last{}
	}
	// next: the type of each producer's first marker after the position
	// the backward scan has reached.
	next := map[int64]int{}
	for window := int64(256); end > start && open > 0; window *= 4 {
		from := max(start, end-window)
		batches, err := fetchRange(ctx, leader, topic, partition, from, end)
		if err != nil {
			return nil, err
		}
		for i := len(batches) - 1; i >= 0 && open > 0; i-- {
			b := batches[i]
			if b.Control {
				if len(b.Records) > 0 && len(b.Records[0].Key) >= 4 {
					next[b.ProducerID] = int(binary.BigEndian.Uint16(b.Records[0].Key[2:4]))
				}
				continue
			}
			marker, decided := next[b.ProducerID]
			if b.IsTransactional && decided && marker == markerAbort {
				continue
			}
			committed := !b.IsTransactional || decided && marker == markerCommit
			for j := len(b.Records) - 1; j >= 0; j-- {
				r := b.Records[j]
				o := b.FirstOffset + r.OffsetDelta
				if o < from || o >= end {
					continue
				}
				l, ok := out[string(r.Key)]
				if !ok || l.Found {
					continue
				}
				if committed {
					l.Value, l.Found = r.Value, true
					open--
				} else {
					l.Pending = append(l.Pending, r.Value)
				}
				out[string(r.Key)] = l
			}
		}
		end = from
	}
	return out, nil
}

// fetchRange returns the record batches (data and control) that hold the
// offsets [from, to), read uncommitted, in order.
func fetchRange(ctx context.Context, leader *sarama.Broker, topic string, partition int32, from, to int64) ([]*sarama.RecordBatch, error) {
	var out []*sarama.RecordBatch
	for off := from; off < to; {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		req := &sarama.FetchRequest{Version: 11, MaxWaitTime: 0, MinBytes: 1, MaxBytes: 16 << 20, Isolation: sarama.ReadUncommitted, SessionEpoch: -1}
		req.AddBlock(topic, partition, off, 4<<20, -1)
		resp, err := leader.Fetch(req)
		if err != nil {
			return nil, err
		}
		blk := resp.GetBlock(topic, partition)
		if blk == nil {
			return nil, sarama.ErrIncompleteResponse
		}
		if blk.Err != sarama.ErrNoError {
			return nil, blk.Err
		}
		next := off
		for _, rs := range blk.RecordsSet {
			b := rs.RecordBatch
			if b == nil || b.LastOffset() < off || b.FirstOffset >= to {
				continue
			}
			out = append(out, b)
			next = max(next, b.LastOffset()+1)
		}
		if next == off {
			// Nothing more below the high watermark: the range is done,
			// or compaction removed its end.
			if blk.HighWaterMarkOffset <= off || len(blk.RecordsSet) == 0 {
				return out, nil
			}
			return nil, fmt.Errorf("fetch at offset %d returned no record batch", off)
		}
		off = next
	}
	return out, nil
}
