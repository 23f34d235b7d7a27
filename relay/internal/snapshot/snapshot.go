// Package snapshot is the arithmetic of PostgreSQL's pg_snapshot on the
// streaming relay's side: which committed transactions a snapshot sees,
// and the snapshot that sees what all of several see.
package snapshot

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pglogrepl"
)

// Snapshot is a pg_snapshot: a transaction id below xmin is finished,
// one from xmax on is not seen, and those in xip (sorted) were running.
// The zero Snapshot sees nothing.
type Snapshot struct {
	xmin, xmax uint64
	xip        []uint64
}

// Parse parses pg_snapshot's text form, xmin:xmax:xip,xip,...
func Parse(s string) (Snapshot, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return Snapshot{}, fmt.Errorf("relay: snapshot %q: want xmin:xmax:xip", s)
	}
	var sn Snapshot
	var err error
	if sn.xmin, err = strconv.ParseUint(parts[0], 10, 64); err != nil {
		return Snapshot{}, fmt.Errorf("relay: snapshot %q: %w", s, err)
	}
	if sn.xmax, err = strconv.ParseUint(parts[1], 10, 64); err != nil {
		return Snapshot{}, fmt.Errorf("relay: snapshot %q: %w", s, err)
	}
	if parts[2] != "" {
		for _, x := range strings.Split(parts[2], ",") {
			v, err := strconv.ParseUint(x, 10, 64)
			if err != nil {
				return Snapshot{}, fmt.Errorf("relay: snapshot %q: %w", s, err)
			}
			sn.xip = append(sn.xip, v)
		}
	}
	slices.Sort(sn.xip)
	return sn, nil
}

// Visible reports whether a committed transaction x is seen by s (as
// pg_visible_in_snapshot).
func (s Snapshot) Visible(x uint64) bool {
	if x < s.xmin {
		return true
	}
	if x >= s.xmax {
		return false
	}
	_, running := slices.BinarySearch(s.xip, x)
	return !running
}

// Intersect returns the snapshot that sees what all of snaps see: the
// lowest xmin and xmax, and every transaction any of them saw running below
// that xmax.
func Intersect(snaps []Snapshot) Snapshot {
	if len(snaps) == 0 {
		return Snapshot{}
	}
	out := Snapshot{xmin: snaps[0].xmin, xmax: snaps[0].xmax}
	for _, s := range snaps[1:] {
		out.xmin, out.xmax = min(out.xmin, s.xmin), min(out.xmax, s.xmax)
	}
	for _, s := range snaps {
		for _, x := range s.xip {
			if x < out.xmax {
				out.xip = append(out.xip, x)
			}
		}
	}
	slices.Sort(out.xip)
	out.xip = slices.Compact(out.xip)
	out.xmin = min(out.xmin, out.xmax)
	return out
}

// Candidate is a snapshot (its text) taken with the table's highest id it
// sees and the WAL insert position after it: every transaction it sees
// ends at or before LSN. Once the stream has resolved every transaction
// it sees, it is a checkpoint.
type Candidate struct {
	Snap string
	Base int64
	LSN  pglogrepl.LSN
	Seq  int64 // the stream's resolved rows when it was taken
}
