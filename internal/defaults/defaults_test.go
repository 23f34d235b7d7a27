package defaults

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

func TestSet(t *testing.T) {
	var d time.Duration
	Set(&d, time.Second)
	Set(&d, time.Minute) // set already: kept
	if d != time.Second {
		t.Errorf("d = %v, want 1s", d)
	}
}

func TestPropagatorCarriesTraceAndBaggage(t *testing.T) {
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled})
	m, _ := baggage.NewMember("tenant", "acme")
	b, _ := baggage.New(m)
	ctx := baggage.ContextWithBaggage(trace.ContextWithSpanContext(context.Background(), sc), b)
	carrier := propagation.MapCarrier{}
	Propagator().Inject(ctx, carrier)
	if carrier.Get("traceparent") == "" || carrier.Get("baggage") != "tenant=acme" {
		t.Fatalf("injected %v", carrier)
	}
	got := Propagator().Extract(context.Background(), carrier)
	if trace.SpanContextFromContext(got).TraceID() != sc.TraceID() || baggage.FromContext(got).Member("tenant").Value() != "acme" {
		t.Errorf("extracted %v", carrier)
	}
}
