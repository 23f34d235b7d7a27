package lazytx

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox/internal/testenv"
)

// inTx reports whether conn's session is in a transaction block.
func inTx(conn *pgx.Conn) bool { return conn.PgConn().TxStatus() != 'I' }

// A Tx sends nothing until a statement needs the transaction; each
// way of sending one begins it in the statement's round trip and hands
// back that statement's results (not BEGIN's), and Commit then commits
// what it wrote. One that never began ends without a statement.
func TestLazyTx(t *testing.T) {
	pool := testenv.Pool(t)
	ctx := context.Background()
	pc, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn := pc.Hijack()
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, "CREATE TEMP TABLE deferred (n int)"); err != nil {
		t.Fatal(err)
	}
	count := func() (n int) {
		t.Helper()
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM deferred").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	t.Run("never begun", func(t *testing.T) {
		d := New(conn)
		if c, ok := Outside(d); !ok || c != conn {
			t.Fatal("a Tx that did not begin is not outside a transaction")
		}
		if err := d.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if err := d.Rollback(ctx); !errors.Is(err, pgx.ErrTxClosed) {
			t.Fatalf("Rollback after Commit: %v, want ErrTxClosed", err)
		}
		if _, ok := Outside(d); ok {
			t.Fatal("an ended Tx is still outside a transaction")
		}
		if _, err := d.Exec(ctx, "SELECT 1"); !errors.Is(err, pgx.ErrTxClosed) {
			t.Fatalf("Exec after Commit: %v, want ErrTxClosed", err)
		}
		if inTx(conn) {
			t.Fatal("the session is in a transaction")
		}
	})

	// before: the table's rows before the statement (an earlier case's
	// commit leaves its rows, and the cases run in any order).
	var before int
	begins := map[string]func(d *Tx) error{
		"SendBatch": func(d *Tx) error {
			b := &pgx.Batch{}
			b.Queue("INSERT INTO deferred VALUES (1)")
			var got int
			b.Queue("SELECT count(*) FROM deferred").QueryRow(func(r pgx.Row) error { return r.Scan(&got) })
			br := d.SendBatch(ctx, b)
			tag, err := br.Exec() // the INSERT's, not BEGIN's
			if err != nil {
				return err
			}
			if !tag.Insert() {
				return errors.New("the batch's first result is " + tag.String() + ", not its INSERT's")
			}
			if err := br.Close(); err != nil {
				return err
			}
			if got != before+1 {
				return fmt.Errorf("the batch's second statement counted %d rows, want %d: it did not see its first", got, before+1)
			}
			return nil
		},
		"Exec": func(d *Tx) error {
			tag, err := d.Exec(ctx, "INSERT INTO deferred VALUES (1)")
			if err == nil && !tag.Insert() {
				err = errors.New("Exec returned " + tag.String())
			}
			return err
		},
		"Query": func(d *Tx) error {
			rows, err := d.Query(ctx, "INSERT INTO deferred VALUES (1), (2) RETURNING n")
			if err != nil {
				return err
			}
			ns, err := pgx.CollectRows(rows, pgx.RowTo[int])
			if err == nil && len(ns) != 2 {
				err = errors.New("Query returned other rows than its statement's")
			}
			return err
		},
	}
	for name, begin := range begins {
		t.Run(name, func(t *testing.T) {
			for _, commit := range []bool{false, true} {
				before = count()
				d := New(conn)
				if err := begin(d); err != nil {
					t.Fatal(err)
				}
				if !inTx(conn) {
					t.Fatal("the statement did not begin a transaction")
				}
				if _, ok := Outside(d); ok {
					t.Fatal("a begun Tx is outside a transaction")
				}
				// The connection is free for the transaction's next statement.
				if _, err := d.Exec(ctx, "SELECT 1"); err != nil {
					t.Fatal(err)
				}
				end := d.Rollback
				if commit {
					end = d.Commit
				}
				if err := end(ctx); err != nil {
					t.Fatal(err)
				}
				if inTx(conn) {
					t.Fatal("the transaction did not end")
				}
				if got := count() > before; got != commit {
					t.Fatalf("committed %v: rows written %v", commit, got)
				}
			}
		})
	}
}
