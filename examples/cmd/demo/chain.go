package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/fxoutbox/outbox/outboxconfig"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/fx"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/examples/billing"
	"github.com/fxoutbox/outbox/examples/orders"
	"github.com/fxoutbox/outbox/fxoutbox"
	"github.com/fxoutbox/outbox/inbox"
	"github.com/fxoutbox/outbox/unitofwork"
)

// spanCollector keeps every ended span of the services in this process,
// each labelled with its service, to print the traces as trees.
type spanCollector struct {
	mu    sync.Mutex
	spans []collected
}

type collected struct {
	service string
	span    sdktrace.ReadOnlySpan
}

// processor returns a span processor that records into c under service.
func (c *spanCollector) processor(service string) sdktrace.SpanProcessor {
	return &labelled{c: c, service: service}
}

type labelled struct {
	c       *spanCollector
	service string
}

func (l *labelled) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (l *labelled) OnEnd(s sdktrace.ReadOnlySpan) {
	l.c.mu.Lock()
	l.c.spans = append(l.c.spans, collected{service: l.service, span: s})
	l.c.mu.Unlock()
}
func (l *labelled) Shutdown(context.Context) error   { return nil }
func (l *labelled) ForceFlush(context.Context) error { return nil }

func (c *spanCollector) trace(id trace.TraceID) []collected {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []collected
	for _, s := range c.spans {
		if s.span.SpanContext().TraceID() == id {
			out = append(out, s)
		}
	}
	return out
}

// final is an invoice.created.v1 event the demo waits for at the end of
// the chain: one per confirmed order.
type final struct {
	order     string
	trace     trace.TraceID // of the confirm request
	outage    bool
	committed time.Time
	consumed  time.Time
	matched   bool
	copies    int
}

// startBilling starts the billing service (examples/billing) on a schema
// of its own and, after it, the final consumer of invoice.created.v1: a
// plain inbox.Consumer standing in for a third service.
func (d *demo) startBilling(ctx context.Context, dbURL, runID string, outboxCfg fxoutbox.Config, log *slog.Logger) (stop func(), err error) {
	schema := "billing_demo_" + runID
	d.billingSchema = schema
	d.billingMetrics = sdkmetric.NewManualReader()
	cfg := outboxCfg
	cfg.Writer.Service, cfg.EventTypes = "", nil
	cfg.Table = outbox.Table{Schema: schema}
	cfg.TopicCheck = outboxconfig.TopicsCreate
	app := fx.New(
		fx.Supply(billing.Config{
			DatabaseURL:    dbURL,
			Outbox:         cfg,
			Group:          "billing-demo-" + runID,
			Logger:         log,
			SpanProcessors: []sdktrace.SpanProcessor{d.spans.processor("billing")},
			MetricReaders:  []sdkmetric.Reader{d.billingMetrics},
		}),
		billing.Module,
		fx.Populate(&d.invoices),
		fx.NopLogger,
	)
	startCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := app.Start(startCtx); err != nil {
		return nil, fmt.Errorf("start the billing app: %w", err)
	}
	stopApp := func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := app.Stop(stopCtx); err != nil {
			d.printf("  stop billing: %v\n", err)
		}
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		stopApp()
		return nil, err
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(d.spans.processor("invoices consumer")))
	invTopic := billing.ServiceName + ".invoice.created"
	fc, err := inbox.New(pool, nil, &inbox.Config{
		Group: "invoices-demo-" + runID, Brokers: outboxCfg.Brokers, Table: outbox.Table{Schema: schema},
		Logger: log, TracerProvider: tp,
		Routes: []inbox.Route{{Topic: invTopic, Type: billing.EventInvoiceCreated, Handler: d.finalConsumed}},
	})
	if err == nil {
		err = fc.Start(ctx)
	}
	if err != nil {
		pool.Close()
		stopApp()
		return nil, fmt.Errorf("start the invoices consumer: %w", err)
	}
	d.printf("  billing     examples/billing: inbox group billing-demo-%s on %s, schema %s (dropped at exit)\n", runID, billing.OrdersTopic, schema)
	d.printf("  final       an inbox consumer (group invoices-demo-%s) of %s\n", runID, invTopic)
	return func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := fc.Stop(stopCtx); err != nil {
			d.printf("  stop the invoices consumer: %v\n", err)
		}
		_ = tp.Shutdown(stopCtx)
		pool.Close()
		stopApp()
	}, nil
}

