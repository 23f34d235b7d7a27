// Package defaults holds what the configs of relay, inbox and unitofwork
// default the same way: a zero field set to its default, and the trace
// context propagator.
package defaults

import "go.opentelemetry.io/otel/propagation"

// Set sets *v to def when it is zero.
func Set[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// Propagator is the default propagator of the writers, the relay and the
// inbox (their Config.Propagator): W3C trace context and baggage, so that
// what a writer injects the relay and a consumer read.
func Propagator() propagation.TextMapPropagator {
	return propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
}
