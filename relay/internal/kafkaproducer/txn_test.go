package kafkaproducer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay/internal/kafkaproducer"
)

// txnSetup returns a context of a minute, a client of the test broker and a
// new topic of one partition.
func txnSetup(t *testing.T) (context.Context, sarama.Client, string) {
	t.Helper()
	brokers := testenv.Brokers(t)
	topic := testenv.Topic(t, brokers, 1)
	client, err := sarama.NewClient(brokers, config())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx, client, topic
}

// A transaction's records are visible to read_committed readers after
// Commit and never after Abort; a second Init of the same transactional id
// fences the first producer, whose open transaction is aborted and whose
// Commit fails with ErrFenced. LastCommitted sees exactly that.
func TestTxnCommitAbortFence(t *testing.T) {
	t.Parallel()
	ctx, client, topic := txnSetup(t)
	id := "kafkaproducer-test." + topic
	lastOf := func() kafkaproducer.Last {
		t.Helper()
		vals, err := kafkaproducer.LastCommitted(ctx, client, topic, 0, []string{"k", "never"})
		if err != nil {
			t.Fatal(err)
		}
		if n := vals["never"]; n.Found || len(n.Pending) > 0 {
			t.Fatal("LastCommitted found a key never written")
		}
		return vals["k"]
	}
	last := func() string { t.Helper(); return string(lastOf().Value) }
	produce := func(txn *kafkaproducer.Txn, v string) {
		t.Helper()
		for _, r := range txn.Produce(ctx, []kafkaproducer.Record{{Topic: topic, Key: []byte("k"), Value: []byte(v)}}) {
			if r.Err != nil {
				t.Fatalf("produce %s: %v", v, r.Err)
			}
		}
	}

	a := kafkaproducer.NewTxn(client, config(), id, 10*time.Second)
	if err := a.Init(ctx); err != nil {
		t.Fatal(err)
	}
	produce(a, "committed")
	if err := a.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	produce(a, "aborted") // right after a commit: CONCURRENT_TRANSACTIONS is retried
	if err := a.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	if got := last(); got != "committed" {
		t.Fatalf("after an abort, the last committed value is %q, want committed", got)
	}

	produce(a, "fenced")
	// Another producer's open transaction holds the last stable offset
	// back; what was decided after it is still read.
	other := kafkaproducer.NewTxn(client, config(), id+".other", 10*time.Second)
	if err := other.Init(ctx); err != nil {
		t.Fatal(err)
	}
	for _, r := range other.Produce(ctx, []kafkaproducer.Record{{Topic: topic, Key: []byte("x"), Value: []byte("open")}}) {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	if l := lastOf(); string(l.Value) != "committed" || len(l.Pending) != 1 || string(l.Pending[0]) != "fenced" {
		t.Fatalf("with a transaction open: last committed %q, pending %q; want committed and [fenced]", l.Value, l.Pending)
	}
	b := kafkaproducer.NewTxn(client, config(), id, 10*time.Second)
	if err := b.Init(ctx); err != nil { // fences a, aborts its open transaction
		t.Fatal(err)
	}
	if err := a.Commit(ctx); !errors.Is(err, kafkaproducer.ErrFenced) {
		t.Fatalf("the fenced producer's Commit = %v, want ErrFenced", err)
	}
	if a.Ready() {
		t.Fatal("a fenced producer says it is ready")
	}
	if got := last(); got != "committed" {
		t.Fatalf("after the fence, the last committed value is %q, want committed", got)
	}
	produce(b, "new owner")
	if err := b.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// Commit returns once the coordinator decided; it writes the commit
	// marker to the partition after that, so for a moment the record is
	// still undecided (pending), never anything else.
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		l := lastOf()
		if string(l.Value) == "new owner" && len(l.Pending) == 0 {
			return true, ""
		}
		if string(l.Value) != "committed" || len(l.Pending) != 1 || string(l.Pending[0]) != "new owner" {
			t.Fatalf("after the new owner's commit (another transaction still open): last committed %q, pending %q; want the new owner's, or committed and [new owner] until the marker is written", l.Value, l.Pending)
		}
		return false, "the new owner's record is still undecided after its commit"
	})
	if err := other.Abort(ctx); err != nil {
		t.Fatal(err)
	}
}

// Abort outlives its context: a batch whose time ran out still aborts its
// transaction, and learns that the producer was fenced.
func TestTxnAbortOutlivesItsContext(t *testing.T) {
	t.Parallel()
	ctx, client, topic := txnSetup(t)
	id := "kafkaproducer-abort-test." + topic
	a := kafkaproducer.NewTxn(client, config(), id, 10*time.Second)
	if err := a.Init(ctx); err != nil {
		t.Fatal(err)
	}
	for _, r := range a.Produce(ctx, []kafkaproducer.Record{{Topic: topic, Key: []byte("k"), Value: []byte("v")}}) {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	if err := kafkaproducer.NewTxn(client, config(), id, 10*time.Second).Init(ctx); err != nil { // fences a
		t.Fatal(err)
	}
	done, stop := context.WithCancel(ctx)
	stop()
	if err := a.Abort(done); !errors.Is(err, kafkaproducer.ErrFenced) {
		t.Fatalf("Abort with a cancelled context on a fenced producer = %v, want ErrFenced", err)
	}
	if a.Open() {
		t.Fatal("the transaction is still open after Abort")
	}
}
