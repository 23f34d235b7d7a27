package kafkaproducer

// AddedUntold marks partition of topic as added to t's open transaction
// without telling the coordinator: the transaction's records there get no
// marker when it ends, as when the coordinator skips a partition whose
// leader it cannot find.
func AddedUntold(t *Txn, topic string, partition int32) {
	if t.added == nil {
		t.added = map[tp]bool{}
	}
	t.added[tp{topic, partition}] = true
	t.open = true
}

// CoordinatorFailed counts a failure of t's coordinator, as a request
// retried after its connection broke (the coordinator restarted) does.
func CoordinatorFailed(t *Txn) { t.faults++ }
