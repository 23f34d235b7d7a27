// Package pgoutput is the relay's logical replication client: it reads one
// table's committed inserts from a replication slot through the built-in
// pgoutput plugin (protocol 1) and hands them over a transaction at a time,
// decoded into rows. It creates the slot when asked, keeps the connection
// alive with status reports, and reports back the position its user
// confirms.
//
// Its job ends at "decoded transactions in": it knows nothing of lanes,
// claims, Kafka or parking. Its user confirms a position only once
// everything before it is handled (published, parked, or left in the table
// for a sweep); after a restart the server sends again from the position
// confirmed last.
package pgoutput

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/relay/internal/claim"
)

// SlotInUse reports the server's refusal to stream from a slot another
// connection holds ("object in use"): a slot admits one connection.
func SlotInUse(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55006"
}

// Config configures a Conn.
type Config struct {
	// Conn is the database connection's configuration: Connect adds the
	// replication parameters to a copy of it.
	Conn *pgconn.Config
	// Table is the table whose inserts are decoded; the slot is
	// Table.Slot of the connection's database, the publication
	// Table.Publication.
	Table outbox.Table
	// Timeout bounds connecting, identifying the database, and starting
	// replication.
	Timeout time.Duration
	// StatusInterval is the longest between two reports of the position
	// to the server.
	StatusInterval time.Duration
	// Pending is how many committed transactions wait between the reader
	// and the user.
	Pending int
	// Progress receives the positions, for other goroutines to read.
	Progress *Progress
}

// Progress is a stream's position, readable from any goroutine.
type Progress struct {
	confirmed atomic.Uint64
	walEnd    atomic.Uint64
}

// Confirmed is the position last confirmed (0 on a new connection until
// something was handled).
func (p *Progress) Confirmed() pglogrepl.LSN { return pglogrepl.LSN(p.confirmed.Load()) }

// WALEnd is the server's end of WAL, as last reported.
func (p *Progress) WALEnd() pglogrepl.LSN { return pglogrepl.LSN(p.walEnd.Load()) }

// confirm records that everything up to lsn is handled; the position never
// goes back.
func (p *Progress) confirm(lsn pglogrepl.LSN) {
	for {
		c := p.confirmed.Load()
		if uint64(lsn) <= c || p.confirmed.CompareAndSwap(c, uint64(lsn)) {
			return
		}
	}
}

// Row is an inserted row of the table, decoded: the row a claim reads
// (Requeued when it was inserted with attempts 0 and a last error, as an
// operator's requeue writes it), and its transaction.
type Row struct {
	claim.Row
	// Txid is the writing transaction's id (the txid column of a table
	// in cursor mode, 0 without it).
	Txid uint64
	// Err says the row could not be decoded; ID is set when that much
	// could be read.
	Err error
}

// Tx is a committed transaction's rows of the table.
type Tx struct {
	Rows []Row
	// End is the position after the transaction: confirm it once every
	// row is handled.
	End pglogrepl.LSN
	// Commit is when it committed (the server's clock).
	Commit time.Time
	// Received is when it arrived (the local clock); Age is how long
	// after its commit the server sent it (the server's clock), so that
	// Received - Age is its commit on the local clock, whatever the skew.
	Received time.Time
	Age      time.Duration
}

// Conn is one replication connection. After Connect and
// StartReplication, Read runs in a goroutine of its own and owns the
// connection; the user takes transactions from Txs and calls Confirm.
type Conn struct {
	cfg      Config
	conn     *pgconn.PgConn
	slot     string
	progress *Progress
	txs      chan Tx
	err      error // why the reader stopped; read after txs is closed
	done     chan struct{}

	// The reader's.
	rels       map[uint32]*pglogrepl.RelationMessage
	types      *pgtype.Map
	open       []Row     // rows of the transaction being received
	openAt     time.Time // its commit time
	sentAt     time.Time // the server's clock when it sent the last data message
	inTx       bool
	pushed     pglogrepl.LSN // end of the last transaction handed over
	lastStatus time.Time
}

// Connect opens a replication connection and identifies its database
// (which names the slot). The position in cfg.Progress starts at 0: one
// confirmed on an earlier connection may be behind what another relay
// confirmed since, and the server ignores a zero position.
func Connect(ctx context.Context, cfg Config) (*Conn, error) {
	c := cfg.Conn.Copy()
	if c.RuntimeParams == nil {
		c.RuntimeParams = map[string]string{}
	}
	c.RuntimeParams["replication"] = "database"
	c.RuntimeParams["application_name"] = "fxoutbox-relay"
	// pgoutput sends values as text in the session's DateStyle, which the
	// decoder reads in ISO only (a server set to SQL, German or Postgres
	// style would make every streamed row unreadable).
	c.RuntimeParams["DateStyle"] = "ISO"
	// A receive that times out (every StatusInterval when idle) must not
	// send the server a cancel request, which ends a walsender's streaming.
	c.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: pc.Conn()}
	}
	connCtx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	conn, err := pgconn.ConnectConfig(connCtx, c)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("relay: replication connection: %w", err)
	}
	s := &Conn{cfg: cfg, conn: conn, progress: cfg.Progress, rels: map[uint32]*pglogrepl.RelationMessage{}, types: pgtype.NewMap(),
		txs: make(chan Tx, cfg.Pending), done: make(chan struct{})}
	idCtx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	sys, err := pglogrepl.IdentifySystem(idCtx, conn)
	cancel()
	if err != nil {
		s.Close(ctx)
		return nil, fmt.Errorf("relay: identify the replication connection's database: %w", err)
	}
	s.slot = cfg.Table.Slot(sys.DBName)
	s.progress.confirmed.Store(0)
	return s, nil
}

