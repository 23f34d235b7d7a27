package textcut_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/fxoutbox/outbox/internal/textcut"
)

// last_error is a text column: a cut error message must stay valid UTF-8.
// (Moved from the relay with the helper it tested.)
func TestCutKeepsUTF8(t *testing.T) {
	s := strings.Repeat("é", 600) // 1200 bytes, 2 per character
	for _, n := range []int{1, 999, 1000} {
		got := textcut.Cut(s, n)
		if !utf8.ValidString(got) || len(got) > n || len(got) < n-1 {
			t.Errorf("Cut(%d bytes, %d) = %d bytes, valid UTF-8 %v", len(s), n, len(got), utf8.ValidString(got))
		}
	}
	if got := textcut.Cut("short", 1000); got != "short" {
		t.Errorf("Cut(short) = %q", got)
	}
}
