// Command demo runs the example orders and billing services end to end and
// checks what the outbox and the inbox promise: every committed order event
// reaches Kafka, carrying the trace of the HTTP request that wrote it,
// across a broker outage; billing applies each order.confirmed.v1 event
// once, redeliveries included, and its invoice.created.v1 continues the
// same trace to a final consumer.
//
//	make demo                  # from the repository root: starts PostgreSQL, then this
//	go run ./cmd/demo [-orders 20] [-outage=true] [-outage-for 3s]
//
// PostgreSQL comes from DATABASE_URL (the demo works in schemas of its own
// and drops them at exit, so reruns start clean); Kafka from KAFKA_BROKERS,
// or else an embedded in-memory development broker (kfake, not Apache
// Kafka). The topics are created at start when missing. The demo starts the
// orders app (examples/orders) in-process on a free port, the billing app
// (examples/billing: an inbox consumer of order.confirmed.v1 that writes an
// invoice and records invoice.created.v1) and a final inbox consumer of
// invoice.created.v1; it creates and confirms orders over HTTP, each
// request with a fresh W3C traceparent, and prints every event with its
// trace id. It then produces the order.confirmed.v1 records again with
// their x-event-id (a redelivered batch) and shows billing drop them
// (outbox.inbox.processed{outcome=duplicate}, one invoice per order), and
// prints one order's spans, collected in-process from all three services,
// as a tree: HTTP request -> publish -> billing process -> publish -> final
// process. With the embedded broker it then stops the broker for a few
// seconds while creating more orders, and starts a new one on the same
// port. It exits 0 only if every event was consumed and invoiced once, the
// duplicates were dropped and every trace id matched its request's.
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"github.com/fxoutbox/outbox/outboxconfig"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/fx"

	"github.com/fxoutbox/outbox/examples/billing"
	"github.com/fxoutbox/outbox/examples/devkafka"
	"github.com/fxoutbox/outbox/examples/orders"
	"github.com/fxoutbox/outbox/fxoutbox"
)

func main() { os.Exit(run()) }

