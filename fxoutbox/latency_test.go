package fxoutbox_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/fxoutbox"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// BenchmarkCommitToConsume measures, for events written through Do and
// through AddTx in the caller's own transaction, the time from the commit
// to the consumer receiving the record, with the relay polling every 250ms
// in the same process (same_process) or in another application listening
// for the writers' NOTIFY (other_process). Events are written one at a time
// at random gaps, so they do not line up with the poll. p50 and p90 in ms.
//
//	go test -run '^$' -bench CommitToConsume -benchtime 1x ./fxoutbox
func BenchmarkCommitToConsume(b *testing.B) {
	for _, mode := range []string{"same_process", "other_process"} {
		b.Run(mode, func(b *testing.B) {
			pool := testenv.Pool(b)
			brokers := testenv.Brokers(b)
			tbl := testenv.Table(b, pool)
			topic := testenv.Topic(b, brokers, 1)
			cons := testenv.Consume(b, brokers, topic)
			cfg := fxoutbox.Config{Table: tbl, Brokers: brokers, Writer: unitofwork.Config{Service: "svc"}, Relay: relay.Config{PollInterval: 250 * time.Millisecond}}
			var uow *unitofwork.UnitOfWork
			var apps []*fxtest.App
			if mode == "same_process" {
				apps = append(apps, fxtest.New(b, fx.NopLogger, fx.Supply(pool, cfg), fxoutbox.Module, fx.Populate(&uow)))
			} else {
				apps = append(apps, fxtest.New(b, fx.NopLogger, fx.Supply(pool, cfg), fxoutbox.RelayModule),
					fxtest.New(b, fx.NopLogger, fx.Supply(pool, cfg), fxoutbox.WriterModule, fx.Populate(&uow)))
			}
			for _, a := range apps {
				a.RequireStart()
			}
			ctx := context.Background()
			const n = 60
			lat := map[string][]float64{}
			seen := 0
			for i := range n {
				ev := outbox.Event{AggregateType: "order", AggregateID: fmt.Sprint("o-", i), Type: "order.created.v1", Topic: topic}
				way := []string{"do", "addtx"}[i%2]
				time.Sleep(time.Duration(rand.IntN(100)) * time.Millisecond)
				var err error
				if way == "do" {
					err = uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error { return tx.Add(ctx, ev) })
				} else {
					err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return uow.AddTx(ctx, tx, ev) })
				}
				if err != nil {
					b.Fatal(err)
				}
				t0 := time.Now()
				seen++
				for len(cons.Messages()) < seen {
					if time.Since(t0) > 20*time.Second {
						b.Fatal("event not consumed within 20s")
					}
					time.Sleep(500 * time.Microsecond)
				}
				lat[way] = append(lat[way], float64(time.Since(t0).Microseconds())/1000)
			}
			for way, xs := range lat {
				slices.Sort(xs)
				b.ReportMetric(xs[len(xs)/2], way+"_p50_ms")
				b.ReportMetric(xs[len(xs)*9/10], way+"_p90_ms")
			}
			for _, a := range slices.Backward(apps) {
				a.RequireStop()
			}
		})
	}
}
