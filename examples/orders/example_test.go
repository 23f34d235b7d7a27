package orders_test

import (
	"log"
	"os"

	"go.uber.org/fx"

	"github.com/fxoutbox/outbox/examples/orders"
	"github.com/fxoutbox/outbox/fxoutbox"
)

// The service as cmd/orders runs it: the outbox settings from the
// environment (KAFKA_BROKERS, OUTBOX_*), the database from DATABASE_URL.
// Run blocks until SIGINT or SIGTERM, then stops the HTTP server, the
// consumer and the relay (which finishes its batch) in that order.
func Example() {
	outboxCfg, err := fxoutbox.ConfigFromEnv()
	if err != nil {
		log.Fatal(err)
	}
	fx.New(
		fx.Supply(orders.Config{
			DatabaseURL: os.Getenv("DATABASE_URL"),
			HTTPAddr:    "127.0.0.1:8080",
			Outbox:      outboxCfg, // Service defaults to "order-service"
		}),
		orders.Module,
	).Run()
}
