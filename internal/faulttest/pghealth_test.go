package faulttest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// TestHealthAfterPostgresRestart stops PostgreSQL for 15 s under a relay
// with no traffic, then starts it again. While it is down, Health names the
// database. The relay's batches fail meanwhile and its worker backs off
// (doubling up to the default MaxBackoff of 30s, so it sleeps for seconds
// when the server is back); no event is written after the restart. Health
// must report healthy within seconds of the restart anyway: a batch with
// nothing to publish proves the database answers, and a check that sees the
// database and the broker answer cuts the backoff short. (Before, the
// relay stayed unhealthy until an event was published, and blamed the
// broker.)
//
// It needs the PostgreSQL server binaries (a cluster of its own, see
// TestRelaySurvivesPostgresRestart) and KAFKA_BROKERS.
func TestHealthAfterPostgresRestart(t *testing.T) {
	brokers := testenv.Brokers(t)
	pg := ownPG(t)
	pool := pg.pool(t)
	ctx := context.Background()
	tbl := testenv.Table(t, pool)
	delivery := testDelivery(t)
	progress := progressFor(t, delivery, relay.Poll)
	if progress == relay.ProgressCursor {
		cursorReady(t, pool, tbl)
	}
	topic := testenv.Topic(t, brokers, 3)
	pub, err := relay.NewSaramaPublisher(brokers, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := relay.New(pool, pub, &relay.Config{Table: tbl, PollInterval: 100 * time.Millisecond, Delivery: delivery, Progress: progress})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = r.Stop(ctx)
		_ = pub.Close()
	})
	uow, err := unitofwork.New(pool, &unitofwork.Config{Service: "health", Table: tbl, OnCommit: func(int) { r.Wake() }})
	if err != nil {
		t.Fatal(err)
	}
	if err := uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		return tx.Add(ctx, outbox.Event{AggregateType: "acct", AggregateID: "a1", Type: "acct.opened.v1", Topic: topic, Payload: map[string]int{"seq": 1}})
	}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "a healthy relay that published the event", func() bool {
		var n int
		_ = pool.QueryRow(ctx, "SELECT count(*) FROM "+sqlname.Ident(tbl)+" WHERE "+waitingSQL(tbl, progress)).Scan(&n)
		return n == 0 && r.Health(ctx, 0) == nil
	})

	if _, _, err := pg.run(2*time.Minute, "down"); err != nil {
		t.Fatal(err)
	}
	down := time.Now()
	check := func() error {
		hctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		return r.Health(hctx, 0)
	}
	var he *relay.HealthError
	if err := check(); !errors.As(err, &he) || he.Check != "database" {
		t.Errorf("Health with PostgreSQL down = %v, want a database failure", err)
	}
	time.Sleep(15*time.Second - time.Since(down))
	if _, _, err := pg.run(2*time.Minute, "up"); err != nil {
		t.Fatal(err)
	}
	up := time.Now()
	took := waitFor(t, 10*time.Second, "a healthy relay after the restart, with no new event", func() bool { return check() == nil })
	t.Logf("healthy %v after PostgreSQL accepted connections again (down %v)", took.Round(time.Millisecond), up.Sub(down).Round(time.Second))
}
