package orders

import (
	"context"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.uber.org/fx"
)

// metricsHandler serves GET /metrics.
type metricsHandler http.Handler

// newMetrics provides the OpenTelemetry meter provider the relay records its
// metrics with (fxoutbox takes an optional metric.MeterProvider), read by a
// Prometheus exporter into a registry of this application's own: the relay's
// outbox.backlog gauge becomes outbox_backlog, outbox.oldest.age
// outbox_oldest_age_seconds, outbox.events.published
// outbox_events_published_total, and so on.
func newMetrics(lc fx.Lifecycle) (metric.MeterProvider, metricsHandler, error) {
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		return nil, nil, err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	lc.Append(fx.StopHook(func(ctx context.Context) error { return mp.Shutdown(ctx) }))
	return mp, promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), nil
}
