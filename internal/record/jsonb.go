package record

import (
	"bytes"
	"fmt"
	"slices"
	"sync"
	"unicode/utf8"
)

// The payload column is jsonb. PostgreSQL refuses some JSON that
// encoding/json takes, and prints what it stores differently from what it was
// given: that printed text is what the relay reads back and sends as the
// Kafka record value. jsonbSize checks a payload the way PostgreSQL 15's jsonb
// input does and computes the length of jsonb's text output, in one pass and
// without building the document.
//
// jsonb input (src/common/jsonapi.c, src/backend/utils/adt/jsonb.c and
// numeric.c, in a UTF8 database):
//   - RFC 8259 JSON; white space is space, tab, CR and LF;
//   - the text must be valid UTF-8 (the server checks every text it receives);
//   - a \u escape may not be \u0000; a high surrogate escape must be followed
//     by a low surrogate escape, and a low surrogate may not stand alone;
//   - a number becomes a numeric: its exponent must lie strictly between
//     -(INT_MAX/2) and INT_MAX/2, it may have at most 16383 digits after the
//     decimal point (its display scale: fraction digits minus exponent) and at
//     most 131072 before it (a weight below 32768 in base-10000 digits).
//
// jsonb output (jsonb_out):
//   - object keys sorted (which does not change the length), duplicate keys
//     collapsed to the last one, ": " after keys and ", " between members and
//     elements, no other white space;
//   - strings re-escaped: \" \\ \b \f \n \r \t as two bytes, other bytes
//     below 0x20 as \u00XX, everything else (including '/', DEL and non-ASCII)
//     raw;
//   - numbers as numeric_out prints them: an optional '-' (never for zero),
//     the integer digits without leading zeros ("0" when there are none), and
//     when the scale is positive a '.' and exactly scale fraction digits; no
//     exponent.
//
// One difference is deliberate: nesting deeper than maxJSONDepth (10000, the
// limit encoding/json also applies) is refused. PostgreSQL's own limit
// depends on its max_stack_depth; at the default 2MB it is higher.

const (
	maxJSONDepth      = 10000
	maxNumericScale   = 16383      // NUMERIC_DSCALE_MAX
	maxIntegerDigits  = 4 * 32768  // NUMERIC_WEIGHT_MAX is 32767 base-10000 digits
	maxNumericExpAbs  = 1073741823 // INT_MAX/2: numeric_in refuses |exponent| >= this
	jsonbKeyValueSep  = 2          // ": "
	jsonbElementSep   = 2          // ", "
	smallObjectLinear = 8          // up to this many keys, find duplicates pairwise
)

// jsonbError says why PostgreSQL would refuse a payload, where, and what to
// do about it.
type jsonbError struct {
	off         int
	reason, fix string
}

func (e *jsonbError) Error() string {
	fix := e.fix
	if fix == "" {
		fix = "pass a value to marshal, or valid JSON"
	}
	return fmt.Sprintf("is not accepted by PostgreSQL's jsonb: %s at byte offset %d: %s", e.reason, e.off, fix)
}

const (
	fixNumber    = "send numbers beyond PostgreSQL's numeric range as strings"
	fixSurrogate = "escape a character outside the Basic Multilingual Plane as a surrogate pair, or send it as UTF-8"
)

// jsonbKey is one member key of an object being scanned.
type jsonbKey struct {
	start, end int    // the raw key between its quotes
	hash       uint64 // FNV-1a of the decoded key
	escaped    bool   // raw key holds escapes: compare decoded
	member     int    // output bytes of key, ": " and value
}

// keyPool holds the key lists of finished scans.
var keyPool = sync.Pool{New: func() any { k := make([]jsonbKey, 0, 32); return &k }}

type jsonbScanner struct {
	data  []byte
	pos   int
	depth int
	keys  []jsonbKey // keys of the objects being scanned, innermost last
}

// jsonbSize reports whether PostgreSQL's jsonb accepts data and, if it does,
// the length of jsonb's text output for it.
func jsonbSize(data []byte) (int, error) {
	keys := keyPool.Get().(*[]jsonbKey)
	s := jsonbScanner{data: data, keys: (*keys)[:0]}
	s.space()
	n, err := s.value()
	if cap(s.keys) <= 1<<12 { // a huge object's keys are not kept
		*keys = s.keys[:0]
		keyPool.Put(keys)
	}
	if err != nil {
		return 0, err
	}
	s.space()
	if s.pos < len(s.data) {
		return 0, s.fail("unexpected data after the JSON value")
	}
	return n, nil
}

func (s *jsonbScanner) fail(reason string) error { return &jsonbError{off: s.pos, reason: reason} }

