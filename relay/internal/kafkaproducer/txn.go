package kafkaproducer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/IBM/sarama"
)

// ErrFenced says a transactional producer lost its transactional id to a
// newer initialisation (another relay took what the id stands for) or the
// coordinator forgot it: the producer must not be used again until Init
// succeeds, and what the caller knew of the id's transactions is stale.
var ErrFenced = errors.New("relay: transactional producer fenced: a newer owner initialised its transactional id")

// ErrTxnAborted says a transaction could not commit because the outcome of
// some of its records is unknown, or the producer was fenced: Commit
// refused it and aborted it (or left it to the coordinator to abort).
var ErrTxnAborted = errors.New("relay: transaction aborted")

// Txn is a transactional producer for one transactional id: the records of
// a transaction it runs become visible to read_committed consumers all
// together at Commit, or never. It is the Producer's produce path (ordered,
// idempotent, one batch in flight per partition) with the transactional
// requests around it: Init (FindCoordinator, InitProducerId with the id,
// which fences every earlier holder of the id and aborts its open
// transaction), AddPartitionsToTxn before the first record of each
// partition, EndTxn at Commit or Abort.
//
// A Txn is used by one goroutine at a time. It shares a connected client
// with other producers and never closes it.
type Txn struct {
	p       *Producer
	id      string
	timeout time.Duration

	open   bool         // a transaction is open: partitions were added
	added  map[tp]bool  // partitions added to the open transaction
	first  map[tp]int64 // offset of the open transaction's first record acknowledged per partition
	doomed error        // the open transaction cannot commit (see ErrTxnAborted)
	inited bool         // Init succeeded and nothing fenced the producer since
	doubts []*doubt     // transactions whose markers may be missing, oldest first (settle.go)
	last   *doubt       // the last transaction committed, until a doubt makes it one too
	// faults counts the coordinator's failures that a request retried
	// (no connection, NOT_COORDINATOR, loading): a coordinator that
	// restarted may have completed a commit skipping markers (see add).
	faults int
	// described: Init asked the coordinator how the id's last transaction
	// stood (describe.go); priorCommitted: it was committed, and the first
	// InitProducerID came right after it (SettleTopics commits its orphans).
	described      bool
	priorCommitted bool
}

// NewTxn returns a transactional producer with transactional id id and
// transaction timeout timeout on client, configured with conf (see New).
// It does no I/O: call Init first.
func NewTxn(client sarama.Client, conf *sarama.Config, id string, timeout time.Duration) *Txn {
	t := &Txn{p: New(client, conf), id: id, timeout: timeout}
	t.p.txn = t
	return t
}

// ID returns the transactional id.
func (t *Txn) ID() string { return t.id }

// Ready reports whether Init succeeded and nothing has fenced the producer
// since, as far as it knows.
func (t *Txn) Ready() bool { return t.inited }

// Init gets the producer id and epoch of the transactional id from its
// coordinator. The coordinator bumps the epoch: every earlier holder of the
// id is fenced (its requests fail with ErrFenced from now on) and a
// transaction it left open is aborted, or, if it was committing, completed
// first. When Init returns, every transaction of the id is decided, and
// its markers written where the coordinator found the partition's leader.
// It retries the coordinator's transient answers (CONCURRENT_TRANSACTIONS
// while it completes the previous transaction, COORDINATOR_LOAD_IN_PROGRESS,
// NOT_COORDINATOR) until ctx ends. Then it settles a transaction of this
// producer that ended in doubt (see Settle), and fails if it cannot. A
// Txn's first Init first asks the coordinator how the id's last
// transaction stands, for SettleTopics (see describe.go).
func (t *Txn) Init(ctx context.Context) error {
	// Init follows a failure (or starts the producer): an open transaction
	// is abandoned (the coordinator aborts it), and the last one committed
	// is checked too.
	t.noteDoubt(false)
	t.inited, t.open, t.added, t.first, t.doomed = false, false, nil, nil, nil
	var prior *priorTxn
	if !t.described {
		prior = t.describe(ctx)
	}
	req := &sarama.InitProducerIDRequest{Version: initProducerIDVersion(t.p.conf.Version), TransactionalID: &t.id,
		TransactionTimeout: t.timeout, ProducerID: -1, ProducerEpoch: -1}
	var resp *sarama.InitProducerIDResponse
	err := t.coordinated(ctx, "initialise transactional id", func(b *sarama.Broker) (sarama.KError, error) {
		var err error
		if resp, err = b.InitProducerID(req); err != nil {
			return 0, err
		}
		return resp.Err, nil
	})
	if err != nil {
		return err
	}
	t.p.mu.Lock()
	t.p.id, t.p.stale = identity{pid: resp.ProducerID, epoch: resp.ProducerEpoch, gen: t.p.id.gen + 1}, false
	t.p.mu.Unlock()
	t.priorCommitted = prior.committedJustBefore(resp.ProducerID, resp.ProducerEpoch)
	t.described = true
	t.inited = true
	if err := t.Settle(ctx); err != nil {
		t.inited = false
		return err
	}
	return nil
}

