package unitofwork_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/unitofwork"
)

// BenchmarkNotifyCost measures what waking relays in other processes costs
// writers: business transactions (one UPDATE + one outbox event) per second
// with no NOTIFY, with a NOTIFY inside every transaction, and with the
// coalesced Notifier (at most one NOTIFY per 10ms, after the commit). The
// variants alternate in rounds of one second and the medians are reported,
// with their ratio to "none", so machine noise hits all of them alike.
//
//	go test -run '^$' -bench NotifyCost -benchtime 1x ./unitofwork
func BenchmarkNotifyCost(b *testing.B) {
	for _, writers := range []int{8, 32} {
		b.Run(fmt.Sprintf("writers=%d", writers), func(b *testing.B) {
			// pgxpool's default size on this machine (4 on 2 cores): writers
			// queue for connections, as in a default-configured service.
			cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
			if err != nil {
				b.Fatal(err)
			}
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer pool.Close()
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
										if _, err := tx.Exec(ctx, "SELECT pg_notify($1, '')", sqlname.Channel(tbl)); err != nil {
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

// BenchmarkWriteOverhead measures the latency a single writer pays for one
// outbox event on a one-statement business transaction (an UPDATE of one
// row): the plain transaction, the same with tx.Add of one event, and the
// same with a hand-written INSERT of that row instead of the library. The
// variants alternate in rounds of one second; medians of the per-round
// median latencies are reported, and the added latency against "plain".
//
//	go test -run '^$' -bench WriteOverhead -benchtime 1x ./unitofwork
func BenchmarkWriteOverhead(b *testing.B) {
	pool := testenv.Pool(b)
	tbl := testenv.Table(b, pool)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "CREATE TABLE "+tbl.Schema+".acct (id int PRIMARY KEY, n int NOT NULL)"); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "INSERT INTO "+tbl.Schema+".acct SELECT g, 0 FROM generate_series(0, 1023) g"); err != nil {
		b.Fatal(err)
	}
	uow, _ := unitofwork.New(pool, &unitofwork.Config{Table: tbl, Service: "bench"})
	update := "UPDATE " + tbl.Schema + ".acct SET n = n + 1 WHERE id = $1"
	raw := "INSERT INTO " + sqlname.Ident(tbl) + " (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, headers) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
	variants := []struct {
		name string
		body func(ctx context.Context, tx unitofwork.Tx, id int) error
	}{
		{"plain", func(ctx context.Context, tx unitofwork.Tx, id int) error { return nil }},
		{"outbox1", func(ctx context.Context, tx unitofwork.Tx, id int) error {
			return tx.Add(ctx, outbox.Event{AggregateType: "acct", AggregateID: fmt.Sprint(id), Type: "acct.changed.v1", Payload: map[string]int{"id": id}})
		}},
		{"rawinsert", func(ctx context.Context, tx unitofwork.Tx, id int) error {
			eid, _ := uuid.NewV7()
			_, err := tx.Exec(ctx, raw, eid, "acct", fmt.Sprint(id), "acct.changed.v1", []byte(fmt.Sprintf(`{"id":%d}`, id)), "bench.acct.changed", fmt.Sprint(id), nil)
			return err
		}},
	}
	rounds := 5
	p50 := make([][]float64, len(variants))
	tps := make([][]float64, len(variants))
	for range rounds {
		for vi, v := range variants {
			var lat []float64
			stop := time.Now().Add(time.Second)
			for i := 0; time.Now().Before(stop); i++ {
				t0 := time.Now()
				err := uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
					if _, err := tx.Exec(ctx, update, i%1024); err != nil {
						return err
					}
					return v.body(ctx, tx, i%1024)
				})
				if err != nil {
					b.Fatal(err)
				}
				lat = append(lat, float64(time.Since(t0).Microseconds()))
			}
			slices.Sort(lat)
			p50[vi] = append(p50[vi], lat[len(lat)/2])
			tps[vi] = append(tps[vi], float64(len(lat)))
		}
	}
	med := func(xs []float64) float64 { s := slices.Clone(xs); slices.Sort(s); return s[len(s)/2] }
	for vi, v := range variants {
		b.ReportMetric(med(p50[vi]), v.name+"_p50_us")
		b.ReportMetric(med(tps[vi]), v.name+"_tps")
		if vi > 0 {
			b.ReportMetric(med(p50[vi])-med(p50[0]), v.name+"_added_us")
		}
	}
	b.ReportMetric(med(tps[1])/med(tps[2]), "outbox1/rawinsert")
}

// BenchmarkAddTxWatchCost measures what the AddTx commit watcher costs
// writers: transactions (one UPDATE + AddTx of one event, committed by the
// caller) per second without an OnCommit hook (no watcher: the insert
// returns nothing) and with one (the insert returns the transaction id and
// the watcher polls the server until the commit is visible). Rounds of one
// second alternate; medians and their ratio are reported.
//
//	go test -run '^$' -bench AddTxWatchCost -benchtime 1x ./unitofwork
func BenchmarkAddTxWatchCost(b *testing.B) {
	for _, writers := range []int{1, 8, 32} {
		b.Run(fmt.Sprintf("writers=%d", writers), func(b *testing.B) {
			cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
			if err != nil {
				b.Fatal(err)
			}
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer pool.Close()
			tbl := testenv.Table(b, pool)
			ctx := context.Background()
			if _, err := pool.Exec(ctx, "CREATE TABLE "+tbl.Schema+".acct (id int PRIMARY KEY, n int NOT NULL)"); err != nil {
				b.Fatal(err)
			}
			if _, err := pool.Exec(ctx, "INSERT INTO "+tbl.Schema+".acct SELECT g, 0 FROM generate_series(0, 1023) g"); err != nil {
				b.Fatal(err)
			}
			var woken atomic.Int64
			plain, _ := unitofwork.New(pool, &unitofwork.Config{Table: tbl})
			watched, _ := unitofwork.New(pool, &unitofwork.Config{Table: tbl, OnCommit: func(n int) { woken.Add(int64(n)) }})
			defer watched.Close()
			update := "UPDATE " + tbl.Schema + ".acct SET n = n + 1 WHERE id = $1"
			variants := []struct {
				name string
				uow  *unitofwork.UnitOfWork
			}{{"nowatch", plain}, {"watch", watched}}
			rounds := 9
			tps := make([][]float64, len(variants))
			var watchedTx int64
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
								id := (w*997 + i) % 1024
								err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
									if _, err := tx.Exec(ctx, update, id); err != nil {
										return err
									}
									return v.uow.AddTx(ctx, tx, outbox.Event{AggregateType: "acct", AggregateID: fmt.Sprint(id), Type: "acct.changed", Topic: "t", Payload: map[string]int{"id": id}})
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
					if vi == 1 {
						watchedTx += done.Load()
					}
				}
			}
			med := func(xs []float64) float64 { s := slices.Clone(xs); slices.Sort(s); return s[len(s)/2] }
			base := med(tps[0])
			for vi, v := range variants {
				b.ReportMetric(med(tps[vi]), v.name+"_tps")
				if vi > 0 {
					b.ReportMetric(med(tps[vi])/base, v.name+"/nowatch")
				}
			}
			deadline := time.Now().Add(10 * time.Second)
			for woken.Load() < watchedTx && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if woken.Load() != watchedTx {
				b.Errorf("OnCommit saw %d of %d committed events", woken.Load(), watchedTx)
			}
		})
	}
}
