package pgoutput

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgtype"
)

// decode handles one pgoutput message.
func (c *Conn) decode(ctx context.Context, data []byte) error {
	msg, err := pglogrepl.Parse(data)
	if err != nil {
		return fmt.Errorf("relay: decode pgoutput message: %w", err)
	}
	switch m := msg.(type) {
	case *pglogrepl.RelationMessage:
		c.rels[m.RelationID] = m
	case *pglogrepl.BeginMessage:
		c.open, c.openAt, c.inTx = nil, m.CommitTime, true
		if c.openAt.IsZero() {
			c.openAt = time.Now()
		}
	case *pglogrepl.InsertMessage:
		rel, ok := c.rels[m.RelationID]
		if !ok {
			return fmt.Errorf("relay: insert for relation %d before its description", m.RelationID)
		}
		if !c.ours(rel) {
			return nil
		}
		c.open = append(c.open, c.row(rel, m.Tuple))
	case *pglogrepl.CommitMessage:
		rows, at := c.open, c.openAt
		c.open, c.openAt, c.inTx = nil, time.Time{}, false
		if len(rows) == 0 {
			if c.pushed <= c.progress.Confirmed() {
				c.progress.confirm(m.TransactionEndLSN)
			}
			return nil
		}
		age := time.Duration(0) // from the commit to the server's send, on its clock
		if !c.sentAt.IsZero() && c.sentAt.After(at) {
			age = c.sentAt.Sub(at)
		}
		return c.hand(ctx, Tx{Rows: rows, End: m.TransactionEndLSN, Commit: at, Received: time.Now(), Age: age})
	}
	return nil
}

// ours reports a relation that is the table.
func (c *Conn) ours(rel *pglogrepl.RelationMessage) bool {
	t := c.cfg.Table
	return rel.RelationName == t.Name && (t.Schema == "" || rel.Namespace == t.Schema)
}

// row decodes an inserted tuple. A row that cannot be decoded keeps its id
// (when that much can be read) and the error.
func (c *Conn) row(rel *pglogrepl.RelationMessage, tuple *pglogrepl.TupleData) Row {
	var x Row
	var errs []error
	var lastError bool
	for i, col := range tuple.Columns {
		if i >= len(rel.Columns) {
			break
		}
		rc := rel.Columns[i]
		if col.DataType == 'n' {
			continue
		}
		if col.DataType != 't' {
			errs = append(errs, fmt.Errorf("column %s: unexpected tuple data kind %q", rc.Name, col.DataType))
			continue
		}
		v := col.Data
		var err error
		switch rc.Name {
		case "id":
			x.ID, err = strconv.ParseInt(string(v), 10, 64)
		case "event_id":
			x.EventID, err = uuid.ParseBytes(v)
		case "event_type":
			x.EventType = string(v)
		case "topic":
			x.Topic = string(v)
		case "partition_key":
			x.Key = string(v)
		case "payload":
			x.Payload = v
		case "headers":
			x.Headers = v
		case "attempts":
			var a int64
			a, err = strconv.ParseInt(string(v), 10, 32)
			x.Attempts = int(a)
		case "last_error":
			lastError = len(v) > 0
		case "txid":
			x.Txid, err = strconv.ParseUint(string(v), 10, 64)
		case "created_at":
			err = c.types.Scan(rc.DataType, pgtype.TextFormatCode, v, &x.CreatedAt)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("column %s: %w", rc.Name, err))
		}
	}
	x.Requeued = x.Attempts == 0 && lastError
	if x.ID == 0 {
		errs = append(errs, errors.New("no id"))
	}
	if len(errs) > 0 {
		x.Err = errors.Join(errs...)
	}
	return x
}