// Produce sends recs in the open transaction (opening one if none is),
// adding their partitions to it first, and returns each record's outcome
// as Producer.Produce does. A record acknowledged here is visible to
// read_committed consumers only after Commit. A record whose outcome is
// unknown (retries ran out, the producer was fenced) dooms the transaction:
// Commit will abort it.
func (t *Txn) Produce(ctx context.Context, recs []Record) []Result {
	out := make([]Result, len(recs))
	if len(recs) == 0 {
		return out
	}
	if !t.inited {
		for i := range out {
			out[i] = Result{Err: fmt.Errorf("relay: transactional id %q: %w", t.id, ErrFenced)}
		}
		return out
	}
	if err := t.Settle(ctx); err != nil {
		for i := range out {
			out[i] = Result{Err: err}
		}
		return out
	}
	t.open = true
	for i, err := range t.p.publish(ctx, recs, out) {
		out[i] = outcome(err)
	}
	return out
}

// noteAcked notes the base offset of a record batch of the open transaction
// acknowledged in partition p: the first one is where the transaction
// starts there (see doubt). The Producer's hook, once per record batch.
func (t *Txn) noteAcked(p tp, base int64) {
	if _, ok := t.first[p]; ok || base < 0 {
		return
	}
	if t.first == nil {
		t.first = map[tp]int64{}
	}
	t.first[p] = base
}

// addPartitions adds the partitions of lanes that the open transaction
// does not have yet; it is the Producer's hook before a call's first wave.
func (t *Txn) addPartitions(ctx context.Context, lanes []*plane) error {
	parts := map[string][]int32{}
	var fresh []tp
	for _, l := range lanes {
		if !t.added[l.tp] {
			parts[l.tp.topic] = append(parts[l.tp.topic], l.tp.partition)
			fresh = append(fresh, l.tp)
		}
	}
	if len(fresh) == 0 {
		return nil
	}
	for _, ps := range parts {
		slices.Sort(ps)
	}
	t.p.mu.Lock()
	id := t.p.id
	t.p.mu.Unlock()
	req := &sarama.AddPartitionsToTxnRequest{TransactionalID: t.id, ProducerID: id.pid, ProducerEpoch: id.epoch, TopicPartitions: parts}
	req.Version = t.requestVersion()
	err := t.coordinated(ctx, "add partitions to the transaction", func(b *sarama.Broker) (sarama.KError, error) {
		resp, err := b.AddPartitionsToTxn(req)
		if err != nil {
			return 0, err
		}
		// Every partition answers with the same error when one fails
		// (the others OPERATION_NOT_ATTEMPTED): the worst one counts.
		worst := sarama.ErrNoError
		for _, pes := range resp.Errors {
			for _, pe := range pes {
				if pe.Err != sarama.ErrNoError && (worst == sarama.ErrNoError || worst == sarama.ErrOperationNotAttempted) {
					worst = pe.Err
				}
			}
		}
		return worst, nil
	})
	if err != nil {
		return err
	}
	if t.added == nil {
		t.added = map[tp]bool{}
	}
	for _, p := range fresh {
		t.added[p] = true
	}
	return nil
}

// add adds the partitions of lanes to the open transaction, as
// addPartitions does; it is the first request of each transaction, Begin's
// or the produce path's.
//
// The first request after a commit may find a coordinator that restarted
// since it was asked to commit: one that completes a commit it loaded
// skips the markers of the partitions whose leader it cannot find (see the
// package's notes on orphans), and the committed records there wait for
// the next marker of the producer id. Should this transaction then abort
// (as it likely will, its partitions without a leader for a while), its
// marker would abort them. So when the coordinator failed (t.faults)
// since the last commit was asked for, the last commit is settled first,
// before this transaction writes anything: an empty transaction already
// open is committed (its markers commit those records where it added
// partitions) and the last commit's partitions are read back (Settle), and
// then the partitions are added again.
func (t *Txn) add(ctx context.Context, lanes []*plane) error {
	if len(t.added) > 0 || t.last == nil {
		return t.addPartitions(ctx, lanes)
	}
	if t.faults == t.last.faults {
		err := t.addPartitions(ctx, lanes)
		if err != nil || t.faults == t.last.faults {
			return err
		}
	}
	t.doubts, t.last = append(t.doubts, t.last), nil
	if len(t.added) > 0 {
		dctx, cancel := detached(ctx, t.timeout)
		err := t.end(dctx, true)
		cancel()
		if err != nil {
			return err
		}
		t.last = nil // nothing of its own: the doubt before it covers its partitions
	}
	t.open = false
	err := t.Settle(ctx)
	t.open = true
	if err != nil {
		return err
	}
	return t.addPartitions(ctx, lanes)
}

