package outboxtest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/outboxtest"
	"github.com/fxoutbox/outbox/unitofwork"
)

// fakeT records what an assertion reports, so the tests can check that a
// wrong expectation fails.
type fakeT struct {
	mu       sync.Mutex
	errs     []string
	fatals   []string
	cleanups []func()
}

func (f *fakeT) Helper() {}
func (f *fakeT) Errorf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errs = append(f.errs, fmt.Sprintf(format, args...))
}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fatals = append(f.fatals, fmt.Sprintf(format, args...))
}
func (f *fakeT) Cleanup(fn func()) { f.cleanups = append(f.cleanups, fn) }

// passed fails t if f saw a failure.
func (f *fakeT) passed(t *testing.T) {
	t.Helper()
	if len(f.errs)+len(f.fatals) > 0 {
		t.Fatalf("the assertion failed, want it to pass: %q %q", f.errs, f.fatals)
	}
}

// failed fails t unless f saw exactly one Fatalf whose message holds every
// part, and resets f.
func (f *fakeT) failed(t *testing.T, parts ...string) {
	t.Helper()
	defer func() { f.errs, f.fatals = nil, nil }()
	if len(f.fatals) != 1 || len(f.errs) != 0 {
		t.Fatalf("want exactly one Fatalf, got Fatalf %q, Errorf %q", f.fatals, f.errs)
	}
	for _, p := range parts {
		if !strings.Contains(f.fatals[0], p) {
			t.Errorf("failure message %q does not say %q", f.fatals[0], p)
		}
	}
}

func newRecorder(t *testing.T, cfg *outboxtest.RecorderConfig) *outboxtest.Recorder {
	t.Helper()
	ft := &fakeT{}
	rec := outboxtest.NewRecorder(ft, cfg)
	ft.passed(t)
	return rec
}

var payService = &outboxtest.RecorderConfig{UnitOfWork: unitofwork.Config{Service: "payment-service"}}

func captured(id string) outbox.Event {
	return outbox.Event{AggregateType: "payment", AggregateID: id, Type: "payment.captured.v1", Payload: map[string]any{"id": id}}
}

func TestRecorderRecordsCommittedEventsWithDefaults(t *testing.T) {
	rec := newRecorder(t, payService)
	ctx := context.Background()
	err := rec.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		return tx.Add(ctx, captured("p-1"),
			outbox.Event{AggregateType: "Payment", AggregateID: "p-2", Type: "PaymentRefunded.v2", Key: "k", Topic: "refunds", Headers: map[string]string{"tenant": "t1"}})
	})
	if err != nil {
		t.Fatal(err)
	}
	evs := rec.Events()
	if len(evs) != 2 {
		t.Fatalf("recorded %d events, want 2", len(evs))
	}
	if e := evs[0]; e.Topic != "payment-service.payment.captured" || e.Key != "p-1" || e.ID.Version() != 7 || string(e.Payload) != `{"id":"p-1"}` {
		t.Errorf("first event = %+v: want the derived topic, the aggregate id as key, a UUIDv7 and the encoded payload", e)
	}
	if e := evs[1]; e.Topic != "refunds" || e.Key != "k" || e.Headers["tenant"] != "t1" {
		t.Errorf("second event = %+v: want its own topic, key and headers", e)
	}
	// A second transaction appends; Reset forgets.
	if err := rec.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error { return tx.Add(ctx, captured("p-3")) }); err != nil {
		t.Fatal(err)
	}
	if n := len(rec.Events()); n != 3 {
		t.Fatalf("after a second Do: %d events, want 3", n)
	}
	rec.Reset()
	if n := len(rec.Events()); n != 0 {
		t.Fatalf("after Reset: %d events", n)
	}
}

func TestRecorderErrorRecordsNothing(t *testing.T) {
	rec := newRecorder(t, payService)
	declined := errors.New("declined")
	err := rec.Do(context.Background(), func(ctx context.Context, tx unitofwork.Tx) error {
		if err := tx.Add(ctx, captured("p-1")); err != nil {
			return err
		}
		return declined
	})
	if err != declined {
		t.Fatalf("Do = %v, want the function's error unchanged", err)
	}
	if evs := rec.Events(); len(evs) != 0 {
		t.Fatalf("a failed transaction recorded %d events", len(evs))
	}
}

func TestRecorderPanicRecordsNothingAndPanicsAgain(t *testing.T) {
	rec := newRecorder(t, payService)
	var saved unitofwork.Tx
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v, want the function's panic", r)
			}
		}()
		_ = rec.Do(context.Background(), func(ctx context.Context, tx unitofwork.Tx) error {
			saved = tx
			_ = tx.Add(ctx, captured("p-1"))
			panic("boom")
		})
	}()
	if evs := rec.Events(); len(evs) != 0 {
		t.Fatalf("a panicking transaction recorded %d events", len(evs))
	}
	if err := saved.Add(context.Background(), captured("p-2")); !errors.Is(err, unitofwork.ErrTxDone) {
		t.Fatalf("Add after a panicked Do = %v, want ErrTxDone", err)
	}
}

