package tablesql

import (
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Filter is the conditions of admin.Filter on an outbox table's rows, which
// admin and adminui both turn into SQL here; zero fields match any row.
type Filter struct {
	EventIDs     []uuid.UUID
	Topic, Type  string
	Key          string // partition_key
	Since, Until time.Time
	Error        string // a substring of errExpr, ignoring case
	FromID, ToID int64  // inclusive bounds of id
}

// Where returns f's conditions, each preceded by " AND ", and sets their
// arguments in args; errExpr is the text that Error searches (last_error,
// or a parked table's reason and last error).
func (f Filter) Where(args pgx.NamedArgs, errExpr string) string {
	var b strings.Builder
	add := func(cond, name string, v any) {
		b.WriteString(" AND " + cond)
		args[name] = v
	}
	if len(f.EventIDs) > 0 {
		add("event_id = ANY(@f_ids::uuid[])", "f_ids", f.EventIDs)
	}
	if f.Topic != "" {
		add("topic = @f_topic", "f_topic", f.Topic)
	}
	if f.Type != "" {
		add("event_type = @f_type", "f_type", f.Type)
	}
	if f.Key != "" {
		add("partition_key = @f_key", "f_key", f.Key)
	}
	if !f.Since.IsZero() {
		add("created_at >= @f_since", "f_since", f.Since)
	}
	if !f.Until.IsZero() {
		add("created_at < @f_until", "f_until", f.Until)
	}
	if f.Error != "" {
		add("strpos(lower("+errExpr+"), lower(@f_error)) > 0", "f_error", f.Error)
	}
	if f.FromID != 0 {
		add("id >= @f_from", "f_from", f.FromID)
	}
	if f.ToID != 0 {
		add("id <= @f_to", "f_to", f.ToID)
	}
	return b.String()
}