func run() int {
	nOrders := flag.Int("orders", 20, "orders to create and confirm")
	outage := flag.Bool("outage", true, "stop the embedded broker for a while and create orders meanwhile (embedded broker only)")
	outageFor := flag.Duration("outage-for", 3*time.Second, "how long the broker stays down")
	outageOrders := flag.Int("outage-orders", 5, "orders created during the outage")
	flag.Parse()
	if *nOrders < 1 || *outageOrders < 0 || *outageFor < time.Second {
		fmt.Fprintln(os.Stderr, "demo: -orders must be at least 1, -outage-orders not negative, -outage-for at least 1s")
		return 2
	}

	dbURL := os.Getenv("DATABASE_URL")
	if dbURL == "" {
		fmt.Fprintln(os.Stderr, "demo: DATABASE_URL is not set. Run `make demo` from the repository root, which starts a throwaway\n"+
			"PostgreSQL (scripts/pg.sh) and sets it, or set DATABASE_URL=postgres://user@host:5432/db yourself.")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	d := &demo{out: os.Stdout, expect: map[string]*expectation{}, finals: map[string]*final{}, spans: &spanCollector{}}
	d.changed = make(chan struct{}, 1)
	if err := d.run(ctx, dbURL, *nOrders, *outage, *outageFor, *outageOrders); err != nil {
		fmt.Fprintf(os.Stderr, "demo: FAILED: %v\n", err)
		return 1
	}
	return 0
}

type demo struct {
	out     io.Writer
	base    string   // the app's URL
	brokers []string // Kafka
	client  *http.Client
	broker  *devkafka.Broker // the embedded broker, if any

	mu      sync.Mutex
	expect  map[string]*expectation // by order id + "/" + event type
	changed chan struct{}
	foreign int // events of other runs in shared topics

	// The billing service and the final consumer (chain.go).
	spans          *spanCollector
	billingMetrics *sdkmetric.ManualReader
	billingSchema  string
	invoices       *billing.Invoices
	finals         map[string]*final // by order id
	replay         []orders.Delivery // order.confirmed.v1 records to redeliver
	firstConfirm   *expectation
	dupsInjected   int
	dupsDropped    int64
	treeChecked    bool
}

// expectation is an event the demo caused and waits for.
type expectation struct {
	order, typ string
	trace      trace.TraceID // of the request that caused it
	outage     bool          // written while the broker was down
	committed  time.Time     // when the HTTP response arrived (after the commit)
	consumed   time.Time
	matched    bool
	copies     int
}

func (d *demo) printf(format string, args ...any) { fmt.Fprintf(d.out, format, args...) }

func (d *demo) run(ctx context.Context, dbURL string, nOrders int, outage bool, outageFor time.Duration, outageOrders int) error {
	started := time.Now()
	runID := strings.ToLower(rand.Text()[:8])
	schema := "orders_demo_" + runID

	outboxCfg, err := fxoutbox.ConfigFromEnv()
	if err != nil {
		return err
	}
	outboxCfg.Table.Schema = schema
	// The topics are created at start (on Apache Kafka too).
	outboxCfg.EventTypes = []outboxconfig.EventType{
		{AggregateType: orders.AggregateOrder, Type: orders.EventOrderCreated},
		{AggregateType: orders.AggregateOrder, Type: orders.EventOrderConfirmed},
	}
	outboxCfg.TopicCheck = outboxconfig.TopicsCreate
	d.printf("fxoutbox demo: the orders service (examples/orders) and the billing service (examples/billing) end to end\n")
	d.printf("  PostgreSQL  %s, schema %s (dropped at exit)\n", redact(dbURL), schema)
	d.printf("  Admin UI    while it runs: DATABASE_URL=%s OUTBOX_SCHEMA=%s go run ./cmd/outboxctl ui (repository root; docs/adminui.md)\n", redact(dbURL), schema)

	if len(outboxCfg.Brokers) == 0 {
		if d.broker, err = devkafka.Start(devkafka.DefaultConfig()); err != nil {
			return err
		}
		defer func() { d.broker.Close() }() // the one running at the end
		outboxCfg.Brokers = d.broker.Addrs()
		d.printf("  Kafka       embedded in-memory development broker on %s (kfake via examples/devkafka, NOT Apache Kafka)\n", outboxCfg.Brokers[0])
	} else {
		d.printf("  Kafka       %s (from KAFKA_BROKERS)\n", strings.Join(outboxCfg.Brokers, ","))
		if outage {
			d.printf("              no outage step: the demo stops only the embedded broker, not one it did not start\n")
			outage = false
		}
	}
	defer dropSchema(dbURL, schema)
	d.brokers = outboxCfg.Brokers

	log := slog.New(slog.NewTextHandler(&indent{w: d.out, prefix: "  log: "}, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	}))
	var consumer *orders.Consumer
	var server *orders.Server
	app := fx.New(
		fx.Supply(orders.Config{
			DatabaseURL:    dbURL,
			HTTPAddr:       "127.0.0.1:0",
			Outbox:         outboxCfg,
			Logger:         log,
			SpanProcessors: []sdktrace.SpanProcessor{d.spans.processor("orders")},
			Consumer:       orders.ConsumerConfig{Group: "orders-demo-" + runID, Handle: d.consumed},
		}),
		orders.Module,
		fx.Populate(&consumer, &server),
		fx.NopLogger,
	)
	startCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := app.Start(startCtx); err != nil {
		return fmt.Errorf("start the orders app: %w", err)
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := app.Stop(stopCtx); err != nil {
			d.printf("  stop: %v\n", err)
		}
	}()
	d.base = server.URL()
	d.client = &http.Client{Timeout: 10 * time.Second}
	defer d.client.CloseIdleConnections()
	d.printf("  HTTP        %s (POST /orders, POST /orders/{id}/confirm, GET /healthz, GET /metrics)\n", d.base)
	select {
	case <-consumer.Ready():
	case <-time.After(30 * time.Second):
		return errors.New("the consumer did not join its group within 30s")
	case <-ctx.Done():
		return ctx.Err()
	}
	d.printf("  consumer    group orders-demo-%s on %s\n", runID, strings.Join(consumer.Topics(), ", "))
	defer dropSchema(dbURL, "billing_demo_"+runID)
	stopBilling, err := d.startBilling(ctx, dbURL, runID, outboxCfg, log)
	if err != nil {
		return err
	}
	defer stopBilling()

	err = d.scenario(ctx, nOrders, outage, outageFor, outageOrders)
	if serr := d.summary(time.Since(started)); err == nil {
		err = serr
	}
	return err
}

