package inbox_test

import (
	"context"
	"encoding/json"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/inbox"
	"github.com/fxoutbox/outbox/migrations"
	"github.com/fxoutbox/outbox/unitofwork"
)

// A billing service applies each order-confirmed event once: the invoice,
// the inbox row and the invoice-created event commit together.
func ExampleNew() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := migrations.Inbox.Up(ctx, pool, outbox.Table{}); err != nil {
		log.Fatal(err)
	}
	uow, err := unitofwork.New(pool, &unitofwork.Config{Service: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	c, err := inbox.New(pool, uow, &inbox.Config{
		Group:   "billing",
		Brokers: []string{"localhost:9092"},
		Routes: []inbox.Route{{
			Topic: "order-service.order.confirmed",
			Handler: func(ctx context.Context, tx unitofwork.Tx, m *inbox.Message) error {
				var o struct {
					OrderID string `json:"order_id"`
				}
				if err := json.Unmarshal(m.Value, &o); err != nil {
					return outbox.Permanent(err) // never decodable: park it now
				}
				if _, err := tx.Exec(ctx, `INSERT INTO invoices (order_id) VALUES ($1)`, o.OrderID); err != nil {
					return err
				}
				return tx.Add(ctx, outbox.Event{AggregateType: "invoice", AggregateID: o.OrderID, Type: "invoice.created.v1", Payload: o})
			},
		}},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer func() { _ = c.Stop(ctx) }()
	// ... serve until shutdown
}