// finalConsumed is the final consumer's handler.
func (d *demo) finalConsumed(ctx context.Context, _ unitofwork.Tx, m *inbox.Message) error {
	var ev billing.InvoiceCreated
	if err := json.Unmarshal(m.Value, &ev); err != nil {
		return outbox.Permanent(err)
	}
	tid := trace.SpanContextFromContext(ctx).TraceID()
	d.mu.Lock()
	defer d.mu.Unlock()
	f := d.finals[ev.OrderID]
	if f == nil {
		d.foreign++
		return nil
	}
	f.copies++
	if f.copies > 1 {
		d.printf("  invoiced   AGAIN: order=%s invoice=%s\n", ev.OrderID, ev.InvoiceID)
		return nil
	}
	f.consumed = time.Now()
	f.matched = tid == f.trace
	match := "yes"
	if !f.matched {
		match = "NO (request trace " + f.trace.String() + ")"
	}
	d.printf("  invoiced   %-18s order=%s invoice=%s trace=%s trace matches confirm request: %s\n",
		m.Type, ev.OrderID, ev.InvoiceID, tid, match)
	select {
	case d.changed <- struct{}{}:
	default:
	}
	return nil
}

// processed returns the billing inbox's outbox.inbox.processed by outcome.
func (d *demo) processed(ctx context.Context) map[string]int64 {
	var rm metricdata.ResourceMetrics
	out := map[string]int64{}
	if err := d.billingMetrics.Collect(ctx, &rm); err != nil {
		return out
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			sum, ok := m.Data.(metricdata.Sum[int64])
			if m.Name != inbox.MetricProcessed || !ok {
				continue
			}
			for _, dp := range sum.DataPoints {
				o, _ := dp.Attributes.Value(attribute.Key("outbox.inbox.outcome"))
				out[o.AsString()] += dp.Value
			}
		}
	}
	return out
}

func fmtProcessed(p map[string]int64) string {
	return fmt.Sprintf("outbox.inbox.processed{applied=%d, duplicate=%d, parked=%d}", p["applied"], p["duplicate"], p["parked"])
}

// duplicates re-produces the order.confirmed.v1 records the demo saw, with
// their headers (x-event-id among them): a redelivered batch, as after an
// offset reset or a producer retry. Billing must skip every one.
func (d *demo) duplicates(ctx context.Context, brokers []string) error {
	d.mu.Lock()
	batch := slices.Clone(d.replay)
	d.mu.Unlock()
	if len(batch) == 0 {
		return errors.New("no order.confirmed.v1 record was captured to redeliver")
	}
	d.printf("\n== duplicates: the %d order.confirmed.v1 records produced again with their x-event-id (a redelivered batch)\n", len(batch))
	before := d.processed(ctx)
	d.printf("  before      billing %s\n", fmtProcessed(before))
	sc := sarama.NewConfig()
	sc.Version = sarama.V2_1_0_0
	sc.ClientID = "demo-redeliver"
	sc.Producer.Return.Successes = true
	sc.Producer.RequiredAcks = sarama.WaitForAll
	p, err := sarama.NewSyncProducer(brokers, sc)
	if err != nil {
		return fmt.Errorf("redeliver: %w", err)
	}
	defer p.Close()
	msgs := make([]*sarama.ProducerMessage, 0, len(batch))
	for _, dl := range batch {
		pm := &sarama.ProducerMessage{Topic: dl.Topic, Key: sarama.StringEncoder(dl.Key), Value: sarama.ByteEncoder(dl.Payload)}
		for k, v := range dl.Headers {
			pm.Headers = append(pm.Headers, sarama.RecordHeader{Key: []byte(k), Value: []byte(v)})
		}
		msgs = append(msgs, pm)
	}
	if err := p.SendMessages(msgs); err != nil {
		return fmt.Errorf("redeliver: %w", err)
	}
	want := before["duplicate"] + int64(len(batch))
	deadline := time.Now().Add(30 * time.Second)
	for d.processed(ctx)["duplicate"] < want {
		if time.Now().After(deadline) {
			return fmt.Errorf("billing skipped %d of %d redelivered records within 30s: %s", d.processed(ctx)["duplicate"]-before["duplicate"], len(batch), fmtProcessed(d.processed(ctx)))
		}
		if !sleep(ctx, 50*time.Millisecond) {
			return ctx.Err()
		}
	}
	after := d.processed(ctx)
	d.dupsDropped = after["duplicate"] - before["duplicate"]
	d.dupsInjected = len(batch)
	d.printf("  after       billing %s: %d dropped, %d applied again\n", fmtProcessed(after), d.dupsDropped, after["applied"]-before["applied"])
	// A second invoice.created.v1 would reach the final consumer now.
	if !sleep(ctx, time.Second) {
		return ctx.Err()
	}
	n, err := d.invoiceCount(ctx)
	if err != nil {
		return err
	}
	d.printf("  invoices    %d for %d confirmed orders\n", n, d.confirmedOrders())
	return nil
}

func (d *demo) confirmedOrders() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.finals)
}

func (d *demo) invoiceCount(ctx context.Context) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.invoiceCountLocked(ctx)
}

