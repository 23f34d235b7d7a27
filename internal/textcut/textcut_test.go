package textcut_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/fxoutbox/outbox/internal/textcut"
)

// A cut that would fall inside a character moves back to its start, for
// every cut position over text of 1-, 2-, 3- and 4-byte characters.
func TestCutNeverSplitsACharacter(t *testing.T) {
	s := "aé€😀b€é😀"
	for n := -1; n <= len(s)+1; n++ {
		got := textcut.Cut(s, n)
		if !utf8.ValidString(got) {
			t.Errorf("Cut(%q, %d) = %q: not valid UTF-8", s, n, got)
		}
		if len(got) > max(n, 0) {
			t.Errorf("Cut(%q, %d) = %q: %d bytes, over %d", s, n, got, len(got), n)
		}
		if !strings.HasPrefix(s, got) {
			t.Errorf("Cut(%q, %d) = %q: not a prefix", s, n, got)
		}
		// The longest such prefix: one more character would not fit.
		if rest := s[len(got):]; rest != "" {
			_, size := utf8.DecodeRuneInString(rest)
			if len(got)+size <= n {
				t.Errorf("Cut(%q, %d) = %q: the next character (%d bytes) still fits", s, n, got, size)
			}
		}
	}
	// "€" is 3 bytes: cut at 1 or 2 bytes into it, nothing of it is kept.
	if got := textcut.Cut("x€", 2); got != "x" {
		t.Errorf(`Cut("x€", 2) = %q, want "x"`, got)
	}
}

func TestClipQuoteEscape(t *testing.T) {
	for _, c := range []struct{ name, got, want string }{
		{"clip short", textcut.Clip("abc", 3), "abc"},
		{"clip long", textcut.Clip("abcd", 3), "abc..."},
		{"clip mid-rune", textcut.Clip("ab€", 3), "ab..."},
		{"quote short", textcut.Quote("a\nb", 3), `"a\nb"`},
		{"quote long", textcut.Quote("ab€d", 4), `"ab"... (6 bytes)`},
		{"quote invalid", textcut.Quote("a\xffb", 10), `"a\xffb"`},
		{"escape", textcut.Escape("a\x00€\nz", 100), `a\x00€\nz`},
		{"escape long", textcut.Escape("€€€", 4), "€..."},
	} {
		if c.got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, c.got, c.want)
		}
	}
}
