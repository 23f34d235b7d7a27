package tablesql

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
	"github.com/fxoutbox/outbox/internal/textcut"
)

// InboxParked is a record an inbox consumer (package inbox) set aside: its
// handler kept failing on it (MaxAttempts), returned a Permanent error, or
// the record had no identity or no route. It is stored with what it takes
// to apply it later (inbox.Consumer.Retry). inbox.Parked, its public face,
// has the same fields (inbox converts one to the other).
type InboxParked struct {
	ID int64 `json:"id"` // the parked row's id: the paging cursor
	// Consumer is the consumer name (inbox Config.Name) that parked it.
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
	ErrorType string            `json:"error_type"` // one of inbox's ErrorType values
	LastError string            `json:"last_error"`
	ParkedAt  time.Time         `json:"parked_at"`
}

// InboxParkedCount is one group of an inbox's parked records, as
// CountInboxParked reports them.
type InboxParkedCount struct {
	Consumer  string `json:"consumer"`
	Topic     string `json:"topic"`
	ErrorType string `json:"error_type"`
	Count     int64  `json:"count"`
	// FirstParkedAt and LastParkedAt are the group's oldest and newest
	// parked_at.
	FirstParkedAt time.Time `json:"first_parked_at"`
	LastParkedAt  time.Time `json:"last_parked_at"`
}

const inboxParkedCols = `id, consumer, event_id, event_type, topic, "partition", "offset", key, value, headers, "timestamp", attempts, error_type, last_error, parked_at`

func scanInboxParked(row pgx.CollectableRow) (InboxParked, error) {
	var (
		p        InboxParked
		id, typ  *string
		ts       *time.Time
		attempts int32
	)
	err := row.Scan(&p.ID, &p.Consumer, &id, &typ, &p.Topic, &p.Partition, &p.Offset, &p.Key, &p.Value, &p.Headers, &ts, &attempts,
		&p.ErrorType, &p.LastError, &p.ParkedAt)
	if id != nil {
		p.EventID = *id
	}
	if typ != nil {
		p.Type = *typ
	}
	if ts != nil {
		p.Timestamp = *ts
	}
	p.Attempts = int(attempts)
	return p, err
}

// inboxParked returns the inbox's parked table (<name>_parked, the name
// defaulting to sqlname.DefaultInbox) after checking the name.
func inboxParked(table outbox.Table) (outbox.Table, error) {
	table = sqlname.Inbox(table)
	if err := table.Validate(); err != nil {
		return table, err
	}
	return outbox.Table{Schema: table.Schema, Name: table.Name + "_parked"}, nil
}

// whose names the consumer in messages: quoted and cut, or "every
// consumer".
func whose(consumer string) string {
	if consumer == "" {
		return "every consumer"
	}
	return "consumer " + strconv.Quote(textcut.Clip(consumer, 100))
}

// ListInboxParked returns the parked records of the inbox table (default
// outbox_inbox; the records are in <name>_parked) with an id above after,
// oldest (lowest id) first, at most limit (0: DefaultLimit), with their
// payloads and headers. consumer "" lists every consumer's; each record
// names its Consumer. For the next page, call it again with after set to
// the last record's ID.
func ListInboxParked(ctx context.Context, db Querier, table outbox.Table, consumer string, after int64, limit int) ([]InboxParked, error) {
	parked, err := inboxParked(table)
	if err != nil {
		return nil, err
	}
	switch {
	case limit < 0:
		return nil, &outbox.ConfigError{Field: "limit", Reason: fmt.Sprintf("is %d: use 0 (the default, %d) or more", limit, DefaultLimit)}
	case after < 0:
		return nil, &outbox.ConfigError{Field: "after", Reason: fmt.Sprintf("is %d: use 0 (from the first) or a record's id", after)}
	case limit == 0:
		limit = DefaultLimit
	}
	rows, err := db.Query(ctx, "SELECT "+inboxParkedCols+" FROM "+sqlname.Ident(parked)+
		" WHERE ($1 = '' OR consumer = $1) AND id > $2 ORDER BY id LIMIT $3", consumer, after, limit)
	if err != nil {
		return nil, fmt.Errorf("admin: list parked records of %s in %s: %w", whose(consumer), parked, err)
	}
	out, err := pgx.CollectRows(rows, scanInboxParked)
	if err != nil {
		return nil, fmt.Errorf("admin: list parked records of %s in %s: %w", whose(consumer), parked, err)
	}
	return out, nil
}

