// Package textcut shortens text from elsewhere (values, errors, names) for
// messages, logs and text columns, by one rule: a cut never falls inside a
// UTF-8 character, so the result is as valid as the input (PostgreSQL's
// text type refuses broken UTF-8, and a broken character in a message is
// noise). Every package of the module cuts text with it.
package textcut

import (
	"strconv"
	"unicode/utf8"
)

// Cut returns s cut to at most n bytes. When byte n of s is inside a
// character, the cut moves back to that character's start. n <= 0 gives "".
func Cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	if n <= 0 {
		return ""
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// Clip is Cut followed by "..." when s was longer than n bytes (the marker
// is not counted in n).
func Clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return Cut(s, n) + "..."
}

// Quote returns s as a Go string literal (control bytes and invalid UTF-8
// escaped). When s is longer than n bytes, the literal holds its first
// bytes (Cut) and is followed by "... (N bytes)" with s's length.
func Quote(s string, n int) string {
	if len(s) <= n {
		return strconv.Quote(s)
	}
	return strconv.Quote(Cut(s, n)) + "... (" + strconv.Itoa(len(s)) + " bytes)"
}

// Escape returns s with control bytes and invalid UTF-8 escaped as in a Go
// string literal, without the quotes, cut by Clip to n bytes: text from
// elsewhere made safe to put inside a message.
func Escape(s string, n int) string {
	q := strconv.Quote(s)
	return Clip(q[1:len(q)-1], n)
}
