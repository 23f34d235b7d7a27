package kafkaproducer

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
)

// Orphans: a transaction's records that no marker decides.
//
// When a transaction ends, its coordinator writes a marker (commit or
// abort) to every partition the transaction added. A partition whose leader
// the coordinator cannot find at that moment is skipped, as if its topic
// had been deleted (Kafka's TransactionMarkerChannelManager: "Couldn't find
// leader endpoint ... likely deleted already and hence can be skipped").
// That happens when a broker restarts and is fenced for a few seconds until
// its previous session expires: every partition it leads has no leader, and
// the coordinator, which has just loaded and rolled back the transactions
// that outlived their timeout, skips them all. The transaction's records on
// those partitions stay undecided: read_committed readers stop before them,
// and the next transaction of the same producer id that writes there ends
// them with its own marker, its commit committing the abandoned records too
// (the relay saw the same batch twice, read_committed).
//
// A Txn therefore remembers the transactions whose markers it cannot be
// sure of: one it aborted, one whose end failed or that Init abandoned,
// and, once one of those happens, the last one it committed before (a
// broker that restarts right after a commit skips that commit's markers
// too). Before its next transaction it settles them, oldest first: it reads
// the tail of each partition a transaction added, and where records of its
// producer id are left without a marker, it runs a transaction of its own
// over those partitions that ends them as the coordinator decided (see
// doubt.decide), and reads again until none is left.

// doubt is a transaction whose markers may be missing somewhere.
type doubt struct {
	pid int64
	// added are the partitions the transaction added; first holds the
	// offset of its first record acknowledged in each (none: unknown).
	// They are the Txn's own maps of the transaction, taken as it ended.
	added map[tp]bool
	first map[tp]int64
	// commit says EndTxn asked to commit: the coordinator may have decided
	// commit. Otherwise the transaction can only be aborted.
	commit bool
	// committed says EndTxn committed it: the coordinator decided commit.
	committed bool
	// faults is the Txn's count of coordinator failures when its EndTxn
	// was sent (see Txn.add).
	faults int
}

// decide is the end a doubt's orphans get: commit for a transaction that
// was committed, abort for one that was not asked to; for one whose commit
// has an unknown outcome, what a marker after one of its acknowledged
// records says, and abort when there is none anywhere: nothing of it is
// visible to any reader then, and aborting it all is consistent with every
// progress record it carried.
func (d *doubt) decide(markers map[tp]int) bool {
	switch {
	case d.committed:
		return true
	case !d.commit:
		return false
	}
	for _, m := range markers {
		if m == markerCommit {
			return true
		}
	}
	return false
}

// Settle makes sure no transaction this producer ran is left with records
// that no marker decides (see the package's notes on orphans): it is a
// no-op unless a transaction ended in doubt. Init calls it, and so does the
// first request of each transaction; a caller may call it before it reads
// back what the id's transactions wrote, so that it reads decided records.
// It returns an error when it could not settle before ctx ended; the
// producer then refuses to begin a transaction until it can.
func (t *Txn) Settle(ctx context.Context) error {
	if len(t.doubts) == 0 || !t.inited || t.open {
		return nil
	}

	t.p.mu.Lock()
	pid := t.p.id.pid
	t.p.mu.Unlock()
	for len(t.doubts) > 0 {
		d := t.doubts[0]
		if d.pid == pid { // else the epoch ran out: a new producer id can end none of the old one's
			if err := t.settle(ctx, d); err != nil {
				return err
			}
		}
		t.doubts = t.doubts[1:]
	}
	return nil
}

