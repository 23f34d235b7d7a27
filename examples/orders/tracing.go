package orders

import (
	"net/http"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

const instrumentation = "github.com/fxoutbox/outbox/examples/orders"

// HeaderTraceResponse is the response header that carries the request's
// server span as a W3C traceparent value (W3C Trace Context Level 2
// "traceresponse"): its trace id is the one stored with the events the
// request recorded.
const HeaderTraceResponse = "traceresponse"

// traced starts a server span for each request, as a child of the W3C
// traceparent the request carries (a new trace when it carries none), and
// puts it in the request's context, where the unit of work finds it.
func traced(tp trace.TracerProvider, prop propagation.TextMapPropagator, next http.Handler) http.Handler {
	tracer := tp.Tracer(instrumentation)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := tracer.Start(ctx, r.Method, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(
				semconv.HTTPRequestMethodKey.String(r.Method),
				semconv.URLPath(r.URL.Path),
			))
		defer span.End()
		if sc := span.SpanContext(); sc.IsValid() {
			w.Header().Set(HeaderTraceResponse, "00-"+sc.TraceID().String()+"-"+sc.SpanID().String()+"-"+sc.TraceFlags().String())
		}
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		r = r.WithContext(ctx)
		next.ServeHTTP(sw, r)
		if r.Pattern != "" { // set by the ServeMux when a route matched
			span.SetName(r.Pattern)
			span.SetAttributes(semconv.HTTPRoute(r.Pattern))
		}
		span.SetAttributes(semconv.HTTPResponseStatusCode(sw.status))
		if sw.status >= 500 {
			span.SetStatus(codes.Error, http.StatusText(sw.status))
		}
	})
}

type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.status, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
