package unitofwork_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/unitofwork"
)

// BenchmarkNotifyCost measures what waking relays in other processes costs
// writers: business transactions (one UPDATE + one outbox event) per second
// with no NOTIFY, with a NOTIFY inside every transaction, and with the
// coalesced Notifier (at most one NOTIFY per 5ms, after the commit). The
// variants alternate in rounds of one second and the medians are reported,
// with their ratio to "none", so machine noise hits all of them alike.
//
//	go test -run '^$' -bench NotifyCost -benchtime 1x ./unitofwork
func BenchmarkNotifyCost(b *testing.B) {
	for _, writers := range []int{8, 32} {
		b.Run(fmt.Sprintf("writers=%d", writers), func(b *testing.B) {
			pool := testenv.Pool(b)
			tbl := testenv.Table(b, pool)
			ctx := context.Background()
			if _, err := pool.Exec(ctx, "CREATE TABLE "+tbl.Schema+".acct (id int PRIMARY KEY, n int NOT NULL)"); err != nil {
				b.Fatal(err)
			}
			if _, err := pool.Exec(ctx, "INSERT INTO "+tbl.Schema+".acct SELECT g, 0 FROM generate_series(0, 1023) g"); err != nil {
				b.Fatal(err)
			}
			notifier, err := unitofwork.NewNotifier(pool, tbl, 0, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer notifier.Close()
			plain, _ := unitofwork.New(pool, &unitofwork.Config{Table: tbl})
			coalesced, _ := unitofwork.New(pool, &unitofwork.Config{Table: tbl, OnCommit: notifier.OnCommit})
			update := "UPDATE " + tbl.Schema + ".acct SET n = n + 1 WHERE id = $1"
			variants := []struct {
				name string
				uow  *unitofwork.UnitOfWork
				in   bool // NOTIFY inside the transaction
			}{{"none", plain, false}, {"every", plain, true}, {"coalesced", coalesced, false}}
			rounds := 5
			if testing.Short() {
				rounds = 2
			}
			tps := make([][]float64, len(variants))
			for range rounds {
				for vi, v := range variants {
					var done atomic.Int64
					stop := time.Now().Add(time.Second)
					var wg sync.WaitGroup
					for w := range writers {
						wg.Add(1)
						go func() {
							defer wg.Done()
							for i := 0; time.Now().Before(stop); i++ {
								err := v.uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
									id := (w*997 + i) % 1024
									if _, err := tx.Exec(ctx, update, id); err != nil {
										return err
									}
									if v.in {
										if _, err := tx.Exec(ctx, "SELECT pg_notify($1, '')", tbl.Channel()); err != nil {
											return err
										}
									}
									return tx.Add(ctx, outbox.Event{AggregateType: "acct", AggregateID: fmt.Sprint(id), Type: "acct.changed", Topic: "t", Payload: map[string]int{"id": id}})
								})
								if err != nil {
									b.Error(err)
									return
								}
								done.Add(1)
							}
						}()
					}
					wg.Wait()
					tps[vi] = append(tps[vi], float64(done.Load()))
				}
			}
			med := func(xs []float64) float64 { s := slices.Clone(xs); slices.Sort(s); return s[len(s)/2] }
			base := med(tps[0])
			for vi, v := range variants {
				m := med(tps[vi])
				b.ReportMetric(m, v.name+"_tps")
				if vi > 0 {
					b.ReportMetric(m/base, v.name+"/none")
				}
			}
		})
	}
}