func (s *jsonbScanner) failFix(reason, fix string) error {
	return &jsonbError{off: s.pos, reason: reason, fix: fix}
}

func (s *jsonbScanner) space() {
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

func (s *jsonbScanner) value() (int, error) {
	if s.pos >= len(s.data) {
		return 0, s.fail("unexpected end of input")
	}
	switch c := s.data[s.pos]; {
	case c == '{':
		return s.object()
	case c == '[':
		return s.array()
	case c == '"':
		n, _, _, err := s.str(false)
		return n, err
	case c == '-' || c >= '0' && c <= '9':
		return s.number()
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	}
	return 0, s.fail("unexpected character")
}

func (s *jsonbScanner) literal(word string) (int, error) {
	if len(s.data)-s.pos < len(word) || string(s.data[s.pos:s.pos+len(word)]) != word {
		return 0, s.fail("invalid literal")
	}
	s.pos += len(word)
	return len(word), nil
}

func (s *jsonbScanner) enter() error {
	s.depth++
	if s.depth > maxJSONDepth {
		return s.failFix(fmt.Sprintf("nesting deeper than %d levels", maxJSONDepth), "flatten the document")
	}
	return nil
}

func (s *jsonbScanner) array() (int, error) {
	if err := s.enter(); err != nil {
		return 0, err
	}
	s.pos++ // [
	s.space()
	n := 2 // []
	if s.pos < len(s.data) && s.data[s.pos] == ']' {
		s.pos++
		s.depth--
		return n, nil
	}
	for elems := 0; ; elems++ {
		if elems > 0 {
			n += jsonbElementSep
		}
		v, err := s.value()
		if err != nil {
			return 0, err
		}
		n += v
		s.space()
		if s.pos >= len(s.data) {
			return 0, s.fail("unexpected end of input in an array")
		}
		switch s.data[s.pos] {
		case ',':
			s.pos++
			s.space()
		case ']':
			s.pos++
			s.depth--
			return n, nil
		default:
			return 0, s.fail(`expected "," or "]" in an array`)
		}
	}
}

func (s *jsonbScanner) object() (int, error) {
	if err := s.enter(); err != nil {
		return 0, err
	}
	s.pos++ // {
	s.space()
	if s.pos < len(s.data) && s.data[s.pos] == '}' {
		s.pos++
		s.depth--
		return 2, nil
	}
	first := len(s.keys)
	for {
		if s.pos >= len(s.data) || s.data[s.pos] != '"' {
			return 0, s.fail("expected a string as object key")
		}
		start := s.pos + 1
		kn, h, esc, err := s.str(true)
		if err != nil {
			return 0, err
		}
		end := s.pos - 1
		s.space()
		if s.pos >= len(s.data) || s.data[s.pos] != ':' {
			return 0, s.fail(`expected ":" after an object key`)
		}
		s.pos++
		s.space()
		// Appended before the value is scanned: the value's own objects
		// push their keys after this one and truncate back to it.
		s.keys = append(s.keys, jsonbKey{start: start, end: end, hash: h, escaped: esc})
		k := len(s.keys) - 1
		v, err := s.value()
		if err != nil {
			return 0, err
		}
		s.keys[k].member = kn + jsonbKeyValueSep + v
		s.space()
		if s.pos >= len(s.data) {
			return 0, s.fail("unexpected end of input in an object")
		}
		switch s.data[s.pos] {
		case ',':
			s.pos++
			s.space()
			continue
		case '}':
			s.pos++
		default:
			return 0, s.fail(`expected "," or "}" in an object`)
		}
		break
	}
	n := s.members(s.keys[first:])
	s.keys = s.keys[:first]
	s.depth--
	return n, nil
}

// members returns the output length of an object with these members, of
// which jsonb keeps only the last of each key. It may reorder keys.
func (s *jsonbScanner) members(keys []jsonbKey) int {
	n, kept := 0, 0
	if len(keys) <= smallObjectLinear {
		for i := range keys {
			if !s.hasLater(keys[i:]) {
				n += keys[i].member
				kept++
			}
		}
	} else {
		// Sort by hash, stable so that equal keys stay in input order,
		// and keep the last of each run of equal keys.
		slices.SortStableFunc(keys, func(a, b jsonbKey) int {
			switch {
			case a.hash < b.hash:
				return -1
			case a.hash > b.hash:
				return 1
			}
			return 0
		})
		for i := 0; i < len(keys); {
			j := i + 1
			for j < len(keys) && keys[j].hash == keys[i].hash {
				j++
			}
			// keys[i:j] share a hash: almost always one key, or equal keys.
			for a := i; a < j; a++ {
				if !s.hasLater(keys[a:j]) {
					n += keys[a].member
					kept++
				}
			}
			i = j
		}
	}
	if kept > 1 {
		n += (kept - 1) * jsonbElementSep
	}
	return 2 + n // {}
}

// hasLater reports whether a key after keys[0] equals it.
func (s *jsonbScanner) hasLater(keys []jsonbKey) bool {
	k := &keys[0]
	for j := 1; j < len(keys); j++ {
		if keys[j].hash == k.hash && s.sameKey(k, &keys[j]) {
			return true
		}
	}
	return false
}

func (s *jsonbScanner) sameKey(a, b *jsonbKey) bool {
	ra, rb := s.data[a.start:a.end], s.data[b.start:b.end]
	if !a.escaped && !b.escaped {
		return bytes.Equal(ra, rb)
	}
	return bytes.Equal(decodeJSONString(ra), decodeJSONString(rb))
}

// plainASCII marks the bytes a string holds and jsonb prints as they are:
// printable ASCII other than '"' and '\\'.
var plainASCII = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// str scans a string at s.pos (the opening quote) and returns the length of
// jsonb's output for it, quotes included; with hash set, also the FNV-1a hash
// of the decoded string and whether it held escapes.
func (s *jsonbScanner) str(hash bool) (n int, h uint64, escaped bool, err error) {
	s.pos++ // "
	n, h = 2, fnvOffset
	d := s.data
	for s.pos < len(d) {
		c := d[s.pos]
		if plainASCII[c] {
			if hash {
				h = (h ^ uint64(c)) * fnvPrime
			} else {
				// Skip the run of plain bytes at once.
				i := s.pos + 1
				for i < len(d) && plainASCII[d[i]] {
					i++
				}
				n += i - s.pos
				s.pos = i
				continue
			}
			n++
			s.pos++
			continue
		}
		switch {
		case c == '"':
			s.pos++
			return n, h, escaped, nil
		case c == '\\':
			escaped = true
			r, err := s.escape()
			if err != nil {
				return 0, 0, false, err
			}
			n += jsonbRuneOut(r)
			if hash {
				var buf [utf8.UTFMax]byte
				for _, b := range buf[:utf8.EncodeRune(buf[:], r)] {
					h = (h ^ uint64(b)) * fnvPrime
				}
			}
		case c < 0x20:
			return 0, 0, false, s.fail("unescaped control character in a string")
		default:
			r, size := utf8.DecodeRune(d[s.pos:])
			if r == utf8.RuneError && size == 1 {
				return 0, 0, false, s.failFix("invalid UTF-8", "send text as UTF-8")
			}
			n += size
			if hash {
				for _, b := range d[s.pos : s.pos+size] {
					h = (h ^ uint64(b)) * fnvPrime
				}
			}
			s.pos += size
		}
	}
	return 0, 0, false, s.fail("unterminated string")
}

// jsonbRuneOut is the length of r in a string printed by jsonb_out.
func jsonbRuneOut(r rune) int {
	switch {
	case r == '"' || r == '\\' || r == '\b' || r == '\f' || r == '\n' || r == '\r' || r == '\t':
		return 2
	case r < 0x20:
		return 6 // \u00XX
	}
	return utf8.RuneLen(r)
}

// escape scans the escape at s.pos (the backslash) and returns the rune it
// stands for; a surrogate pair of \u escapes is one rune.
func (s *jsonbScanner) escape() (rune, error) {
	d := s.data
	if s.pos+1 >= len(d) {
		return 0, s.fail("unterminated string")
	}
	c := d[s.pos+1]
	s.pos += 2
	switch c {
	case '"', '\\', '/':
		return rune(c), nil
	case 'b':
		return '\b', nil
	case 'f':
		return '\f', nil
	case 'n':
		return '\n', nil
	case 'r':
		return '\r', nil
	case 't':
		return '\t', nil
	case 'u':
	default:
		s.pos -= 2
		return 0, s.fail("invalid escape in a string")
	}
	r, ok := hex4(d, s.pos)
	if !ok {
		s.pos -= 2
		return 0, s.fail(`"\u" must be followed by four hexadecimal digits`)
	}
	s.pos += 4
	switch {
	case r == 0:
		s.pos -= 6
		return 0, s.failFix(`\u0000`, "PostgreSQL text cannot hold NUL: drop the character")
	case r >= 0xdc00 && r <= 0xdfff:
		s.pos -= 6
		return 0, s.failFix("a Unicode low surrogate escape without a high surrogate before it", fixSurrogate)
	case r >= 0xd800 && r <= 0xdbff:
		lo, ok := rune(0), false
		if s.pos+1 < len(d) && d[s.pos] == '\\' && d[s.pos+1] == 'u' {
			lo, ok = hex4(d, s.pos+2)
		}
		if !ok || lo < 0xdc00 || lo > 0xdfff {
			s.pos -= 6
			return 0, s.failFix("a Unicode high surrogate escape not followed by a low surrogate escape", fixSurrogate)
		}
		s.pos += 6
		return 0x10000 + (r-0xd800)<<10 + (lo - 0xdc00), nil
	}
	return r, nil
}

func hex4(d []byte, i int) (rune, bool) {
	if i+4 > len(d) {
		return 0, false
	}
	var r rune
	for _, c := range d[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// decodeJSONString decodes the raw contents of a string the scanner has
// accepted.
func decodeJSONString(raw []byte) []byte {
	out := make([]byte, 0, len(raw))
	s := jsonbScanner{data: raw}
	for s.pos < len(raw) {
		if raw[s.pos] != '\\' {
			out = append(out, raw[s.pos])
			s.pos++
			continue
		}
		r, _ := s.escape() // accepted before: cannot fail
		out = utf8.AppendRune(out, r)
	}
	return out
}

// number scans a number and returns the length numeric_out prints for it.
func (s *jsonbScanner) number() (int, error) {
	d := s.data
	start := s.pos
	neg := d[s.pos] == '-'
	if neg {
		s.pos++
	}
	// Integer part: "0" or a digit 1-9 followed by digits.
	intStart := s.pos
	if s.pos >= len(d) || d[s.pos] < '0' || d[s.pos] > '9' {
		return 0, s.fail("invalid number")
	}
	if d[s.pos] == '0' {
		s.pos++
	} else {
		for s.pos < len(d) && d[s.pos] >= '0' && d[s.pos] <= '9' {
			s.pos++
		}
	}
	intDigits := s.pos - intStart
	// firstNZ is the index of the first non-zero digit among the integer
	// and fraction digits taken together, or -1.
	firstNZ := -1
	if d[intStart] != '0' {
		firstNZ = 0
	}
	fracDigits := 0
	if s.pos < len(d) && d[s.pos] == '.' {
		s.pos++
		fracStart := s.pos
		for s.pos < len(d) && d[s.pos] >= '0' && d[s.pos] <= '9' {
			if firstNZ < 0 && d[s.pos] != '0' {
				firstNZ = intDigits + s.pos - fracStart
			}
			s.pos++
		}
		fracDigits = s.pos - fracStart
		if fracDigits == 0 {
			return 0, s.fail("invalid number: no digits after the decimal point")
		}
	}
	exp := 0
	if s.pos < len(d) && (d[s.pos] == 'e' || d[s.pos] == 'E') {
		s.pos++
		expNeg := false
		if s.pos < len(d) && (d[s.pos] == '+' || d[s.pos] == '-') {
			expNeg = d[s.pos] == '-'
			s.pos++
		}
		expStart := s.pos
		for s.pos < len(d) && d[s.pos] >= '0' && d[s.pos] <= '9' {
			if exp <= maxNumericExpAbs {
				exp = exp*10 + int(d[s.pos]-'0')
			}
			s.pos++
		}
		if s.pos == expStart {
			return 0, s.fail("invalid number: no digits in the exponent")
		}
		if exp >= maxNumericExpAbs {
			return 0, &jsonbError{off: start, reason: "a number whose exponent is out of PostgreSQL's numeric range", fix: fixNumber}
		}
		if expNeg {
			exp = -exp
		}
	}
	scale := max(fracDigits-exp, 0)
	if scale > maxNumericScale {
		return 0, &jsonbError{off: start, reason: fmt.Sprintf("a number with %d digits after the decimal point, over PostgreSQL's numeric limit of %d", scale, maxNumericScale), fix: fixNumber}
	}
	n := 1 // the integer part of zero, or of a value below one: "0"
	if firstNZ >= 0 {
		// The leading digit's power of ten is lead; numeric_out prints
		// lead+1 integer digits when it is not negative.
		lead := intDigits + exp - firstNZ - 1
		if lead >= maxIntegerDigits {
			return 0, &jsonbError{off: start, reason: fmt.Sprintf("a number with %d digits before the decimal point, over PostgreSQL's numeric limit of %d", lead+1, maxIntegerDigits), fix: fixNumber}
		}
		if lead >= 0 {
			n = lead + 1
		}
		if neg {
			n++
		}
	}
	if scale > 0 {
		n += 1 + scale
	}
	return n, nil
}
