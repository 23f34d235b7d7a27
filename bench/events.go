package main

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/relay"
)

// The events every contender carries: aggregate "order", a key drawn from
// Keys distinct order ids, type order.created.v1, and a 256-byte JSON payload.
const (
	aggregateType = "order"
	eventType     = "order.created.v1"
	padLen        = 200 // makes payload() exactly 256 bytes, also as jsonb text
)

var pad = strings.Repeat("x", padLen)

// payload returns a 256-byte JSON document, written in the canonical form
// PostgreSQL's jsonb prints (keys by length, ": " and ", "), so it is 256
// bytes in the table and on the wire.
func payload(key, seq int) []byte {
	return fmt.Appendf(nil, `{"pad": "%s", "seq": "%07d", "order_id": "%s"}`, pad, seq%10_000_000, orderID(key))
}

func orderID(key int) string { return fmt.Sprintf("order-%05d", key%100_000) }

func randKey(keys int) int { return rand.IntN(keys) }

// preloadOutbox fills the outbox table with n unpublished events for topic,
// in id order, as the unit of work would have written them (headers NULL: no
// trace context), then VACUUM ANALYZEs it like every contender's table.
func (e *env) preloadOutbox(ctx context.Context, topic string, n int) error {
	return e.preloadInto(ctx, e.table, topic, n)
}

// preloadInto is preloadOutbox into table t; for the cursor table it
// also empties the lanes' positions, so that the next cursor relay starts
// them afresh at the backlog's first row (migrations.Cursor.Up's Init).
func (e *env) preloadInto(ctx context.Context, t outbox.Table, topic string, n int) error {
	return e.preload(ctx, t, topic, n, false)
}

// preload empties table t and writes n events for topic into it, already
// published when published (in the INSERT: no UPDATE, no dead tuple, no
// free space left behind), then vacuums and analyzes it.
func (e *env) preload(ctx context.Context, t outbox.Table, topic string, n int, published bool) error {
	if err := e.truncate(ctx, t); err != nil {
		return err
	}
	if err := e.insertEvents(ctx, t, topic, 1, n, published); err != nil {
		return fmt.Errorf("preload: %w", err)
	}
	_, err := e.pool.Exec(ctx, "VACUUM ANALYZE "+ident(t))
	return err
}

// insertEvents writes events from to to (their sequence numbers) for topic
// into table t in one statement, published already when published (in the
// INSERT: no UPDATE), each with a key of the bench's Keys.
func (e *env) insertEvents(ctx context.Context, t outbox.Table, topic string, from, to int, published bool) error {
	at := "NULL::timestamptz"
	if published {
		at = "now()"
	}
	q := `INSERT INTO ` + ident(t) + ` (published_at, event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key)
		SELECT ` + at + `, gen_random_uuid(), $1, k, $2,
		       format('{"pad": "%s", "seq": "%s", "order_id": "%s"}', $3::text, lpad(i::text, 7, '0'), k)::jsonb,
		       $4, k
		FROM (SELECT i, 'order-' || lpad(floor(random() * $7)::int::text, 5, '0') AS k
		      FROM generate_series($5::int, $6::int) AS i) AS s
		ORDER BY i`
	_, err := e.pool.Exec(ctx, q, aggregateType, eventType, pad, topic, from, to, e.p.Keys)
	return err
}

// truncate empties table t (and restarts its ids); for the cursor table,
// its positions too.
func (e *env) truncate(ctx context.Context, t outbox.Table) error {
	q := "TRUNCATE " + ident(t) + " RESTART IDENTITY"
	if t == e.ctable {
		q = "TRUNCATE " + ident(t) + ", " + ident(positionsOf(t)) + " RESTART IDENTITY"
	}
	_, err := e.pool.Exec(ctx, q)
	return err
}

// relayConfigFields lists relay.Config's fields, so results.json records
// which library API (and defaults) were measured.
func relayConfigFields() []string {
	t := reflect.TypeOf(relay.Config{})
	out := make([]string, 0, t.NumField())
	for i := range t.NumField() {
		out = append(out, t.Field(i).Name)
	}
	return out
}

// ---- statistics ----

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// percentile of sorted durations, in milliseconds (nearest rank).
func percentileMS(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	i = max(0, min(i, len(sorted)-1))
	return round2(float64(sorted[i]) / float64(time.Millisecond))
}

func round1(x float64) float64 { return math.Round(x*10) / 10 }
func round2(x float64) float64 { return math.Round(x*100) / 100 }
func round3(x float64) float64 { return math.Round(x*1000) / 1000 }

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return round3(a / b)
}

// medianRatio is the median over rounds of a[i]/b[i]: each ratio compares
// two figures measured next to each other in the same round.
func medianRatio(a, b []float64) float64 {
	n := min(len(a), len(b))
	var rs []float64
	for i := range n {
		if b[i] > 0 {
			rs = append(rs, a[i]/b[i])
		}
	}
	if len(rs) == 0 {
		// Fall back to the ratio of medians (e.g. fewer rounds of b).
		return ratio(median(a), median(b))
	}
	return round3(median(rs))
}