// detached returns a context that outlives ctx's cancellation, bounded by
// timeout: for requests that must not be given up halfway, a transaction
// that commits what an earlier commit left without a marker (one given up
// would be aborted by the coordinator, and those records with it).
func detached(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), timeout)
}

// Commit commits the open transaction: its acknowledged records become
// visible to read_committed consumers. It commits nothing and returns
// ErrTxnAborted (after aborting) when the transaction is doomed: a record's
// outcome is unknown or the producer was fenced. An error from EndTxn
// itself leaves the outcome unknown: the caller must treat the id's
// transactions as unknown until the next Init (which decides it).
// Without an open transaction Commit does nothing.
func (t *Txn) Commit(ctx context.Context) error {
	if !t.open {
		return nil
	}
	if t.doomed != nil {
		cause := t.doomed
		_ = t.Abort(ctx)
		return fmt.Errorf("%w: %w", ErrTxnAborted, cause)
	}
	return t.end(ctx, true)
}

// Abort aborts the open transaction, if any: none of its records becomes
// visible to read_committed consumers. It outlives ctx's cancellation and
// deadline, up to the transaction timeout (the coordinator aborts the
// transaction then anyway): a batch whose time ran out still ends its
// transaction, and learns from the answer whether the producer was fenced
// (ErrFenced).
func (t *Txn) Abort(ctx context.Context) error {
	if !t.open {
		return nil
	}
	dctx, cancel := detached(ctx, t.timeout)
	defer cancel()
	return t.end(dctx, false)
}

func (t *Txn) end(ctx context.Context, commit bool) error {
	defer func() { t.open, t.added, t.first, t.doomed = false, nil, nil, nil }()
	if len(t.added) == 0 {
		return nil // nothing reached the coordinator: no transaction to end
	}
	t.p.mu.Lock()
	id := t.p.id
	t.p.mu.Unlock()
	faults := t.faults
	req := &sarama.EndTxnRequest{TransactionalID: t.id, ProducerID: id.pid, ProducerEpoch: id.epoch, TransactionResult: commit}
	req.Version = t.requestVersion()
	what := "abort the transaction"
	if commit {
		what = "commit the transaction"
	}
	err := t.coordinated(ctx, what, func(b *sarama.Broker) (sarama.KError, error) {
		resp, err := b.EndTxn(req)
		if err != nil {
			return 0, err
		}
		return resp.Err, nil
	})
	switch {
	case err != nil:
		// The outcome is unknown (or the producer is fenced): only Init
		// decides it, and then settles its markers.
		t.inited = false
		t.noteDoubt(commit)
	case !commit:
		// Aborted, most often because a partition had no leader: the
		// coordinator may have skipped that partition's marker.
		t.noteDoubt(false)
	default:
		t.last = t.txnDoubt()
		t.last.commit, t.last.committed, t.last.faults = true, true, faults
	}
	return err
}

// txnDoubt describes the open transaction as a doubt. It takes the
// transaction's maps, which the Txn lets go of as the transaction ends.
func (t *Txn) txnDoubt() *doubt {
	t.p.mu.Lock()
	pid := t.p.id.pid
	t.p.mu.Unlock()
	return &doubt{pid: pid, added: t.added, first: t.first}
}

// noteDoubt remembers the open transaction as one whose markers may be
// missing (see Settle), after the last one committed; commit says EndTxn
// asked to commit it.
func (t *Txn) noteDoubt(commit bool) {
	if t.last != nil {
		t.doubts, t.last = append(t.doubts, t.last), nil
	}
	if len(t.added) == 0 {
		return
	}
	d := t.txnDoubt()
	d.commit = commit
	t.doubts = append(t.doubts, d)
}

// doom says the open transaction cannot commit; a fenced producer also
// needs Init.
func (t *Txn) doom(err error) {
	if t.doomed == nil {
		t.doomed = err
	}
	if errors.Is(err, ErrFenced) {
		t.inited = false
	}
}

// requestVersion is the version of AddPartitionsToTxn and EndTxn that
// sarama's own transaction manager uses with the configured Kafka version.
func (t *Txn) requestVersion() int16 {
	v := t.p.conf.Version
	switch {
	case v.IsAtLeast(sarama.V2_8_0_0):
		return 3
	case v.IsAtLeast(sarama.V2_7_0_0):
		return 2
	case v.IsAtLeast(sarama.V2_0_0_0):
		return 1
	}
	return 0
}

