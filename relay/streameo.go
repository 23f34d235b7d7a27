package relay

import (
	"context"

	"github.com/fxoutbox/outbox/relay/internal/feed"
	"github.com/fxoutbox/outbox/relay/internal/kafkaproducer"
)

// Exactly once in Stream mode (cursor progress): the publisher of the
// stream's transactions (relay/internal/feed runs them), and the handover
// of the stream's record to the lanes' positions before the relay polls.

// streamTxnPublisher publishes in the stream's transaction.
type streamTxnPublisher struct{ txn *kafkaproducer.Txn }

func (p streamTxnPublisher) Publish(ctx context.Context, msgs []Message) error {
	return results(msgs, p.txn.Produce(ctx, records(msgs)))
}

// eoStreamFallback hands the stream's progress to the table before the
// relay polls it for want of a slot (feed.Fallback); nothing to do but
// under exactly-once and cursor progress.
func (r *Relay) eoStreamFallback(ctx context.Context) error {
	if r.eo == nil || r.cur == nil {
		return nil
	}
	return feed.Fallback(ctx, r.feedConfig())
}