// Slot is the slot's name.
func (c *Conn) Slot() string { return c.slot }

// Close closes the connection, which ends the walsender and frees the slot.
func (c *Conn) Close(ctx context.Context) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	_ = c.conn.Close(cctx)
}

// SlotExists reports whether the slot exists, and whether the server
// invalidated it (its wal_status is lost: StartReplication will fail with
// outbox.ErrSlotInvalidated), asking db.
func (c *Conn) SlotExists(ctx context.Context, db interface {
	Begin(context.Context) (pgx.Tx, error)
}) (exists, lost bool, err error) {
	cctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	tx, err := db.Begin(cctx)
	if err != nil {
		return false, false, fmt.Errorf("relay: look for replication slot: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(cctx)) }()
	err = tx.QueryRow(cctx, "SELECT true, coalesce(wal_status = 'lost', false) FROM pg_replication_slots WHERE slot_name = $1", c.slot).Scan(&exists, &lost)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, false, nil
	}
	if err != nil {
		return false, false, fmt.Errorf("relay: look for replication slot: %w", err)
	}
	return exists, lost, nil
}

// CreateSlot creates the slot and reports whether it did; a slot another
// connection created meanwhile is no error. Creating a logical slot waits
// for a consistent point: for the transactions running when it began to
// end, seen in the server's periodic snapshots of running transactions
// (every 15s), so on a busy server it can take tens of seconds. It ends
// when ctx does. On PostgreSQL 17 and later the slot is a failover slot
// (see Failover).
func (c *Conn) CreateSlot(ctx context.Context) (created bool, err error) {
	_, err = pglogrepl.ParseCreateReplicationSlot(c.conn.Exec(ctx, createSlotCommand(c.slot, c.Failover())))
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &pgErr) && pgErr.Code == "42710": // another relay created it
		return false, nil
	default:
		return false, fmt.Errorf("relay: create replication slot %s: %w", c.slot, err)
	}
}

// failoverMajor is the first PostgreSQL major version whose logical slots
// can be synchronized to physical standbys (CREATE_REPLICATION_SLOT's
// FAILOVER option; the standby's sync_replication_slots).
const failoverMajor = 17

// Failover reports whether CreateSlot makes a failover slot: the server
// is PostgreSQL 17 or later. Such a slot is copied to the physical
// standbys that synchronize slots (sync_replication_slots on the standby)
// and survives their promotion; on a server where none does, the flag
// changes nothing.
func (c *Conn) Failover() bool {
	return ServerMajor(c.conn.ParameterStatus("server_version")) >= failoverMajor
}

// createSlotCommand is the replication command that creates a logical
// slot for pgoutput, a failover slot when failover is set (PostgreSQL 17's
// option list; the older servers get the form they all accept). The slot's
// name is the relay's own (outbox.Table.Slot: lower-case letters, digits
// and underscores), never quoted.
func createSlotCommand(slot string, failover bool) string {
	cmd := "CREATE_REPLICATION_SLOT " + slot + " LOGICAL pgoutput"
	if failover {
		cmd += " (FAILOVER)"
	}
	return cmd
}

// ServerMajor is the major version in a server_version parameter ("15.4
// (Debian 15.4-1.pgdg120+1)" is 15, "17beta1" is 17), 0 when it does not
// start with one.
func ServerMajor(version string) int {
	n := 0
	for _, r := range version {
		if r < '0' || r > '9' {
			break
		}
		n = n*10 + int(r-'0')
	}
	return n
}

// StartReplication starts streaming from the slot's confirmed position,
// in the table's publication. The server refuses while another connection
// holds the slot (see SlotInUse), and with outbox.ErrSlotInvalidated when the
// slot lost its WAL. In-progress transactions are never asked for: they
// could still roll back.
func (c *Conn) StartReplication(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	err := pglogrepl.StartReplication(cctx, c.conn, c.slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + c.cfg.Table.Publication() + "'"},
	})
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && slotInvalidated(pgErr) {
			return fmt.Errorf("relay: %w: %s: %w", outbox.ErrSlotInvalidated, c.slot, err)
		}
		return fmt.Errorf("relay: start replication from slot %s: %w", c.slot, err)
	}
	return nil
}