// coordinated runs a request on the transaction coordinator of t's id,
// retrying transient answers with backoff until ctx ends: connection errors
// and NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE (after looking up the
// coordinator again), COORDINATOR_LOAD_IN_PROGRESS, and
// CONCURRENT_TRANSACTIONS, which a coordinator answers while it still
// writes the markers of the id's previous transaction (it comes right
// after a commit: sarama's own transaction manager does not retry it,
// IBM/sarama#2859). A fencing answer (PRODUCER_FENCED,
// INVALID_PRODUCER_EPOCH, INVALID_PRODUCER_ID_MAPPING) returns ErrFenced at
// once.
func (t *Txn) coordinated(ctx context.Context, what string, do func(*sarama.Broker) (sarama.KError, error)) error {
	backoff := time.Millisecond // CONCURRENT_TRANSACTIONS lasts a few ms
	var last error
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			if ctx.Err() != nil {
				return fmt.Errorf("relay: %s (transactional id %q): %w (last: %w)", what, t.id, ctx.Err(), last)
			}
			if errors.Is(last, sarama.ErrConcurrentTransactions) && attempt <= 50 {
				// The previous transaction's markers are being written: it
				// takes a few ms; ask again each millisecond rather than
				// back off (the next batch waits on it).
				sleepCtx(ctx, time.Millisecond)
			} else {
				sleepCtx(ctx, backoff)
				backoff = min(2*backoff, 200*time.Millisecond)
			}
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("relay: %s (transactional id %q): %w", what, t.id, err)
		}
		b, err := t.p.client.TransactionCoordinator(t.id)
		if err != nil {
			last = err
			t.faults++
			_ = t.p.client.RefreshTransactionCoordinator(t.id)
			continue
		}
		kerr, err := do(b)
		switch {
		case err != nil:
			_ = b.Close()
			last = fmt.Errorf("via broker %s: %w", b.Addr(), err)
			t.faults++
			_ = t.p.client.RefreshTransactionCoordinator(t.id)
			continue
		case kerr == sarama.ErrNoError:
			return nil
		case kerr == sarama.ErrNotCoordinatorForConsumer || kerr == sarama.ErrConsumerCoordinatorNotAvailable:
			last = kerr
			t.faults++
			_ = t.p.client.RefreshTransactionCoordinator(t.id)
			continue
		case kerr == sarama.ErrOffsetsLoadInProgress || kerr == sarama.ErrConcurrentTransactions ||
			kerr == sarama.ErrRequestTimedOut || kerr == sarama.ErrNotEnoughReplicas || kerr == sarama.ErrNotEnoughReplicasAfterAppend:
			last = kerr
			if kerr == sarama.ErrOffsetsLoadInProgress {
				t.faults++
			}
			continue
		case kerr == sarama.ErrProducerFenced || kerr == sarama.ErrInvalidProducerEpoch || kerr == sarama.ErrInvalidProducerIDMapping ||
			kerr == sarama.ErrInvalidTxnState: // the coordinator aborted the transaction under it
			t.inited = false
			return fmt.Errorf("relay: %s (transactional id %q): %w (%w)", what, t.id, ErrFenced, namedKError{kerr})
		default:
			return fmt.Errorf("relay: %s (transactional id %q): %w", what, t.id, kerr)
		}
	}
}

// Begin opens a transaction (if none is open) and adds partition
// partition of topic to it. It is the first request of a transaction that
// will write there anyway, and it proves early that the producer is not
// fenced: ErrFenced says it is (Init, then read what the id's last owner
// committed).
func (t *Txn) Begin(ctx context.Context, topic string, partition int32) error {
	if !t.inited {
		return fmt.Errorf("relay: transactional id %q: %w", t.id, ErrFenced)
	}
	if err := t.Settle(ctx); err != nil {
		return err
	}
	t.open = true
	if err := t.add(ctx, []*plane{{tp: tp{topic, partition}}}); err != nil {
		t.doom(err)
		return err
	}
	return nil
}

// Open reports whether a transaction is open (Begin or Produce ran since
// the last Commit or Abort).
func (t *Txn) Open() bool { return t.open }

// Invalidate makes the producer need Init before its next transaction: the
// caller lost track of what its transactions did (its database marks of a
// committed transaction failed).
func (t *Txn) Invalidate() { t.inited = false }

// namedKError is a sarama.KError that says its name where sarama's text
// does not know the code (PRODUCER_FENCED, 90, in this sarama).
type namedKError struct{ sarama.KError }

func (e namedKError) Error() string {
	if e.KError == sarama.ErrProducerFenced {
		return "kafka server: PRODUCER_FENCED (error code 90): a producer with a newer epoch of the transactional id exists"
	}
	return e.KError.Error()
}

func (e namedKError) Unwrap() error { return e.KError }
