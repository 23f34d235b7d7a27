package relay

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// last_error is a text column: a cut error message must stay valid UTF-8.
func TestTruncateKeepsUTF8(t *testing.T) {
	s := strings.Repeat("é", 600) // 1200 bytes, 2 per character
	for _, n := range []int{1, 999, 1000} {
		got := truncate(s, n)
		if !utf8.ValidString(got) || len(got) > n || len(got) < n-1 {
			t.Errorf("truncate(%d bytes, %d) = %d bytes, valid UTF-8 %v", len(s), n, len(got), utf8.ValidString(got))
		}
	}
	if got := truncate("short", 1000); got != "short" {
		t.Errorf("truncate(short) = %q", got)
	}
}
