// Command orders runs the example orders service (package
// github.com/fxoutbox/outbox/examples/orders): an HTTP API that records
// order events through the transactional outbox, the relay that publishes
// them to Kafka, and a consumer that prints each event with its trace id.
//
// Environment:
//
//	DATABASE_URL   PostgreSQL connection string (required)
//	KAFKA_BROKERS  Kafka bootstrap servers, comma-separated; when unset, an
//	               in-memory development broker (kfake, not Apache Kafka) is
//	               started inside the process
//	HTTP_ADDR      listen address (default 127.0.0.1:8080)
//	CONSUMER_GROUP the example consumer's group (default order-service-example-consumer)
//	OUTBOX_*       the outbox settings read by fxoutbox.ConfigFromEnv
//
// Try it:
//
//	curl -si -X POST localhost:8080/orders -d '{"customerId":"c-42","totalAmount":"49.90"}'
//	curl -si -X POST localhost:8080/orders/<id>/confirm -H 'traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'
//	curl -s localhost:8080/healthz; curl -s localhost:8080/metrics | grep ^outbox_
//
// SIGINT or SIGTERM stops it gracefully: the HTTP server drains, the relay
// finishes its batch within the stop timeout, the consumer leaves its group.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"go.uber.org/fx"
	"go.uber.org/fx/fxevent"

	"github.com/fxoutbox/outbox/examples/devkafka"
	"github.com/fxoutbox/outbox/examples/orders"
	"github.com/fxoutbox/outbox/fxoutbox"
)

func main() { os.Exit(run()) }

func run() int {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	slog.SetDefault(log)

	dbURL := os.Getenv("DATABASE_URL")
	if dbURL == "" {
		fmt.Fprintln(os.Stderr, "orders: DATABASE_URL is not set: point it at a PostgreSQL database (scripts/pg.sh up prints one)")
		return 2
	}
	outboxCfg, err := fxoutbox.ConfigFromEnv()
	if err != nil {
		fmt.Fprintf(os.Stderr, "orders: %v\n", err)
		return 2
	}
	if len(outboxCfg.Brokers) == 0 {
		broker, err := devkafka.Start(devkafka.DefaultConfig())
		if err != nil {
			fmt.Fprintf(os.Stderr, "orders: start the development broker: %v\n", err)
			return 1
		}
		defer broker.Close()
		outboxCfg.Brokers = broker.Addrs()
		log.Warn("KAFKA_BROKERS is not set: started an in-memory development broker inside this process. "+
			"It is kfake, NOT Apache Kafka: one broker, no replication, and every record is lost when the process exits",
			"addr", strings.Join(broker.Addrs(), ","))
	}
	httpAddr := os.Getenv("HTTP_ADDR")
	if httpAddr == "" {
		httpAddr = "127.0.0.1:8080"
	}

	app := fx.New(
		fx.Supply(orders.Config{
			DatabaseURL: dbURL,
			HTTPAddr:    httpAddr,
			Outbox:      outboxCfg,
			Logger:      log,
			Consumer:    orders.ConsumerConfig{Group: os.Getenv("CONSUMER_GROUP")},
		}),
		orders.Module,
		fx.WithLogger(func() fxevent.Logger {
			l := &fxevent.SlogLogger{Logger: log}
			l.UseLogLevel(slog.LevelDebug) // fx's own wiring lines only at debug
			return l
		}),
	)
	startCtx, cancel := context.WithTimeout(context.Background(), app.StartTimeout())
	defer cancel()
	if err := app.Start(startCtx); err != nil {
		log.Error("orders: start failed", "error", err)
		return 1
	}
	sig := <-app.Wait() // SIGINT, SIGTERM
	log.Info("orders: stopping", "signal", sig.Signal)
	stopCtx, cancel := context.WithTimeout(context.Background(), app.StopTimeout())
	defer cancel()
	if err := app.Stop(stopCtx); err != nil {
		log.Error("orders: stop", "error", err)
		return 1
	}
	return sig.ExitCode
}