// settle ends d's orphans, and returns once a read finds none.
func (t *Txn) settle(ctx context.Context, d *doubt) error {
	wait, waits := 5*time.Millisecond, 0
	for {
		orphans, markers, err := t.scan(ctx, d)
		if err != nil {
			return fmt.Errorf("relay: transactional id %q: read back the partitions of a transaction that ended in doubt: %w", t.id, err)
		}
		if len(orphans) == 0 {
			return nil
		}
		if waits < 4 {
			// The markers of a transaction that just ended are written
			// after EndTxn returns: give them a moment first.
			sleepCtx(ctx, wait)
			wait, waits = 2*wait, waits+1
			continue
		}
		if err := t.sweep(ctx, orphans, d.decide(markers)); err != nil {
			return fmt.Errorf("relay: transactional id %q: end the records a transaction left without a marker on %v: %w", t.id, orphans, err)
		}
		wait, waits = 5*time.Millisecond, 0
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// sweep runs a transaction that adds parts, writes nothing, and ends with
// commit: the coordinator writes that marker to each of parts, which ends
// whatever records of the producer id are open there.
func (t *Txn) sweep(ctx context.Context, parts []tp, commit bool) error {
	lanes := make([]*plane, len(parts))
	for i, p := range parts {
		lanes[i] = &plane{tp: p}
	}
	if commit {
		// A commit given up halfway would be aborted by the coordinator,
		// and the records it is meant to commit with it.
		var cancel context.CancelFunc
		ctx, cancel = detached(ctx, t.timeout)
		defer cancel()
	}
	t.open = true
	if err := t.addPartitions(ctx, lanes); err != nil {
		t.open, t.added = false, nil
		return err
	}
	keep := t.doubts
	err := t.end(ctx, commit)
	t.doubts, t.last = keep, nil // the sweep's own end is checked by the next scan
	return err
}

// scan reads the tail of each partition of d and returns those where
// records of d's producer id are left without a marker, and for each
// partition where one came after the transaction's first acknowledged
// record, that marker's type.
func (t *Txn) scan(ctx context.Context, d *doubt) (orphans []tp, markers map[tp]int, err error) {
	markers = map[tp]int{}
	parts := slices.SortedFunc(maps.Keys(d.added), func(a, b tp) int {
		return cmp.Or(strings.Compare(a.topic, b.topic), cmp.Compare(a.partition, b.partition))
	})
	// The partitions are read concurrently (a broker call each).
	type result struct {
		open   bool
		marker int
		err    error
	}
	res := make([]result, len(parts))
	var wg sync.WaitGroup
	for i, p := range parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &res[i]
			first, ok := d.first[p]
			if !ok {
				first = -1
			}
			r.open, r.marker, r.err = t.tail(ctx, p, d.pid, first)
		}()
	}
	wg.Wait()
	for i, p := range parts {
		r := res[i]
		if r.err != nil {
			return nil, nil, r.err
		}
		if r.open {
			orphans = append(orphans, p)
		}
		if r.marker >= 0 {
			markers[p] = r.marker
		}
	}
	return orphans, markers, nil
}

// tail reads partition p from its last stable offset (or from first, the
// transaction's first acknowledged record there, when earlier) to its
// high-water mark, and reports whether records of producer pid are left
// without a marker at the end, and the type of pid's first marker after
// first (-1: none, or first unknown).
func (t *Txn) tail(ctx context.Context, p tp, pid, first int64) (open bool, marker int, err error) {
	marker = -1
	client := t.p.client
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			_ = client.RefreshMetadata(p.topic)
			sleepCtx(ctx, 100*time.Millisecond)
		}
		if err := ctx.Err(); err != nil {
			return false, -1, err
		}
		var leader *sarama.Broker
		if leader, err = client.Leader(p.topic, p.partition); err != nil {
			continue
		}
		var lso, hw int64
		if lso, err = stableOffset(client, leader, p.topic, p.partition); err == nil {
			hw, err = listOffset(client, leader, p.topic, p.partition, sarama.OffsetNewest)
		}
		if err != nil {
			_ = leader.Close()
			continue
		}
		from := lso
		if first >= 0 && first < from {
			from = first
		}
		batches, err := fetchRange(ctx, leader, p.topic, p.partition, from, hw)
		if err != nil {
			if errors.Is(err, ctx.Err()) {
				return false, -1, err
			}
			_ = leader.Close()
			continue
		}
		open, marker = false, -1
		for _, b := range batches {
			if b.ProducerID != pid {
				continue
			}
			if !b.Control {
				open = open || b.IsTransactional
				continue
			}
			open = false
			if first >= 0 && b.FirstOffset > first && marker < 0 && len(b.Records) > 0 && len(b.Records[0].Key) >= 4 {
				marker = int(binary.BigEndian.Uint16(b.Records[0].Key[2:4]))
			}
		}
		return open, marker, nil
	}
}

// SettleTopics settles the records of this producer id that an earlier
// holder of its transactional id (another process, which could not settle
// them itself) may have left without a marker on any partition of topics.
// Call it after Init, before the first transaction, with the topics the
// id's transactions write to.
//
// They are committed when the coordinator said, just before this Txn's
// first Init, that the id's last transaction was committed and nothing
// ended since (see describe.go): a broker that restarted right after that
// commit skipped their markers. Otherwise they are aborted: they belong to
// a transaction that did not commit, or the coordinator could not say (an
// older broker), and then abort is what they need unless the coordinator
// had decided to commit their transaction when it skipped their markers
// (every partition it skipped loses them, and any whose marker it did
// write keeps them).
func (t *Txn) SettleTopics(ctx context.Context, topics []string) error {
	if !t.inited {
		return fmt.Errorf("relay: transactional id %q: %w", t.id, ErrFenced)
	}
	t.p.mu.Lock()
	pid := t.p.id.pid
	t.p.mu.Unlock()
	d := &doubt{pid: pid, added: map[tp]bool{}, commit: t.priorCommitted, committed: t.priorCommitted}
	for _, topic := range topics {
		parts, err := t.p.client.Partitions(topic)
		if err != nil {
			if errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
				continue // gone, or never created: nothing of it to settle
			}
			return fmt.Errorf("relay: transactional id %q: partitions of topic %q: %w", t.id, topic, err)
		}
		for _, p := range parts {
			d.added[tp{topic, p}] = true
		}
	}
	if len(d.added) == 0 {
		return nil
	}
	t.doubts = append(t.doubts, d)
	return t.Settle(ctx)
}