func TestRecorderAddAfterDoFails(t *testing.T) {
	rec := newRecorder(t, payService)
	var saved unitofwork.Tx
	_ = rec.Do(context.Background(), func(_ context.Context, tx unitofwork.Tx) error { saved = tx; return nil })
	if err := saved.Add(context.Background(), captured("p-1")); !errors.Is(err, unitofwork.ErrTxDone) {
		t.Fatalf("Add after Do = %v, want ErrTxDone", err)
	}
	if n := len(rec.Events()); n != 0 {
		t.Fatalf("a late Add recorded %d events", n)
	}
}

// The recorder refuses what the writer refuses, with the writer's error
// (an *outbox.EventError naming the field and the event's index), and
// records none of the events of that call.
func TestRecorderInvalidEvent(t *testing.T) {
	rec := newRecorder(t, payService)
	bad := captured("p-2")
	bad.Headers = map[string]string{"traceparent": "x"}
	var addErr error
	err := rec.Do(context.Background(), func(ctx context.Context, tx unitofwork.Tx) error {
		addErr = tx.Add(ctx, captured("p-1"), bad)
		return nil // the handler ignores the error: the valid event of that call is not recorded either
	})
	if err != nil {
		t.Fatal(err)
	}
	var ee *outbox.EventError
	if !errors.Is(addErr, outbox.ErrInvalidEvent) || !errors.As(addErr, &ee) || ee.Index != 1 || ee.Field != "Headers" {
		t.Fatalf("Add = %v, want an EventError for Headers of event 1", addErr)
	}
	if n := len(rec.Events()); n != 0 {
		t.Fatalf("recorded %d events of a refused call", n)
	}
	// Without a Service, an event must name its topic, as with New(db, nil).
	rec = newRecorder(t, nil)
	err = rec.Do(context.Background(), func(ctx context.Context, tx unitofwork.Tx) error { return tx.Add(ctx, captured("p-1")) })
	if !errors.As(err, &ee) || ee.Field != "Topic" {
		t.Fatalf("an event without a topic and no Service: %v, want an EventError for Topic", err)
	}
}

func TestRecorderInvalidConfigFailsTheTest(t *testing.T) {
	ft := &fakeT{}
	rec := outboxtest.NewRecorder(ft, &outboxtest.RecorderConfig{UnitOfWork: unitofwork.Config{Service: "payment service"}})
	ft.failed(t, "Service")
	if rec != nil {
		t.Fatal("NewRecorder returned a recorder for an invalid configuration")
	}
}

func TestRecorderTxWithoutDBFails(t *testing.T) {
	rec := newRecorder(t, payService)
	ctx := context.Background()
	var errs []error
	_ = rec.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		_, err := tx.Exec(ctx, "SELECT 1")
		errs = append(errs, err)
		_, err = tx.Query(ctx, "SELECT 1")
		errs = append(errs, err)
		errs = append(errs, tx.QueryRow(ctx, "SELECT 1").Scan(new(int)))
		_, err = tx.CopyFrom(ctx, pgx.Identifier{"t"}, []string{"a"}, pgx.CopyFromRows(nil))
		errs = append(errs, err)
		br := tx.SendBatch(ctx, &pgx.Batch{})
		_, err = br.Exec()
		errs = append(errs, err, br.Close())
		return nil
	})
	for i, err := range errs {
		if !errors.Is(err, outboxtest.ErrNoDB) || !strings.Contains(err.Error(), "RecorderConfig.DB") {
			t.Errorf("SQL call %d on a Tx without a database = %v, want ErrNoDB saying what to set", i, err)
		}
	}
}

// Add stores the trace context of its ctx, as the writer does.
func TestRecorderStoresTraceContext(t *testing.T) {
	tp := sdktrace.NewTracerProvider()
	defer func() { _ = tp.Shutdown(context.Background()) }()
	ctx, span := tp.Tracer("test").Start(context.Background(), "handler")
	defer span.End()
	rec := newRecorder(t, payService)
	if err := rec.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error { return tx.Add(ctx, captured("p-1")) }); err != nil {
		t.Fatal(err)
	}
	want := "00-" + span.SpanContext().TraceID().String() + "-" + span.SpanContext().SpanID().String() + "-01"
	ft := &fakeT{}
	outboxtest.RequireEvent(ft, rec, outboxtest.Want{Headers: map[string]string{"traceparent": want}})
	ft.passed(t)
}

func TestRecorderConcurrentDo(t *testing.T) {
	rec := newRecorder(t, payService)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 25 {
				_ = rec.Do(context.Background(), func(ctx context.Context, tx unitofwork.Tx) error {
					return tx.Add(ctx, captured(fmt.Sprintf("p-%d-%d", i, j)))
				})
			}
		})
	}
	wg.Wait()
	if n := len(rec.Events()); n != 200 {
		t.Fatalf("recorded %d events from 8 goroutines, want 200", n)
	}
}
