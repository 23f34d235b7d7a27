// Package partition holds the SQL of a partitioned outbox table's upkeep
// (see migrations/partitioned and docs/partitions.md): reading its
// partitions, making them ahead of time, re-bounding the open-ended tail,
// and retiring the oldest partition once every lane delivered it.
//
// The table is partitioned by RANGE of event_id (UUIDv7: its first 48 bits
// are a time in milliseconds). Its partitions are, in order, the head
// [MINVALUE, oldest), one per interval [lo, hi), and the tail [last,
// MAXVALUE); there is no DEFAULT partition, and every id has a partition.
// Each change that moves a bound is one transaction under a lock timeout,
// so the ranges stay covered at every commit: a write never fails for want
// of a partition.
package partition

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/sqlname"
)

// Ahead is how many intervals past now the upkeep keeps partitions for,
// as the migration makes them: the tail takes the writes beyond.
const Ahead = 7

// DefaultInterval is the interval of a table whose partitions say none (no
// partition between head and tail).
const DefaultInterval = 24 * time.Hour

// Bound is the name of the CHECK constraint, equal to its partition
// bound, that the upkeep gives the head and, while it re-bounds it, the
// tail: ATTACH PARTITION then proves the bound from it instead of scanning.
const Bound = "fxoutbox_bound"

// Querier runs statements: a pgx.Tx or a connection.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Part is one partition.
type Part struct {
	Name   string    // relname, in the table's schema
	Lo, Hi time.Time // its bounds' times; Lo zero for the head, Hi zero for the tail
	LoID   string    // its bounds as the catalog has them ("" for MINVALUE/MAXVALUE)
	HiID   string
	// Pending says a DETACH PARTITION ... CONCURRENTLY (by hand: the upkeep
	// does not use it) stopped half-way.
	Pending bool
	// Note is the upkeep's last word on it (its comment, less the prefix).
	Note string
}

// Head and Tail tell the open-ended partitions.
func (p Part) Head() bool { return p.LoID == "" }
func (p Part) Tail() bool { return p.HiID == "" }

// Layout is a table's partitions, by bound.
type Layout struct {
	Partitioned bool
	Schema      string // the table's schema, resolved
	Base        string // the table's name
	Parts       []Part // head first, tail last
}

// Interval is the partitions' interval: the narrowest span between head
// and tail (a re-bounded tail spans several), DefaultInterval without one.
func (l Layout) Interval() time.Duration {
	var d time.Duration
	for _, p := range l.Parts {
		if !p.Head() && !p.Tail() && (d == 0 || p.Hi.Sub(p.Lo) < d) {
			d = p.Hi.Sub(p.Lo)
		}
	}
	if d <= 0 {
		return DefaultInterval
	}
	return d
}

// Head and Tail return the open-ended partitions (zero Part when missing).
func (l Layout) Head() Part {
	if len(l.Parts) > 0 && l.Parts[0].Head() {
		return l.Parts[0]
	}
	return Part{}
}

func (l Layout) Tail() Part {
	if n := len(l.Parts); n > 0 && l.Parts[n-1].Tail() {
		return l.Parts[n-1]
	}
	return Part{}
}

// Ident quotes a partition's name in the table's schema.
func (l Layout) Ident(name string) string { return pgx.Identifier{l.Schema, name}.Sanitize() }

// notePrefix marks the comments the upkeep writes.
const notePrefix = "fxoutbox: "

var boundRE = regexp.MustCompile(`^FOR VALUES FROM \((MINVALUE|'[0-9a-f-]{36}')\) TO \((MAXVALUE|'[0-9a-f-]{36}')\)$`)

