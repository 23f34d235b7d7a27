package faulttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/tablesql"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
)

// ordersStopTimeout is fx's default stop timeout, which examples/cmd/orders
// uses.
const ordersStopTimeout = 15 * time.Second

// outcome of one HTTP request of the load.
type outcome struct {
	status  int   // 0: no response
	err     error // transport error
	refused bool  // the connection was refused: the request never reached the service
}

func (o outcome) ok() bool { return o.status >= 200 && o.status < 300 }

// TestOrdersServiceSIGTERMLosesNothing runs the example service
// (examples/cmd/orders) as a process on a fresh schema and its own
// development broker, drives POST /orders and /confirm from several
// goroutines, and sends SIGTERM mid-load. The process must exit 0 within
// its stop timeout; every request answered 2xx must have its event in the
// outbox table, and requests that failed must have left nothing (no order,
// no event: atomicity). A relay started afterwards publishes whatever the
// service left, and every committed event is then in Kafka.
//
// It needs DATABASE_URL and the go command (it builds examples/cmd/orders
// and examples/cmd/devkafka); it runs in make test.
func TestOrdersServiceSIGTERMLosesNothing(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Pool(t)
	bin := buildExamples(t, "orders", "devkafka")
	kafka := startDevKafka(t, filepath.Join(bin, "devkafka"))

	schema := testenv.Name("t_")
	t.Cleanup(func() { _, _ = pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE") })
	port := freePort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OUTBOX_") && !strings.HasPrefix(kv, "KAFKA_") && !strings.HasPrefix(kv, "HTTP_ADDR=") {
			env = append(env, kv)
		}
	}
	cmd := exec.Command(filepath.Join(bin, "orders"))
	cmd.Env = append(env,
		"KAFKA_BROKERS="+kafka,
		fmt.Sprintf("HTTP_ADDR=127.0.0.1:%d", port),
		"OUTBOX_SCHEMA="+schema,
		"OUTBOX_MIGRATE=true",
		"CONSUMER_GROUP="+testenv.Name("faulttest-"),
		"OUTBOX_DELIVERY="+testDelivery(t).String(),
	)
	// The service's relay: the battery's progress, named (the service's
	// default, auto, would record cursor progress on the table its
	// OUTBOX_MIGRATE=true makes).
	progress := progressFor(t, testDelivery(t), relay.Poll)
	cmd.Env = append(cmd.Env, "OUTBOX_PROGRESS="+progress.String())
	svc := startProc(t, "orders service", cmd, nil)
	waitFor(t, 60*time.Second, "the orders service to listen", func() bool {
		select {
		case <-svc.exited:
			t.Fatalf("the orders service exited while starting: %v\n%s", svc.state, svc.stderr)
		default:
		}
		return portOpen(port)
	})

	// The load: each worker creates an order (with its own id, so a failed
	// request can be looked up) and confirms it.
	client := &http.Client{Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()
	var (
		mu        sync.Mutex
		created   = map[string]outcome{}
		confirmed = map[string]outcome{}
		stop      = make(chan struct{})
		wg        sync.WaitGroup
		okCount   atomic.Int64
	)
	post := func(url, body string) outcome {
		resp, err := client.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			return outcome{err: err, refused: errors.Is(err, syscall.ECONNREFUSED)}
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return outcome{status: resp.StatusCode}
	}
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), uint64(time.Now().UnixNano())))
			for {
				select {
				case <-stop:
					return
				default:
				}
				id := uuid.NewString()
				c := post(base+"/orders", fmt.Sprintf(`{"id":%q,"customerId":"c-%d","totalAmount":"%d.%02d"}`, id, g, rng.IntN(500), rng.IntN(100)))
				mu.Lock()
				created[id] = c
				mu.Unlock()
				if !c.ok() {
					time.Sleep(10 * time.Millisecond) // the service is going away
					continue
				}
				okCount.Add(1)
				f := post(base+"/orders/"+id+"/confirm", "")
				mu.Lock()
				confirmed[id] = f
				mu.Unlock()
				if f.ok() {
					okCount.Add(1)
				}
			}
		}()
	}
	t.Cleanup(func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	})

	waitFor(t, 30*time.Second, "the load to make 300 successful requests", func() bool { return okCount.Load() >= 300 })
	svc.signal(syscall.SIGTERM)
	termed := time.Now()
	st := svc.wait(ordersStopTimeout + 10*time.Second)
	stopped := time.Since(termed)
	time.Sleep(200 * time.Millisecond) // a few requests against the stopped service
	close(stop)
	wg.Wait()
	t.Logf("orders service exited %v after SIGTERM with %v", stopped.Round(time.Millisecond), st)
	// Exit status 0 says fx's Stop returned no error, so every stop hook
	// ended within the stop timeout (fx fails Stop when its context ends
	// first, and the service then exits 1): that, not the wall time to the
	// exit, which a loaded machine stretches, is the bound.
	if !st.Exited() || st.ExitCode() != 0 {
		t.Errorf("orders service ended with %v after SIGTERM, want exit status 0 (1: Stop failed or overran its stop timeout %v)\n%s", st, ordersStopTimeout, svc.stderr)
	}

	// What the database holds.
	table := outbox.Table{Schema: schema}
	orders := map[string]string{} // id -> status
	rows, err := pool.Query(ctx, "SELECT id::text, status FROM "+pgx.Identifier{schema, "orders"}.Sanitize())
	if err != nil {
		t.Fatal(err)
	}
	var id, status string
	if _, err := pgx.ForEachRow(rows, []any{&id, &status}, func() error { orders[id] = status; return nil }); err != nil {
		t.Fatal(err)
	}
	type evKey struct{ order, typ string }
	events := map[evKey]int{}
	eventIDs := map[string]bool{}
	var typ, eid string
	rows, err = pool.Query(ctx, "SELECT aggregate_id, event_type, event_id::text FROM "+sqlname.Ident(table))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pgx.ForEachRow(rows, []any{&id, &typ, &eid}, func() error {
		events[evKey{id, typ}]++
		eventIDs[eid] = true
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	const evCreated, evConfirmed = "order.created.v1", "order.confirmed.v1"

	var n2xx, nFailed, nRefused, nUnknown int
	for id, c := range created {
		switch {
		case c.ok():
			n2xx++
			if events[evKey{id, evCreated}] != 1 || orders[id] == "" {
				t.Errorf("order %s was created (HTTP %d) but has %d %s events, order row %q", id, c.status, events[evKey{id, evCreated}], evCreated, orders[id])
			}
		case c.status != 0 || c.refused:
			nFailed++
			if c.refused {
				nRefused++
			}
			if events[evKey{id, evCreated}] != 0 || orders[id] != "" {
				t.Errorf("create of order %s failed (%v) but left %d events, order row %q", id, describe(c), events[evKey{id, evCreated}], orders[id])
			}
		default:
			nUnknown++ // no answer: either outcome is possible, atomicity is checked below
		}
	}
	for id, c := range confirmed {
		switch {
		case c.ok():
			n2xx++
			if events[evKey{id, evConfirmed}] != 1 || orders[id] != "CONFIRMED" {
				t.Errorf("order %s was confirmed (HTTP %d) but has %d %s events, status %q", id, c.status, events[evKey{id, evConfirmed}], evConfirmed, orders[id])
			}
		case c.status != 0 || c.refused:
			nFailed++
			if c.refused {
				nRefused++
			}
			if events[evKey{id, evConfirmed}] != 0 || orders[id] == "CONFIRMED" {
				t.Errorf("confirm of order %s failed (%v) but left %d events, status %q", id, describe(c), events[evKey{id, evConfirmed}], orders[id])
			}
		default:
			nUnknown++
		}
	}
	// Atomicity over everything the database holds: an order row exists iff
	// its created event does, it is CONFIRMED iff its confirmed event exists.
	for id, s := range orders {
		want := map[bool]int{true: 1, false: 0}
		if events[evKey{id, evCreated}] != 1 || events[evKey{id, evConfirmed}] != want[s == "CONFIRMED"] {
			t.Errorf("order %s (%s) has %d created and %d confirmed events", id, s, events[evKey{id, evCreated}], events[evKey{id, evConfirmed}])
		}
	}
	for k, n := range events {
		if orders[k.order] == "" {
			t.Errorf("%d %s event(s) of order %s, which does not exist", n, k.typ, k.order)
		}
	}
	var unpublished int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+sqlname.Ident(table)+" WHERE "+waitingSQL(table, progress)).Scan(&unpublished); err != nil {
		t.Fatal(err)
	}
	if progress == relay.ProgressCursor {
		// The service's relay ran with cursor progress: its lanes' rows exist.
		if on, err := tablesql.InCursorMode(ctx, pool, table); err != nil || !on {
			t.Errorf("after the orders service ran with OUTBOX_PROGRESS=cursor, %s is in cursor mode: %v (%v)", table, on, err)
		}
	}
	t.Logf("%d requests answered 2xx, %d failed (%d refused after the shutdown), %d without an answer; %d orders, %d events, %d left unpublished by the stopped service",
		n2xx, nFailed, nRefused, nUnknown, len(orders), len(eventIDs), unpublished)
	if nFailed == 0 && nUnknown == 0 {
		t.Errorf("no request failed: the load did not reach the shutdown")
	}

	// A relay started afterwards publishes the rest; every event is in Kafka.
	pub, err := relay.NewSaramaPublisher([]string{kafka}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := relay.New(pool, pub, &relay.Config{Table: table, PollInterval: pollInterval, MaxBackoff: maxBackoff, Delivery: testDelivery(t), Progress: progress})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "a new relay to publish what the service left", func() bool {
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+sqlname.Ident(table)+" WHERE "+waitingSQL(table, progress)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := r.Stop(sctx); err != nil {
		t.Error(err)
	}
	_ = pub.Close()

	topics := []string{"order-service.order.created", "order-service.order.confirmed"}
	total := 0
	for _, tp := range topics {
		total += testenv.RecordCount(t, []string{kafka}, tp)
	}
	cons := testenv.Consume(t, []string{kafka}, topics...)
	var msgs []*sarama.ConsumerMessage
	if testDelivery(t) == relay.ExactlyOnce {
		// The topics hold transaction markers, which no consumer gets.
		msgs = waitEvents(cons, eventIDs, time.Minute)
	} else {
		msgs = cons.WaitFor(total, time.Minute)
	}
	cons.Close()
	seen := map[string]bool{}
	for _, m := range msgs {
		seen[testenv.Header(m, outbox.HeaderEventID)] = true
	}
	missing := 0
	for eid := range eventIDs {
		if !seen[eid] {
			missing++
		}
	}
	if missing > 0 {
		t.Errorf("%d of %d committed events never reached Kafka", missing, len(eventIDs))
	}
	t.Logf("%d records in Kafka for %d committed events", len(msgs), len(eventIDs))
}

func describe(o outcome) string {
	var b bytes.Buffer
	if o.status != 0 {
		fmt.Fprintf(&b, "HTTP %d", o.status)
	}
	if o.err != nil {
		fmt.Fprintf(&b, "%v", o.err)
	}
	return b.String()
}
