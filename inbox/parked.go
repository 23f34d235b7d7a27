package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fxoutbox/outbox/internal/tablesql"
	"github.com/fxoutbox/outbox/internal/textcut"
	"github.com/fxoutbox/outbox/unitofwork"
)

// Parked is a record the consumer set aside: its handler kept failing on it
// (MaxAttempts), returned a Permanent error, or the record had no identity
// or no route. It is stored with what it takes to apply it later (Retry).
// The outboxctl inbox commands list and delete the same records.
type Parked struct {
	ID int64 `json:"id"` // the parked row's id: the paging cursor, and what Retry and Delete take
	// Consumer is the consumer name (Config.Name) that parked it.
	Consumer  string            `json:"consumer"`
	EventID   string            `json:"event_id"` // "" when the record had no identity
	Type      string            `json:"event_type"`
	Topic     string            `json:"topic"`
	Partition int32             `json:"partition"`
	Offset    int64             `json:"offset"`
	Key       []byte            `json:"key"`
	Value     []byte            `json:"value"`
	Headers   map[string]string `json:"headers,omitempty"`
	Timestamp time.Time         `json:"timestamp"` // the record's; zero if it had none
	Attempts  int               `json:"attempts"`
	ErrorType string            `json:"error_type"` // one of the ErrorType constants
	LastError string            `json:"last_error"`
	ParkedAt  time.Time         `json:"parked_at"`
}

// ListOptions pages through parked records in id order.
type ListOptions struct {
	// AfterID lists records with a larger id. Default 0 (from the first).
	AfterID int64
	// Limit is the most records returned. Default 100.
	Limit int
}

// List returns this consumer's parked records (by Config.Name), oldest
// first. It needs no Start.
func (c *Consumer) List(ctx context.Context, o ListOptions) ([]Parked, error) {
	if o.Limit <= 0 {
		o.Limit = 100
	}
	rows, err := tablesql.ListInboxParked(ctx, c.db, c.cfg.Table, c.cfg.Name, o.AfterID, o.Limit)
	if err != nil {
		return nil, fmt.Errorf("inbox: %w", err)
	}
	out := make([]Parked, len(rows))
	for i, r := range rows {
		out[i] = Parked(r) // the same fields: the conversion fails to compile when they differ
	}
	return out, nil
}

// Retry applies a parked record now, through the handler its topic and type
// route to, in one transaction that also deletes the parked row: it either
// applies and disappears, or stays parked and Retry returns the handler's
// error. Its inbox row (written when it was parked) stays, so a redelivery
// of the event is still skipped. A record parked for having no identity is
// applied without deduplication: Retry is the operator's decision.
func (c *Consumer) Retry(ctx context.Context, id int64) error {
	err := c.uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
		p, err := tablesql.TakeInboxParked(ctx, tx, c.cfg.Table, c.cfg.Name, id)
		if errors.Is(err, tablesql.ErrNotFound) {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		h := c.route(p.Topic, p.Type)
		if h == nil {
			return fmt.Errorf("%w: topic %q, event type %s: add a route, or Delete the record", ErrNoRoute, p.Topic, textcut.Quote(p.Type, 100))
		}
		if p.EventID != "" {
			if _, err := tx.Exec(ctx, c.sql.insert, c.cfg.Name, p.EventID, p.Topic, p.Partition, p.Offset); err != nil {
				return err
			}
		}
		return h(ctx, tx, &Message{
			ID: p.EventID, Type: p.Type, Topic: p.Topic, Partition: p.Partition, Offset: p.Offset,
			Key: p.Key, Value: p.Value, Headers: p.Headers, Timestamp: p.Timestamp, Attempt: p.Attempts + 1,
		})
	})
	if err != nil {
		return fmt.Errorf("inbox: retry parked record %d of %s: %w", id, c.cfg.Name, err)
	}
	c.cfg.Logger.Info("outbox inbox: parked record applied", "consumer", c.cfg.Name, "parked_id", id)
	return nil
}

// Delete drops a parked record without applying it. Its inbox row stays:
// redeliveries of the event are skipped.
func (c *Consumer) Delete(ctx context.Context, id int64) error {
	err := tablesql.DeleteInboxParked(ctx, c.db, c.cfg.Table, c.cfg.Name, id)
	if errors.Is(err, tablesql.ErrNotFound) {
		return fmt.Errorf("inbox: delete parked record %d of %s: %w", id, c.cfg.Name, ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("inbox: %w", err)
	}
	return nil
}