// Load reads table's partitions from the catalog (any role may).
func Load(ctx context.Context, q Querier, table outbox.Table) (Layout, error) {
	var l Layout
	err := q.QueryRow(ctx, "SELECT c.relkind = 'p', n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)",
		sqlname.Ident(table)).Scan(&l.Partitioned, &l.Schema, &l.Base)
	if errors.Is(err, pgx.ErrNoRows) {
		return l, nil // no table: not partitioned (what uses it says it is missing)
	}
	if err != nil || !l.Partitioned {
		return l, err
	}
	rows, err := q.Query(ctx, "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid), i.inhdetachpending,"+
		" coalesce(obj_description(c.oid, 'pg_class'), '') FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass($1)", sqlname.Ident(table))
	if err != nil {
		return l, err
	}
	var bound, note string
	var p Part
	_, err = pgx.ForEachRow(rows, []any{&p.Name, &bound, &p.Pending, &note}, func() error {
		m := boundRE.FindStringSubmatch(bound)
		if m == nil {
			return fmt.Errorf("partition %s of %s has the bound %q, which is not a range of event ids: only partitions the partitioned migration and the relay make are supported", p.Name, table, bound)
		}
		q := p
		q.Note, _ = strings.CutPrefix(note, notePrefix)
		if m[1] != "MINVALUE" {
			q.LoID, q.Lo = strings.Trim(m[1], "'"), IDTime(strings.Trim(m[1], "'"))
		}
		if m[2] != "MAXVALUE" {
			q.HiID, q.Hi = strings.Trim(m[2], "'"), IDTime(strings.Trim(m[2], "'"))
		}
		l.Parts = append(l.Parts, q)
		return nil
	})
	slices.SortFunc(l.Parts, func(a, b Part) int {
		switch {
		case a.Head() || b.Tail():
			return -1
		case b.Head() || a.Tail():
			return 1
		}
		return a.Lo.Compare(b.Lo)
	})
	return l, err
}

// IDTime is the time in the first 48 bits of a UUID (of version 7).
func IDTime(id string) time.Time {
	h := strings.ReplaceAll(id, "-", "")
	if len(h) < 12 {
		return time.Time{}
	}
	ms, err := strconv.ParseInt(h[:12], 16, 64)
	if err != nil {
		return time.Time{}
	}
	return time.UnixMilli(ms).UTC()
}

// IDAt is the lowest UUID of time t: its milliseconds, then zeros.
func IDAt(t time.Time) string {
	var b [16]byte
	ms := uint64(t.UnixMilli())
	for i := range 6 {
		b[i] = byte(ms >> (40 - 8*i))
	}
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// Name is the name of the partition of base starting at lo, as the
// migration names them: <base, cut to 48 bytes>_pYYYYMMDD_HHMI (UTC).
func Name(base string, lo time.Time) string {
	return base[:min(len(base), 48)] + "_p" + lo.UTC().Format("20060102_1504")
}

// HeadName and TailName name the open-ended partitions.
func HeadName(base string) string { return base[:min(len(base), 58)] + "_head" }
func TailName(base string) string { return base[:min(len(base), 58)] + "_tail" }

// Floor is the start of the interval that holds t (intervals count from
// the Unix epoch).
func Floor(t time.Time, interval time.Duration) time.Time {
	ms, step := t.UnixMilli(), interval.Milliseconds()
	return time.UnixMilli(ms - ((ms%step)+step)%step).UTC()
}

// Note records the upkeep's word on a partition as its comment, when it
// differs from the one there ("" removes it).
func Note(ctx context.Context, q Querier, l Layout, p Part, note string) error {
	if p.Note == note {
		return nil
	}
	// COMMENT takes no parameters: the text goes in as a literal.
	lit := "NULL"
	if note != "" {
		lit = quote(notePrefix + note)
	}
	_, err := q.Exec(ctx, "COMMENT ON TABLE "+l.Ident(p.Name)+" IS "+lit)
	if err != nil {
		return fmt.Errorf("note on partition %s: %w", p.Name, err)
	}
	return nil
}

// quote is an SQL string literal of s.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// parent is the table's name, quoted, from the layout.
func (l Layout) parent() string { return pgx.Identifier{l.Schema, l.Base}.Sanitize() }