// scenario creates and confirms orders, then, if outage is set, stops the
// embedded broker, writes more orders and restarts it.
func (d *demo) scenario(ctx context.Context, nOrders int, outage bool, outageFor time.Duration, outageOrders int) error {
	// 1. Orders over HTTP.
	d.printf("\n== %d orders created and confirmed over HTTP, each request with a fresh traceparent\n", nOrders)
	t0 := time.Now()
	ids, err := d.createOrders(ctx, nOrders, false)
	if err != nil {
		return err
	}
	if err := d.confirmOrders(ctx, ids, false); err != nil {
		return err
	}
	if err := d.waitConsumed(ctx, 30*time.Second); err != nil {
		return err
	}
	d.printf("  all %d events consumed and %d orders invoiced %s after the first request\n", 2*nOrders, nOrders, time.Since(t0).Round(time.Millisecond))
	if err := d.waitDrained(ctx, 15*time.Second); err != nil {
		return err
	}
	if err := d.rejections(ctx, ids[0]); err != nil {
		return err
	}

	// 2. The same order.confirmed.v1 records again: billing drops them.
	if err := d.duplicates(ctx, d.brokers); err != nil {
		return err
	}
	// 3. One order's whole chain as a trace tree.
	d.mu.Lock()
	first := d.firstConfirm
	d.mu.Unlock()
	if err := d.printTrace(ctx, first.order, first.trace, true); err != nil {
		return err
	}

	// 4. A broker outage.
	if outage {
		port := d.broker.Port()
		d.printf("\n== broker outage: the embedded broker stops for %s while %d more orders are written\n", outageFor, outageOrders)
		d.printf("  before      %s\n", d.metrics(ctx))
		d.broker.Close()
		down := time.Now()
		d.printf("  broker on 127.0.0.1:%d stopped (its records are gone: it is in memory)\n", port)
		ids, err := d.createOrders(ctx, outageOrders, true)
		if err != nil {
			return err
		}
		if err := d.confirmOrders(ctx, ids, true); err != nil {
			return err
		}
		d.printf("  %d orders created and confirmed while the broker is down: writers do not need Kafka\n", outageOrders)
		for time.Since(down) < outageFor-time.Second {
			if !sleep(ctx, time.Second) {
				return ctx.Err()
			}
			d.printf("  +%-4s      %s\n", time.Since(down).Round(time.Second), d.metrics(ctx))
		}
		d.printf("  healthz     %s\n", d.healthz(ctx))
		if !sleep(ctx, outageFor-time.Since(down)) {
			return ctx.Err()
		}
		cfg := devkafka.DefaultConfig()
		cfg.Port = port
		if d.broker, err = devkafka.Start(cfg); err != nil {
			return fmt.Errorf("restart the broker on port %d: %w", port, err)
		}
		up := time.Now()
		d.printf("  broker restarted on 127.0.0.1:%d after %s, empty: topics are auto-created again\n", port, up.Sub(down).Round(100*time.Millisecond))
		if err := d.waitConsumed(ctx, 60*time.Second); err != nil {
			return err
		}
		d.printf("  all %d outage events consumed %s after the restart\n", 2*outageOrders, time.Since(up).Round(time.Millisecond))
		if err := d.waitDrained(ctx, 15*time.Second); err != nil {
			return err
		}
		d.printf("  after       %s\n", d.metrics(ctx))
		d.printf("  healthz     %s\n", d.healthz(ctx))
	}
	return nil
}