// invoiceCountLocked counts the invoices of the demo's confirmed orders;
// d.mu is held.
func (d *demo) invoiceCountLocked(ctx context.Context) (int, error) {
	ids := make([]string, 0, len(d.finals))
	for id := range d.finals {
		ids = append(ids, id)
	}
	invs, err := d.invoices.ByOrders(ctx, ids)
	return len(invs), err
}

// printTrace prints the spans of one trace as a tree and checks that the
// chain is complete: HTTP request -> publish -> billing process (applied)
// -> publish -> final process (applied), and, with duplicates, a billing
// process span that skipped one.
func (d *demo) printTrace(ctx context.Context, order string, tid trace.TraceID, wantDuplicate bool) error {
	need := []string{"orders/server", "orders/publish " + orders.ServiceName + ".order.confirmed",
		"billing/process " + billing.OrdersTopic + "/applied", "billing/publish " + billing.ServiceName + ".invoice.created",
		"invoices consumer/process " + billing.ServiceName + ".invoice.created/applied"}
	if wantDuplicate {
		need = append(need, "billing/process "+billing.OrdersTopic+"/duplicate")
	}
	var spans []collected
	var missing []string
	deadline := time.Now().Add(10 * time.Second)
	for {
		spans = d.spans.trace(tid)
		have := map[string]bool{}
		for _, s := range spans {
			have[s.service+"/"+kindOrName(s.span)] = true
			have[s.service+"/"+s.span.Name()] = true
			have[s.service+"/"+s.span.Name()+"/"+outcome(s.span)] = true
		}
		missing = missing[:0]
		for _, n := range need {
			if !have[n] {
				missing = append(missing, n)
			}
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			break
		}
		if !sleep(ctx, 50*time.Millisecond) {
			return ctx.Err()
		}
	}
	d.printf("\n== trace %s: order %s confirmed, as one tree (spans of all three services, collected in-process)\n", tid, order)
	ids := map[trace.SpanID]bool{}
	for _, s := range spans {
		ids[s.span.SpanContext().SpanID()] = true
	}
	children := map[trace.SpanID][]collected{}
	var roots []collected
	for _, s := range spans {
		if p := s.span.Parent(); p.IsValid() && ids[p.SpanID()] {
			children[p.SpanID()] = append(children[p.SpanID()], s)
		} else {
			roots = append(roots, s)
		}
	}
	byStart := func(a, b collected) int { return a.span.StartTime().Compare(b.span.StartTime()) }
	slices.SortFunc(roots, byStart)
	var walk func(c collected, prefix string, last bool, top bool)
	walk = func(c collected, prefix string, last bool, top bool) {
		branch, next := "├─ ", "│  "
		if last {
			branch, next = "└─ ", "   "
		}
		if top {
			branch, next = "", ""
		}
		label, note := describe(c)
		took := c.span.EndTime().Sub(c.span.StartTime())
		left := prefix + branch + label
		pad := strings.Repeat(" ", max(1, 78-utf8.RuneCountInString(left)))
		d.printf("  %s%s%6.1f ms  %s\n", left, pad, float64(took.Microseconds())/1000, note)
		kids := children[c.span.SpanContext().SpanID()]
		slices.SortFunc(kids, byStart)
		for i, k := range kids {
			walk(k, prefix+next, i == len(kids)-1, false)
		}
	}
	for _, r := range roots {
		walk(r, "", true, true)
	}
	if len(missing) > 0 {
		return fmt.Errorf("trace %s lacks %s", tid, strings.Join(missing, ", "))
	}
	d.treeChecked = true
	return nil
}

func kindOrName(s sdktrace.ReadOnlySpan) string {
	if s.SpanKind() == trace.SpanKindServer {
		return "server"
	}
	return s.Name()
}

func outcome(s sdktrace.ReadOnlySpan) string {
	for _, kv := range s.Attributes() {
		if kv.Key == "outbox.inbox.outcome" {
			return kv.Value.AsString()
		}
	}
	return ""
}

// describe is one line of the tree: the service and span, and what
// happened in it.
func describe(c collected) (label, note string) {
	s := c.span
	label = "[" + c.service + "] " + s.Name()
	line := ""
	switch {
	case s.SpanKind() == trace.SpanKindServer:
		line += "  orders transaction: order row + outbox row, one commit"
	case strings.HasPrefix(s.Name(), "publish "):
		line += "  relay: Kafka record with x-event-id and this span's traceparent"
	case c.service == "billing" && outcome(s) == inbox.OutcomeApplied:
		line += "  billing transaction: inbox row + invoice + outbox row, one commit"
	case c.service == "orders" && s.SpanKind() == trace.SpanKindConsumer:
		line += "  the orders service's example consumer (prints the event)"
	case outcome(s) == inbox.OutcomeDuplicate:
		line += "  DUPLICATE: inbox row exists, rolled back, nothing written"
	case outcome(s) != "":
		line += "  " + outcome(s)
	}
	return label, strings.TrimSpace(line)
}
