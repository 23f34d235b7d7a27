package kafkaproducer_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay/internal/kafkaproducer"
)

// A transaction's records that no marker decides (the coordinator skipped
// their partition: it found no leader for it, as while a restarted broker
// is fenced) are ended before the producer's next transaction, as the
// coordinator decided: an aborted transaction's stay invisible instead of
// being committed by the next transaction's marker, and a committed one's
// become visible when a failure makes the producer check its last commit.
//
// The orphans are made with Apache Kafka's partition verification off (a
// broker then accepts a transaction's records on a partition the
// coordinator was never told of): kfake always verifies.
func TestTxnSettlesRecordsWithoutMarker(t *testing.T) {
	ctx, brokers, client := unverified(t)

	for _, tc := range []struct {
		name   string
		commit bool // the orphan's transaction commits; else it aborts
	}{{"aborted", false}, {"committed", true}} {
		t.Run(tc.name, func(t *testing.T) {
			orphans := testenv.Topic(t, brokers, 1)
			other := testenv.Topic(t, brokers, 1)
			txn := kafkaproducer.NewTxn(client, config(), "kafkaproducer-test."+orphans, 10*time.Second)
			if err := txn.Init(ctx); err != nil {
				t.Fatal(err)
			}
			produce := func(recs ...kafkaproducer.Record) {
				t.Helper()
				for _, r := range txn.Produce(ctx, recs) {
					if r.Err != nil {
						t.Fatalf("produce: %v", r.Err)
					}
				}
			}
			kafkaproducer.AddedUntold(txn, orphans, 0)
			produce(kafkaproducer.Record{Topic: orphans, Key: []byte("orphan"), Value: []byte("1")},
				kafkaproducer.Record{Topic: other, Key: []byte("told"), Value: []byte("1")})
			end := txn.Abort
			if tc.commit {
				end = txn.Commit
			}
			if err := end(ctx); err != nil {
				t.Fatal(err)
			}
			// The marker went to the partition the coordinator knows of
			// only: the orphan holds its partition's last stable offset.
			waitStable(ctx, t, client, other)
			if stable(t, client, orphans) {
				t.Fatal("test bug: the orphan's partition is stable: the broker verified the partition (verification still on?)")
			}
			if tc.commit {
				// A failure since (the producer needs Init): Init checks
				// the last commit too, and commits what it left undecided.
				txn.Invalidate()
				if err := txn.Init(ctx); err != nil {
					t.Fatal(err)
				}
			}
			// The next transaction writes to the orphan's partition, and
			// ends the other way: its marker must not decide the orphan.
			produce(kafkaproducer.Record{Topic: orphans, Key: []byte("next"), Value: []byte("1")})
			end = txn.Commit
			if tc.commit {
				end = txn.Abort
			}
			if err := end(ctx); err != nil {
				t.Fatal(err)
			}
			produce(kafkaproducer.Record{Topic: orphans, Key: []byte("last"), Value: []byte("1")})
			if err := txn.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			waitStable(ctx, t, client, orphans)
			vals, err := kafkaproducer.LastCommitted(ctx, client, orphans, 0, []string{"orphan", "next", "last"})
			if err != nil {
				t.Fatal(err)
			}
			if vals["next"].Found == tc.commit || !vals["last"].Found {
				t.Errorf("the later transactions' records: committed %v and %v, want %v and true", vals["next"].Found, vals["last"].Found, !tc.commit)
			}
			if got := vals["orphan"].Found; got != tc.commit {
				t.Errorf("the record left without a marker by a transaction that %s: committed %v, want %v",
					map[bool]string{false: "aborted", true: "committed"}[tc.commit], got, tc.commit)
			}
		})
	}
}

