package eo

import (
	"fmt"
	"testing"

	"github.com/fxoutbox/outbox/relay/internal/claim"
	"github.com/fxoutbox/outbox/relay/internal/pgoutput"
)

// The exactly-once stream's record: ids as ranges, and which decoded rows
// a record holds resolved (by position, by its done snapshot, by its ids).
func TestStreamRecordHoldsWhatItSays(t *testing.T) {
	if got := fmt.Sprint(IDRanges([]int64{7, 3, 4, 5, 9, 10, 4})); got != "[[3 5] [7 7] [9 10]]" {
		t.Errorf("idRanges = %s", got)
	}
	if IDRanges(nil) != nil {
		t.Errorf("IDRanges(nil) is not empty")
	}
	e, err := ResumeStream(nil, &StreamRecord{Mode: StreamModeStream, LSN: 100, Done: "50:60:55", Base: 9, IDs: [][2]int64{{20, 21}}}, 4)
	if err != nil {
		t.Fatal(err)
	}
	if len(e.IDs) != 2 {
		t.Fatalf("the record's ids were dropped at start: %v", e.IDs)
	}
	x := pgoutput.Tx{End: 200, Rows: []pgoutput.Row{
		{Row: claim.Row{ID: 10}, Txid: 49}, // seen by done
		{Row: claim.Row{ID: 11}, Txid: 55}, // running at done
		{Row: claim.Row{ID: 20}, Txid: 70}, // in ids
		{Row: claim.Row{ID: 22}, Txid: 70}, // past done, not in ids
	}}
	skip, err := e.Skip(t.Context(), x, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(skip); got != "[true false true false]" {
		t.Errorf("skip = %s, want [true false true false]", got)
	}
	old := pgoutput.Tx{End: 100, Rows: []pgoutput.Row{{Row: claim.Row{ID: 30}, Txid: 80}}}
	if skip, _ := e.Skip(t.Context(), old, nil); !skip[0] {
		t.Errorf("a transaction that ended at the record's position is not skipped")
	}
	// A later done drops the ids it sees, and those read at start whose
	// transaction is not known.
	e.IDs[40] = 90
	if err := e.SetDone("95:95:", 40); err != nil {
		t.Fatal(err)
	}
	if len(e.IDs) != 0 {
		t.Errorf("ids after a done that sees them all: %v", e.IDs)
	}
	if _, err := ResumeStream(nil, &StreamRecord{Mode: StreamModeStream, Lanes: []StreamLane{{Done: "1:1:"}}}, 4); err == nil {
		t.Errorf("a record with 1 lane for a relay with 4: no error")
	}
}