// createOrders creates n orders, each request with a fresh traceparent.
func (d *demo) createOrders(ctx context.Context, n int, outage bool) ([]string, error) {
	ids := make([]string, n)
	for i := range ids {
		id := uuid.Must(uuid.NewV7()).String()
		ids[i] = id
		body := fmt.Sprintf(`{"id":%q,"customerId":"customer-%02d","totalAmount":"%d.%02d"}`, id, i%7+1, 10+i*37%190, i*13%100)
		if err := d.call(ctx, "/orders", body, id, orders.EventOrderCreated, outage, http.StatusCreated); err != nil {
			return nil, err
		}
	}
	return ids, nil
}

// confirmOrders confirms each order, each request with a fresh traceparent.
func (d *demo) confirmOrders(ctx context.Context, ids []string, outage bool) error {
	for _, id := range ids {
		if err := d.call(ctx, "/orders/"+id+"/confirm", "", id, orders.EventOrderConfirmed, outage, http.StatusOK); err != nil {
			return err
		}
	}
	return nil
}

// call POSTs body to path with a new traceparent. When want is a success,
// the event (order, typ) is expected, with that trace id; it is registered
// before the request, since the consumer may see the event before the
// response arrives.
func (d *demo) call(ctx context.Context, path, body, order, typ string, outage bool, want int) error {
	tp, traceID := newTraceparent()
	var e *expectation
	if typ != "" {
		e = &expectation{order: order, typ: typ, trace: traceID, outage: outage}
		d.mu.Lock()
		d.expect[order+"/"+typ] = e
		if typ == orders.EventOrderConfirmed {
			d.finals[order] = &final{order: order, trace: traceID, outage: outage}
			if d.firstConfirm == nil {
				d.firstConfirm = e
			}
		}
		d.mu.Unlock()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.base+path, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", tp)
	resp, err := d.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		return fmt.Errorf("POST %s: %s, want %d: %s", path, resp.Status, want, bytes.TrimSpace(b))
	}
	if got := resp.Header.Get(orders.HeaderTraceResponse); !strings.Contains(got, traceID.String()) {
		return fmt.Errorf("POST %s: traceresponse %q does not continue the request's trace %s", path, got, traceID)
	}
	if e != nil {
		d.mu.Lock()
		e.committed = time.Now()
		if f := d.finals[order]; f != nil && typ == orders.EventOrderConfirmed {
			f.committed = e.committed
		}
		d.mu.Unlock()
	}
	return nil
}

// rejections shows that requests that fail record nothing.
func (d *demo) rejections(ctx context.Context, confirmed string) error {
	missing := uuid.Must(uuid.NewV7()).String()
	if err := d.call(ctx, "/orders/"+missing+"/confirm", "", "", "", false, http.StatusNotFound); err != nil {
		return err
	}
	if err := d.call(ctx, "/orders/"+confirmed+"/confirm", "", "", "", false, http.StatusConflict); err != nil {
		return err
	}
	d.printf("  confirming a missing order: 404; confirming an order twice: 409; both rolled back, no event\n")
	return nil
}

