package faulttest

import (
	"fmt"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/fxoutbox/outbox/admin"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
)

// TestPoisonRequeuedRightAfterFix writes events for a topic that does not
// exist (Apache Kafka with auto.create.topics.enable=false: each fails for
// good and is parked at once) on five keys of their own, among a steady
// stream of good events, with two relays running. Then the fix: the topic
// is created and, at once (within the relays' memory of the missing
// topic), every parked event is requeued (admin.Requeue). Every requeued
// event must be delivered and none parked again; the good keys never wait
// and are never charged; nothing is lost, each key's first deliveries are
// in write order (the poison keys' events were all parked and requeued
// together, so they keep theirs), and duplicates stay within one batch per
// relay.
//
// Under OUTBOX_TEST_PROGRESS=cursor a requeue gives the rows a new
// transaction id, and the lanes' next windows take them as late rows.
// At-least-once only (real broker, the package's own).
func TestPoisonRequeuedRightAfterFix(t *testing.T) {
	b := faultBroker(t)
	if testDelivery(t) != relay.AtLeastOnce {
		t.Logf("%s=%v: this scenario runs at least once", envDelivery, testDelivery(t))
	}
	w := newWorldFor(t, testenv.Pool(t), b.brokers(), 30, relay.AtLeastOnce, relay.Poll)
	const (
		poisonKeys = 5
		perKey     = 10
		relays     = 2
	)
	missing := testenv.Name("test.missing.")
	if _, err := w.pool.Exec(w.ctx, "INSERT INTO "+w.account+" (id) SELECT 'poison-' || i FROM generate_series(0, $1 - 1) i", poisonKeys); err != nil {
		t.Fatal(err)
	}
	for range relays {
		w.startRelay(t)
	}
	ws := w.startWriters(t, 4)
	waitFor(t, 30*time.Second, "the relays to publish 200 events", func() bool { return w.published(t) >= 200 })

	for i := range poisonKeys * perKey {
		if err := w.commitTo(w.ctx, fmt.Sprintf("poison-%d", i%poisonKeys), missing); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	const total = poisonKeys * perKey
	parked := "topic = '" + missing + "' AND parked_at IS NOT NULL"
	took := waitFor(t, time.Minute, "the events for the missing topic to be parked", func() bool { return w.count(t, parked) == total })
	t.Logf("%d events for the missing topic %s parked %v after the last was written", total, missing, took.Round(time.Millisecond))
	if n := w.count(t, "topic <> '"+missing+"' AND (attempts > 0 OR parked_at IS NOT NULL)"); n != 0 {
		t.Errorf("%d good events charged or parked", n)
	}

	// The fix, and at once the requeue.
	testenv.CreateTopicDetail(t, w.brokers, missing, &sarama.TopicDetail{NumPartitions: 6, ReplicationFactor: 1})
	fixed := time.Now()
	n, err := admin.Requeue(w.ctx, w.pool, w.table, admin.Filter{Topic: missing}, nil)
	if err != nil || n != total {
		t.Fatalf("requeue = %d, %v; want %d requeued", n, err, total)
	}
	t.Logf("topic created and %d events requeued %v after it", n, time.Since(fixed).Round(time.Millisecond))
	took = waitFor(t, time.Minute, "the requeued events to be delivered", func() bool {
		return w.count(t, "topic = '"+missing+"' AND "+w.waiting()) == 0
	})
	t.Logf("the requeued events were delivered %v after the requeue", took.Round(time.Millisecond))
	time.Sleep(time.Second)
	if errs := ws.halt(); len(errs) > 0 {
		t.Errorf("%d writer commits failed, first: %v", len(errs), errs[0])
	}
	waitFor(t, time.Minute, "every row to be published", func() bool { return w.unpublished(t) == 0 })
	if n := w.count(t, "parked_at IS NOT NULL OR attempts > 0"); n != 0 {
		t.Errorf("%d events parked or charged after the requeue: a requeued event is sent whatever the relay remembers of its topic", n)
	}
	w.check(t, relays)
}
