package orders

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/fx"
)

// Order statuses.
const (
	StatusPending   = "PENDING"
	StatusConfirmed = "CONFIRMED"
)

// Order is an order as the API returns it.
type Order struct {
	ID          string     `json:"id"`
	CustomerID  string     `json:"customerId"`
	TotalAmount Amount     `json:"totalAmount"`
	Status      string     `json:"status"`
	CreatedAt   time.Time  `json:"createdAt"`
	ConfirmedAt *time.Time `json:"confirmedAt,omitempty"`
}

// Amount is a non-negative money amount with at most two decimals, kept as
// its decimal text ("49.90") so that no float rounds it. It is stored as
// numeric(12,2) and encoded in JSON as a string; it decodes from a JSON
// string or number.
type Amount string

var amountRE = regexp.MustCompile(`^[0-9]{1,10}(\.[0-9]{1,2})?$`)

// UnmarshalJSON accepts "49.90" and 49.90.
func (a *Amount) UnmarshalJSON(b []byte) error {
	s := strings.TrimSpace(string(b))
	if strings.HasPrefix(s, `"`) {
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
	}
	if !amountRE.MatchString(s) {
		return fmt.Errorf("totalAmount %s is not an amount such as \"49.90\" (at most 10 digits and 2 decimals, not negative)", s)
	}
	*a = Amount(s)
	return nil
}

// store runs the orders table's statements. The table lives in the outbox
// table's schema.
type store struct {
	table string // quoted, schema-qualified
	lock  string // advisory lock key for creating it
}

func newStore(lc fx.Lifecycle, c Config, pool *pgxpool.Pool) *store {
	s := &store{table: pgx.Identifier{"orders"}.Sanitize(), lock: "orders-example-schema"}
	if schema := c.Outbox.Table.Schema; schema != "" {
		s.table = pgx.Identifier{schema, "orders"}.Sanitize()
		s.lock += ":" + schema
	}
	lc.Append(fx.StartHook(func(ctx context.Context) error {
		return s.create(ctx, pool, c.Outbox.Table.Schema)
	}))
	return s
}

// create creates the schema and the orders table if they do not exist.
// The advisory lock serializes replicas that start together (CREATE ... IF
// NOT EXISTS alone can still fail on a concurrent create).
func (s *store) create(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext($1))", s.lock); err != nil {
			return err
		}
		if schema != "" {
			if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize()); err != nil {
				return fmt.Errorf("orders: create schema: %w", err)
			}
		}
		_, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+s.table+` (
			id           uuid          PRIMARY KEY,
			customer_id  text          NOT NULL,
			total_amount numeric(12,2) NOT NULL CHECK (total_amount >= 0),
			status       text          NOT NULL CHECK (status IN ('PENDING', 'CONFIRMED')),
			created_at   timestamptz   NOT NULL DEFAULT now(),
			confirmed_at timestamptz
		)`)
		if err != nil {
			return fmt.Errorf("orders: create table %s: %w", s.table, err)
		}
		return nil
	})
}

const orderColumns = "id::text, customer_id, total_amount::text, status, created_at, confirmed_at"

func scanOrder(row pgx.Row) (Order, error) {
	var o Order
	var amount string
	err := row.Scan(&o.ID, &o.CustomerID, &amount, &o.Status, &o.CreatedAt, &o.ConfirmedAt)
	o.TotalAmount = Amount(amount)
	return o, err
}

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// insert creates a pending order and returns it; pgx.ErrNoRows means an
// order with that id exists.
func (s *store) insert(ctx context.Context, q querier, id, customer string, total Amount) (Order, error) {
	return scanOrder(q.QueryRow(ctx, `INSERT INTO `+s.table+` (id, customer_id, total_amount, status)
		VALUES ($1, $2, $3::numeric, 'PENDING') ON CONFLICT (id) DO NOTHING RETURNING `+orderColumns,
		id, customer, string(total)))
}

// get reads an order; pgx.ErrNoRows when there is none.
func (s *store) get(ctx context.Context, q querier, id string) (Order, error) {
	return scanOrder(q.QueryRow(ctx, `SELECT `+orderColumns+` FROM `+s.table+` WHERE id = $1`, id))
}

// lockOrder reads an order and locks its row until the transaction ends, so
// concurrent confirmations of one order run one after the other (and its
// events are inserted and committed in order); pgx.ErrNoRows when there is
// none.
func (s *store) lockOrder(ctx context.Context, q querier, id string) (Order, error) {
	return scanOrder(q.QueryRow(ctx, `SELECT `+orderColumns+` FROM `+s.table+` WHERE id = $1 FOR UPDATE`, id))
}

// confirm sets a locked order's status and confirmation time.
func (s *store) confirm(ctx context.Context, q querier, id string) (Order, error) {
	return scanOrder(q.QueryRow(ctx, `UPDATE `+s.table+` SET status = 'CONFIRMED', confirmed_at = now()
		WHERE id = $1 RETURNING `+orderColumns, id))
}