// consumed is the consumer's Handle: it prints the demo's events.
func (d *demo) consumed(_ context.Context, dl orders.Delivery) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e := d.expect[dl.Key+"/"+dl.EventType]
	if e == nil {
		d.foreign++ // another run's event in the shared topics
		return
	}
	e.copies++
	if dl.Duplicate || e.copies > 1 {
		d.printf("  duplicate  %-18s order=%s event=%s (dropped by x-event-id)\n", dl.EventType, dl.Key, dl.EventID)
		return
	}
	e.consumed = dl.Received
	e.matched = dl.TraceID == e.trace
	if dl.EventType == orders.EventOrderConfirmed && !e.outage {
		d.replay = append(d.replay, dl)
	}
	match := "yes"
	if !e.matched {
		match = "NO (request trace " + e.trace.String() + ")"
	}
	d.printf("  consumed   %-18s order=%s event=%s trace=%s trace matches request: %s\n",
		dl.EventType, dl.Key, dl.EventID, dl.TraceID, match)
	select {
	case d.changed <- struct{}{}:
	default:
	}
}

// waitConsumed waits until every expected event was consumed.
func (d *demo) waitConsumed(ctx context.Context, timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		d.mu.Lock()
		missing := 0
		for _, e := range d.expect {
			if e.consumed.IsZero() {
				missing++
			}
		}
		for _, f := range d.finals {
			if f.consumed.IsZero() {
				missing++
			}
		}
		d.mu.Unlock()
		if missing == 0 {
			return nil
		}
		select {
		case <-d.changed:
		case <-deadline.C:
			return fmt.Errorf("%d events not consumed within %s", missing, timeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// scrape reads the app's GET /metrics (Prometheus text format) and sums
// each metric over its label sets.
func (d *demo) scrape(ctx context.Context) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.base+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := d.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	sums := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, _, _ := strings.Cut(line, "{")
		name, _, _ = strings.Cut(name, " ")
		if i := strings.LastIndexByte(line, ' '); i >= 0 {
			if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
				sums[name] += v
			}
		}
	}
	return sums, sc.Err()
}

// metrics returns the relay's backlog, oldest-age, error and published
// metrics as GET /metrics shows them.
func (d *demo) metrics(ctx context.Context) string {
	m, err := d.scrape(ctx)
	if err != nil {
		return "metrics: " + err.Error()
	}
	return fmt.Sprintf("outbox_backlog=%g outbox_oldest_age_seconds=%.1f outbox_publish_errors_total=%g outbox_events_published_total=%g",
		m["outbox_backlog"], m["outbox_oldest_age_seconds"], m["outbox_publish_errors_total"], m["outbox_events_published_total"])
}

// waitDrained waits until the relay has marked every event published (a
// consumer may see a record a moment before the relay commits its batch).
func (d *demo) waitDrained(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		m, err := d.scrape(ctx)
		if err == nil && m["outbox_backlog"] == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the outbox backlog did not drain within %s: %s", timeout, d.metrics(ctx))
		}
		if !sleep(ctx, 50*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// healthz returns the app's GET /healthz answer.
func (d *demo) healthz(ctx context.Context) string {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, d.base+"/healthz", nil)
	resp, err := d.client.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	var body struct{ Status, Reason string }
	_ = json.NewDecoder(resp.Body).Decode(&body)
	if body.Reason != "" {
		return fmt.Sprintf("%d %s: %s", resp.StatusCode, body.Status, body.Reason)
	}
	return fmt.Sprintf("%d %s", resp.StatusCode, body.Status)
}