// slotInvalidated reports the server's refusal to stream from a slot whose
// WAL it removed.
func slotInvalidated(e *pgconn.PgError) bool {
	return e.Code == "55000" && (strings.Contains(strings.ToLower(e.Message), "can no longer get changes") || strings.Contains(strings.ToLower(e.Detail), "invalidated"))
}

// SendStatus reports the confirmed position to the server. Only one
// goroutine at a time uses the connection: the reader while Read runs,
// the user before and after.
func (c *Conn) SendStatus(ctx context.Context) error {
	p := c.progress.Confirmed()
	err := pglogrepl.SendStandbyStatusUpdate(ctx, c.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: p,
		WALFlushPosition: p,
		WALApplyPosition: p,
		ClientTime:       time.Now(),
	})
	if err != nil {
		return fmt.Errorf("relay: report position to the server: %w", err)
	}
	c.lastStatus = time.Now()
	return nil
}

// Confirm records that everything up to lsn is handled; the reader reports
// it to the server within StatusInterval.
func (c *Conn) Confirm(lsn pglogrepl.LSN) { c.progress.confirm(lsn) }

// Txs delivers the committed transactions with rows of the table, in
// commit order; it is closed when Read returns.
func (c *Conn) Txs() <-chan Tx { return c.txs }

// Err says why the reader stopped (nil when ctx ended); read it after Txs
// is closed.
func (c *Conn) Err() error { return c.err }

// Done is closed when Read has returned.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Read is the reader: it receives, decodes and hands over transactions,
// and reports the position, until ctx ends or the connection fails, then
// closes Txs.
func (c *Conn) Read(ctx context.Context) {
	defer close(c.done)
	defer close(c.txs)
	for {
		wait := time.Until(c.lastStatus.Add(c.cfg.StatusInterval))
		if wait <= 0 {
			if err := c.SendStatus(ctx); err != nil {
				c.err = err
				return
			}
			continue
		}
		if err := c.receive(ctx, wait); err != nil {
			if ctx.Err() == nil {
				c.err = err
			}
			return
		}
	}
}

// hand passes a committed transaction to the user, reporting the position
// to the server while it waits.
func (c *Conn) hand(ctx context.Context, tx Tx) error {
	for {
		t := time.NewTimer(max(time.Until(c.lastStatus.Add(c.cfg.StatusInterval)), 0))
		select {
		case c.txs <- tx:
			t.Stop()
			c.pushed = tx.End
			return nil
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
			if err := c.SendStatus(ctx); err != nil {
				return err
			}
		}
	}
}

// receive reads and handles one message, waiting up to wait.
func (c *Conn) receive(ctx context.Context, wait time.Duration) error {
	rctx, cancel := context.WithTimeout(ctx, wait)
	msg, err := c.conn.ReceiveMessage(rctx)
	cancel()
	if err != nil {
		if pgconn.Timeout(err) && ctx.Err() == nil {
			return nil
		}
		return fmt.Errorf("relay: receive from the replication slot: %w", err)
	}
	switch m := msg.(type) {
	case *pgproto3.CopyData:
		if len(m.Data) == 0 {
			return nil
		}
		switch m.Data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			k, err := pglogrepl.ParsePrimaryKeepaliveMessage(m.Data[1:])
			if err != nil {
				return fmt.Errorf("relay: replication keepalive: %w", err)
			}
			c.walEnd(k.ServerWALEnd, true)
			if k.ReplyRequested {
				return c.SendStatus(ctx)
			}
		case pglogrepl.XLogDataByteID:
			x, err := pglogrepl.ParseXLogData(m.Data[1:])
			if err != nil {
				return fmt.Errorf("relay: replication data: %w", err)
			}
			c.walEnd(x.ServerWALEnd, false)
			c.sentAt = x.ServerTime
			return c.decode(ctx, x.WALData)
		}
		return nil
	case *pgproto3.ErrorResponse:
		return fmt.Errorf("relay: replication: %w", pgconn.ErrorResponseToPgError(m))
	case *pgproto3.CopyDone:
		return errors.New("relay: the server ended the replication stream")
	default:
		return nil
	}
}

// walEnd records the server's end of WAL. A keepalive's end is the
// position up to which the server has sent everything: with nothing
// received and not handled, it is confirmed, so that the slot lets the
// server recycle WAL that holds no insert of the table. (The end in a data
// message is the server's, beyond what it sent.)
func (c *Conn) walEnd(end pglogrepl.LSN, keepalive bool) {
	if end == 0 {
		return
	}
	c.progress.walEnd.Store(uint64(end))
	if keepalive && !c.inTx && c.pushed <= c.progress.Confirmed() {
		// Nothing handed over waits: everything sent is handled.
		c.progress.confirm(end)
	}
}