// A producer that takes a transactional id over (another process left
// records of it without a marker) settles them with SettleTopics, given the
// topics the id writes to: they are aborted, not committed by its first
// transaction.
func TestTxnSettleTopicsAfterTakeOver(t *testing.T) {
	ctx, brokers, client := unverified(t)
	orphans := testenv.Topic(t, brokers, 2)
	id := "kafkaproducer-test." + orphans
	old := kafkaproducer.NewTxn(client, config(), id, 10*time.Second)
	if err := old.Init(ctx); err != nil {
		t.Fatal(err)
	}
	kafkaproducer.AddedUntold(old, orphans, 0)
	kafkaproducer.AddedUntold(old, orphans, 1)
	for _, r := range old.Produce(ctx, []kafkaproducer.Record{{Topic: orphans, Key: []byte("orphan"), Value: []byte("1")}}) {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	// The old holder is gone without ending its transaction: the
	// coordinator knows none of its partitions.
	taker := kafkaproducer.NewTxn(client, config(), id, 10*time.Second)
	if err := taker.Init(ctx); err != nil {
		t.Fatal(err)
	}
	if err := taker.SettleTopics(ctx, []string{orphans}); err != nil {
		t.Fatal(err)
	}
	for _, r := range taker.Produce(ctx, []kafkaproducer.Record{{Topic: orphans, Key: []byte("orphan"), Value: []byte("2")}, {Topic: orphans, Key: []byte("next"), Value: []byte("2")}}) {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	if err := taker.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for p := range int32(2) {
		// Keyed as the old holder's record, the taker's went to the same
		// partition, and is the last committed there: read the partition
		// before it.
		vals, err := kafkaproducer.LastCommitted(ctx, client, orphans, p, []string{"orphan", "next"})
		if err != nil {
			t.Fatal(err)
		}
		if l := vals["orphan"]; len(l.Pending) > 0 {
			t.Errorf("partition %d: %d records still undecided after the taker's commit", p, len(l.Pending))
		}
		if got := committedValues(t, client, orphans, p); slices.Contains(got, "1") {
			t.Errorf("partition %d: the old holder's record was committed by the taker's transaction (committed values %v)", p, got)
		}
	}
}

// A producer that takes a transactional id over settles, with
// SettleTopics, the records that the id's last transaction left without a
// marker: when that transaction was committed (the previous holder saw the
// commit, then its broker restarted and skipped the markers, and the
// holder died), they are committed, not aborted, and the taker's first
// transaction, which aborts, leaves them so.
func TestTxnSettleTopicsCommitsWhatACommitLeft(t *testing.T) {
	ctx, brokers, client := unverified(t)
	_, orphans, other := committedOrphan(ctx, t, client, brokers)
	taker := kafkaproducer.NewTxn(client, config(), "kafkaproducer-test."+orphans, 10*time.Second)
	if err := taker.Init(ctx); err != nil {
		t.Fatal(err)
	}
	if err := taker.SettleTopics(ctx, []string{orphans, other}); err != nil {
		t.Fatal(err)
	}
	mustProduce(ctx, t, taker, kafkaproducer.Record{Topic: orphans, Key: []byte("next"), Value: []byte("2")})
	if err := taker.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	waitStable(ctx, t, client, orphans)
	if got := committedValues(t, client, orphans, 0); !slices.Equal(got, []string{"1"}) {
		t.Errorf("committed values %v, want [1]: the committed transaction's record left without a marker must stay committed, the taker's aborted one not", got)
	}
}

// A producer whose coordinator failed between a commit and its next
// transaction (counted here as a retried request counts it) settles that commit
// before the next transaction writes: a coordinator that restarted may
// have skipped the commit's markers, and the next transaction's abort
// would then abort the committed records.
func TestTxnSettlesACommitAfterCoordinatorFault(t *testing.T) {
	ctx, brokers, client := unverified(t)
	txn, orphans, _ := committedOrphan(ctx, t, client, brokers)
	kafkaproducer.CoordinatorFailed(txn)
	mustProduce(ctx, t, txn, kafkaproducer.Record{Topic: orphans, Key: []byte("next"), Value: []byte("2")})
	if err := txn.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	waitStable(ctx, t, client, orphans)
	if got := committedValues(t, client, orphans, 0); !slices.Equal(got, []string{"1"}) {
		t.Errorf("committed values %v, want [1]: the committed record left without a marker must stay committed, the next transaction's aborted one not", got)
	}
}

// committedOrphan makes a transaction, of the id "kafkaproducer-test." +
// orphans, that commits a record on partition 0 of orphans without a
// marker (the coordinator never knew of that partition) and one on other
// with its marker, and returns its producer and the two topics.
func committedOrphan(ctx context.Context, t *testing.T, client sarama.Client, brokers []string) (txn *kafkaproducer.Txn, orphans, other string) {
	t.Helper()
	orphans, other = testenv.Topic(t, brokers, 1), testenv.Topic(t, brokers, 1)
	txn = kafkaproducer.NewTxn(client, config(), "kafkaproducer-test."+orphans, 10*time.Second)
	if err := txn.Init(ctx); err != nil {
		t.Fatal(err)
	}
	kafkaproducer.AddedUntold(txn, orphans, 0)
	mustProduce(ctx, t, txn, kafkaproducer.Record{Topic: orphans, Key: []byte("orphan"), Value: []byte("1")},
		kafkaproducer.Record{Topic: other, Key: []byte("told"), Value: []byte("1")})
	if err := txn.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitStable(ctx, t, client, other)
	if stable(t, client, orphans) {
		t.Fatal("test bug: the orphan's partition is stable: the broker verified the partition (verification still on?)")
	}
	return txn, orphans, other
}

// mustProduce produces recs in txn's transaction and fails the test on any
// record's error.
func mustProduce(ctx context.Context, t *testing.T, txn *kafkaproducer.Txn, recs ...kafkaproducer.Record) {
	t.Helper()
	for _, r := range txn.Produce(ctx, recs) {
		if r.Err != nil {
			t.Fatalf("produce: %v", r.Err)
		}
	}
}

// committedValues reads partition p of topic read_committed and returns
// the values of its records.
func committedValues(t *testing.T, client sarama.Client, topic string, p int32) []string {
	t.Helper()
	leader, err := client.Leader(topic, p)
	if err != nil {
		t.Fatal(err)
	}
	req := &sarama.FetchRequest{Version: 11, MaxWaitTime: 100, MinBytes: 1, MaxBytes: 1 << 20, Isolation: sarama.ReadCommitted}
	req.AddBlock(topic, p, 0, 1<<20, -1)
	resp, err := leader.Fetch(req)
	if err != nil {
		t.Fatal(err)
	}
	blk := resp.GetBlock(topic, p)
	if blk == nil || blk.Err != sarama.ErrNoError {
		t.Fatalf("fetch %s/%d: %v", topic, p, blk)
	}
	// A producer's records are aborted from the first offset of one of its
	// aborted transactions to its next marker (as a read_committed consumer
	// reads them).
	var pending []*sarama.AbortedTransaction
	pending = append(pending, blk.AbortedTransactions...)
	slices.SortFunc(pending, func(a, b *sarama.AbortedTransaction) int { return int(a.FirstOffset - b.FirstOffset) })
	aborted := map[int64]bool{}
	var out []string
	for _, rs := range blk.RecordsSet {
		b := rs.RecordBatch
		if b == nil {
			continue
		}
		for len(pending) > 0 && pending[0].FirstOffset <= b.FirstOffset {
			aborted[pending[0].ProducerID] = true
			pending = pending[1:]
		}
		if b.Control {
			delete(aborted, b.ProducerID)
			continue
		}
		if b.IsTransactional && aborted[b.ProducerID] {
			continue
		}
		for _, r := range b.Records {
			out = append(out, string(r.Value))
		}
	}
	return out
}

// unverified skips the test without Apache Kafka, turns the broker's
// partition verification off for the test (a broker then accepts a
// transaction's records on a partition the coordinator was never told of)
// and returns a context of two minutes, the brokers and a client.
func unverified(t *testing.T) (context.Context, []string, sarama.Client) {
	t.Helper()
	testenv.RealKafka(t)
	brokers := testenv.Brokers(t)
	admin, err := sarama.NewClusterAdmin(brokers, config())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close() })
	off := "false"
	if err := admin.IncrementalAlterConfig(sarama.BrokerResource, "", map[string]sarama.IncrementalAlterConfigsEntry{
		"transaction.partition.verification.enable": {Operation: sarama.IncrementalAlterConfigsOperationSet, Value: &off},
	}, false); err != nil {
		t.Fatalf("turn partition verification off: %v", err)
	}
	t.Cleanup(func() {
		_ = admin.IncrementalAlterConfig(sarama.BrokerResource, "", map[string]sarama.IncrementalAlterConfigsEntry{
			"transaction.partition.verification.enable": {Operation: sarama.IncrementalAlterConfigsOperationDelete},
		}, false)
	})
	client, err := sarama.NewClient(brokers, config())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx, brokers, client
}

// stable reports whether topic's partition 0 has no undecided transaction.
func stable(t *testing.T, client sarama.Client, topic string) bool {
	t.Helper()
	leader, err := client.Leader(topic, 0)
	if err != nil {
		t.Fatal(err)
	}
	offset := func(iso sarama.IsolationLevel) int64 {
		req := sarama.NewOffsetRequest(client.Config().Version)
		req.IsolationLevel = iso
		req.AddBlock(topic, 0, sarama.OffsetNewest, 1)
		resp, err := leader.GetAvailableOffsets(req)
		if err != nil {
			t.Fatal(err)
		}
		blk := resp.GetBlock(topic, 0)
		if blk == nil || blk.Err != sarama.ErrNoError {
			t.Fatalf("list offsets of %s: %v", topic, blk)
		}
		return blk.Offset
	}
	return offset(sarama.ReadCommitted) == offset(sarama.ReadUncommitted)
}

// waitStable waits until topic's partition 0 is stable.
func waitStable(ctx context.Context, t *testing.T, client sarama.Client, topic string) {
	t.Helper()
	for !stable(t, client, topic) {
		if ctx.Err() != nil {
			t.Fatalf("%s: a transaction is still undecided", topic)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