func (d *demo) summary(took time.Duration) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	var (
		created, consumed, matched, dups int
		maxLat, maxOutageLat             time.Duration
	)
	for _, e := range d.expect {
		if e.typ == orders.EventOrderCreated {
			created++
		}
		if e.consumed.IsZero() {
			continue
		}
		consumed++
		if e.matched {
			matched++
		}
		dups += e.copies - 1
		lat := max(0, e.consumed.Sub(e.committed))
		if e.outage {
			maxOutageLat = max(maxOutageLat, lat)
		} else {
			maxLat = max(maxLat, lat)
		}
	}
	total := len(d.expect)
	d.printf("\n== summary (%s)\n", took.Round(100*time.Millisecond))
	d.printf("  orders created          %d\n", created)
	d.printf("  events consumed         %d of %d\n", consumed, total)
	d.printf("  trace ids matched       %d of %d\n", matched, consumed)
	d.printf("  duplicates seen         %d\n", dups)
	d.printf("  max commit-to-consume   %s", maxLat.Round(time.Millisecond))
	if maxOutageLat > 0 {
		d.printf(" (%s for events written during the outage)", maxOutageLat.Round(time.Millisecond))
	}
	d.printf("\n")
	if d.foreign > 0 {
		d.printf("  other runs' events      %d in the shared topics, ignored\n", d.foreign)
	}
	var invoiced, invMatched, invCopies int
	var maxChain time.Duration
	for _, f := range d.finals {
		if f.consumed.IsZero() {
			continue
		}
		invoiced++
		invCopies += f.copies
		if f.matched {
			invMatched++
		}
		if !f.outage {
			maxChain = max(maxChain, f.consumed.Sub(f.committed))
		}
	}
	d.printf("  orders invoiced         %d of %d confirmed (invoice.created.v1 at the final consumer: %d)\n", invoiced, len(d.finals), invCopies)
	d.printf("  invoice trace ids       %d of %d matched the confirm request's\n", invMatched, invoiced)
	d.printf("  max confirm-to-invoiced %s (HTTP commit -> relay -> billing inbox commit -> relay -> final inbox commit)\n", maxChain.Round(time.Millisecond))
	d.printf("  duplicates injected     %d order.confirmed.v1 records; billing dropped %d, applied 0 again\n", d.dupsInjected, d.dupsDropped)
	var problems []string
	if consumed != total || matched != total {
		problems = append(problems, fmt.Sprintf("%d of %d events consumed, %d trace ids matched", consumed, total, matched))
	}
	if invoiced != len(d.finals) || invMatched != invoiced || invCopies != invoiced {
		problems = append(problems, fmt.Sprintf("%d of %d orders invoiced, %d invoice.created.v1 received, %d trace ids matched", invoiced, len(d.finals), invCopies, invMatched))
	}
	if d.invoices != nil {
		if n, err := d.invoiceCountLocked(context.Background()); err != nil || n != len(d.finals) {
			problems = append(problems, fmt.Sprintf("%d invoices for %d confirmed orders (%v)", n, len(d.finals), err))
		} else {
			d.printf("  invoices in billing     %d = distinct confirmed orders\n", n)
		}
	}
	if d.dupsInjected == 0 || d.dupsDropped < int64(d.dupsInjected) {
		problems = append(problems, fmt.Sprintf("%d duplicates injected, %d dropped", d.dupsInjected, d.dupsDropped))
	}
	if !d.treeChecked {
		problems = append(problems, "the trace tree was not complete")
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	d.printf("  PASS: every event consumed and invoiced once, duplicates dropped, every trace id matched its request's\n")
	return nil
}

// newTraceparent returns a W3C traceparent for a new sampled trace.
func newTraceparent() (string, trace.TraceID) {
	var tid trace.TraceID
	var sid trace.SpanID
	_, _ = rand.Read(tid[:])
	_, _ = rand.Read(sid[:])
	return "00-" + hex.EncodeToString(tid[:]) + "-" + hex.EncodeToString(sid[:]) + "-01", tid
}

// dropSchema removes the run's schema (orders and outbox tables).
func dropSchema(dbURL, schema string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return
	}
	defer conn.Close(ctx)
	_, _ = conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
}

// redact drops the password and the query of a connection URL.
func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(DATABASE_URL)"
	}
	u.RawQuery = ""
	return u.Redacted()
}

func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// indent prefixes every line written to w.
type indent struct {
	mu     sync.Mutex
	w      io.Writer
	prefix string
}

func (i *indent) Write(p []byte) (int, error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	for _, line := range bytes.SplitAfter(p, []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		if _, err := io.WriteString(i.w, i.prefix); err != nil {
			return 0, err
		}
		if _, err := i.w.Write(line); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}