// GetInboxParked returns the parked record with this id, of this consumer
// ("" for any), or ErrNotFound.
func GetInboxParked(ctx context.Context, db Querier, table outbox.Table, consumer string, id int64) (InboxParked, error) {
	parked, err := inboxParked(table)
	if err != nil {
		return InboxParked{}, err
	}
	rows, err := db.Query(ctx, "SELECT "+inboxParkedCols+" FROM "+sqlname.Ident(parked)+" WHERE id = $1 AND ($2 = '' OR consumer = $2)", id, consumer)
	if err != nil {
		return InboxParked{}, fmt.Errorf("admin: read parked record %d of %s in %s: %w", id, whose(consumer), parked, err)
	}
	p, err := pgx.CollectExactlyOneRow(rows, scanInboxParked)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return InboxParked{}, fmt.Errorf("admin: parked record %d of %s in %s: %w", id, whose(consumer), parked, ErrNotFound)
	case err != nil:
		return InboxParked{}, fmt.Errorf("admin: read parked record %d of %s in %s: %w", id, whose(consumer), parked, err)
	}
	return p, nil
}

// TakeInboxParked deletes the parked record with this id, of this
// consumer ("" for any), and returns it, or ErrNotFound: inbox.Consumer.Retry
// takes the record in the transaction that applies it, so it either applies
// and disappears or, rolled back, stays parked.
func TakeInboxParked(ctx context.Context, db Querier, table outbox.Table, consumer string, id int64) (InboxParked, error) {
	parked, err := inboxParked(table)
	if err != nil {
		return InboxParked{}, err
	}
	rows, err := db.Query(ctx, "DELETE FROM "+sqlname.Ident(parked)+" WHERE id = $1 AND ($2 = '' OR consumer = $2) RETURNING "+inboxParkedCols, id, consumer)
	if err != nil {
		return InboxParked{}, fmt.Errorf("admin: take parked record %d of %s in %s: %w", id, whose(consumer), parked, err)
	}
	p, err := pgx.CollectExactlyOneRow(rows, scanInboxParked)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return InboxParked{}, fmt.Errorf("admin: parked record %d of %s in %s: %w", id, whose(consumer), parked, ErrNotFound)
	case err != nil:
		return InboxParked{}, fmt.Errorf("admin: take parked record %d of %s in %s: %w", id, whose(consumer), parked, err)
	}
	return p, nil
}

// DeleteInboxParked deletes the parked record with this id, of this
// consumer ("" for any), without applying it; a record that is not there
// is ErrNotFound. The event's inbox row (written when it was parked, when
// it had an identity) stays, so redeliveries of the event are skipped.
func DeleteInboxParked(ctx context.Context, db Querier, table outbox.Table, consumer string, id int64) error {
	parked, err := inboxParked(table)
	if err != nil {
		return err
	}
	tag, err := db.Exec(ctx, "DELETE FROM "+sqlname.Ident(parked)+" WHERE id = $1 AND ($2 = '' OR consumer = $2)", id, consumer)
	if err != nil {
		return fmt.Errorf("admin: delete parked record %d of %s in %s: %w", id, whose(consumer), parked, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("admin: delete parked record %d of %s in %s: %w", id, whose(consumer), parked, ErrNotFound)
	}
	return nil
}

// CountInboxParked returns the inbox's parked records grouped by consumer,
// topic and error type, the largest groups first, each with its oldest
// and newest parked_at: what a status view shows. No rows is an empty
// slice.
func CountInboxParked(ctx context.Context, db Querier, table outbox.Table) ([]InboxParkedCount, error) {
	parked, err := inboxParked(table)
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, `SELECT consumer, topic, error_type, count(*), min(parked_at), max(parked_at) FROM `+sqlname.Ident(parked)+` GROUP BY consumer, topic, error_type ORDER BY count(*) DESC, consumer, topic, error_type`)
	if err != nil {
		return nil, fmt.Errorf("admin: count parked records in %s: %w", parked, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (InboxParkedCount, error) {
		var c InboxParkedCount
		err := r.Scan(&c.Consumer, &c.Topic, &c.ErrorType, &c.Count, &c.FirstParkedAt, &c.LastParkedAt)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("admin: count parked records in %s: %w", parked, err)
	}
	return out, nil
}
