package limitstest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/record"
	"github.com/fxoutbox/outbox/internal/testenv"
)

// tricky holds payloads at the edges of jsonb's input rules and of its
// output format.
var tricky = []string{
	// literals, white space
	`null`, `true`, `false`, ` 1 `, "\t\n\r 1\r\n", `tru`, `truex`, `nul`, `NULL`, `True`,
	"\u00a01", "\f1", "\v1", `1 2`, `[1] x`,
	// numbers
	`0`, `-0`, `-0.0`, `0.000`, `-0e5`, `-0.0e-3`, `1.0e2`, `1E+2`, `1e-2`, `100e-2`, `1.50`, `-1.50`, `1e0`, `1e-0`, `1E+0`,
	`123456789012345678901234567890.123456789012345678901234567890`, `1e+0000000000000000000000005`, `0e01`,
	`1e131071`, `1e131072`, `-1e131071`, `10e131070`, `10e131071`, `9.999e131071`, `9.999e131068`, `0.00001e131076`, `0.00001e131077`,
	`1e-16383`, `1e-16384`, `-1e-16383`, `0.1e-16382`, `0.1e-16383`, `0e-16383`, `0e-16384`, `0.0e-16383`, `1.5e-16382`, `1.5e-16383`,
	`0e1073741822`, `0e1073741823`, `1e1073741822`, `1e-1073741822`, `1e-1073741823`, `1e99999999999999999999`, `0e-99999999999999999999`,
	`01`, `-01`, `1.`, `.5`, `+1`, `1e`, `1e+`, `-`, `--1`, `1.e5`, `0x10`, `Infinity`, `NaN`, `1_000`,
	// strings and escapes
	`""`, `"a"`, `"\/"`, `"/"`, `"\""`, `"\\"`, `"\b\f\n\r\t"`, `"\a"`, `"\x41"`, `"\'"`, `"\u"`, `"\u12"`, `"\u12g4"`,
	`"\u0000"`, `"a\u0000b"`, `"\u0001"`, `"\u001f"`, `"\u0020"`, `"\u007f"`, `"\u0080"`, `"\u00e9"`, `"\u00E9"`, `"\u07ff"`,
	`"\u0800"`, `"\u2028"`, `"\ufffe"`, `"\uffff"`, `"\u0008\u000c\u000a\u000d\u0009"`, `"\u0022\u005c\u002f"`,
	`"\ud800"`, `"\udbff"`, `"\udc00"`, `"\udfff"`, `"\ud800\ud800"`, `"\ud800\udc00"`, `"\udbff\udfff"`, `"\ud83d\ude00"`,
	`"\uD83D\uDE00"`, `"\ude00\ud83d"`, `"\ud800x"`, `"\ud800\n"`, `"\ud800\u0041"`, `"x\ud800"`, `"\ud800\\udc00"`,
	"\"\x7f\"", "\"é😀\u2028\"", "\"\xff\"", "\"\xc3\"", "\"\xc3(\"", "\"\xed\xa0\x80\"", "\"\xc0\xaf\"", "\"\xf4\x90\x80\x80\"",
	"\"\xef\xbb\xbf\"", "\xef\xbb\xbf1", "\"a\x01\"", "\"a\x1f\"", "\"a\tb\"", "\"a\nb\"", "\"unterminated", "\xff", "\x00",
	// objects and arrays
	`{}`, `[]`, `{ }`, `[ ]`, `{"a":1}`, `{"a" : 1 , "b" : [ 1 , 2 ]}`, `{"b":1,"a":2,"b":3}`, `{"a":{"a":1,"a":{}},"a":[]}`,
	`{"\u0061":1,"a":2}`, `{"é":1,"\u00e9":2}`, `{"":1,"":2}`, `{"aa":1,"b":2,"a":3}`, `{"a":1,}`, `[1,]`, `[,1]`, `{"a"}`, `{"a":}`,
	`{1:2}`, `{'a':1}`, `[1,[2,[3,[4,{"x":[5]}]]]]`, `{"a":[{"b":{"c":null}}]}`, `[[[[[[[[]]]]]]]]`, `{"a":1}{}`, `[`, `{`, `]`, `}`,
	`{"\ud83d\ude00":"\ud83d\ude00","😀":0}`, `{"a\u0000":1}`, `{"k":"\u0000"}`,
}

// deep returns an array and an object nested depth levels deep.
func deep(depth int) []string {
	return []string{
		strings.Repeat("[", depth) + strings.Repeat("]", depth),
		strings.Repeat(`{"a":`, depth) + "1" + strings.Repeat("}", depth),
	}
}

// manyKeys returns an object with n members over n/dup distinct keys, some
// written with escapes, to exercise duplicate detection in large objects.
func manyKeys(n, dup int) string {
	var b strings.Builder
	b.WriteByte('{')
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		k := fmt.Sprintf("key%d", i%(n/dup))
		if i%3 == 0 { // the same key, escaped
			k = `\u006b` + k[1:]
		}
		fmt.Fprintf(&b, `"%s":%d`, k, i)
	}
	b.WriteByte('}')
	return b.String()
}

// TestPayloadRulesMatchPostgres feeds every payload of the corpus to
// record.Prepare and to PostgreSQL (`SELECT $1::jsonb`, the payload sent as
// the unit of work sends it). Prepare must accept exactly what PostgreSQL
// accepts, and for accepted payloads Record.PayloadBytes must equal
// octet_length($1::jsonb::text), the bytes the relay reads back and sends.
// The one allowed difference: nesting deeper than 10000 levels, which
// Prepare refuses whatever the server's max_stack_depth.
func TestPayloadRulesMatchPostgres(t *testing.T) {
	pool := testenv.Pool(t)
	ctx := context.Background()
	var enc string
	if err := pool.QueryRow(ctx, "SHOW server_encoding").Scan(&enc); err != nil || enc != "UTF8" {
		t.Fatalf("server_encoding = %q, %v: the rules hold for UTF8 databases", enc, err)
	}
	corpus := append([]string(nil), tricky...)
	corpus = append(corpus, deep(1000)...)
	corpus = append(corpus, deep(10000)...)
	corpus = append(corpus, deep(10001)...)
	corpus = append(corpus, manyKeys(300, 3), manyKeys(2000, 7), manyKeys(64, 64))
	rng := rand.New(rand.NewPCG(20261203, 11))
	for range 10000 {
		corpus = append(corpus, randomJSON(rng))
	}
	// Valid JSON from Go values too: json.Marshal escapes a NUL in a Go
	// string as \u0000, which jsonb refuses.
	for _, v := range []any{"a\x00b", map[string]string{"k\x00": "v"}, 1e308, -5e-324, json.Number("1e131071"), []float64{0.1, 1e21}} {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		corpus = append(corpus, string(b))
	}

	var accepted, refused, deeper int
	for i, payload := range corpus {
		r, perr := record.Prepare(outbox.Event{AggregateType: "a", AggregateID: "1", Type: "a.b", Topic: "t", Payload: json.RawMessage(payload)},
			"", nil, outbox.Limits{}, nil)
		stored := []byte(payload)
		if payload == "" {
			stored = []byte("null") // an empty raw payload is stored as null
		}
		var size int
		dberr := pool.QueryRow(ctx, "SELECT octet_length($1::jsonb::text)", stored).Scan(&size)
		var pgErr *pgconn.PgError
		if dberr != nil && !errors.As(dberr, &pgErr) {
			t.Fatalf("payload %d (%s): not a server error: %v", i, show(payload), dberr)
		}
		switch {
		case perr == nil && dberr == nil:
			accepted++
			if r.PayloadBytes != size {
				t.Errorf("payload %d (%s): Prepare computes %d bytes, PostgreSQL prints %d", i, show(payload), r.PayloadBytes, size)
			}
		case perr != nil && dberr != nil:
			refused++
			if !errors.Is(perr, outbox.ErrInvalidEvent) {
				t.Errorf("payload %d: %v does not match ErrInvalidEvent", i, perr)
			}
		case perr != nil && strings.Contains(perr.Error(), "nesting deeper than"):
			deeper++ // documented: PostgreSQL's limit depends on max_stack_depth
		case perr != nil:
			t.Errorf("payload %d (%s): Prepare refuses (%v), PostgreSQL accepts", i, show(payload), perr)
		default:
			t.Errorf("payload %d (%s): Prepare accepts, PostgreSQL refuses: %v", i, show(payload), dberr)
		}
	}
	t.Logf("%d payloads: %d accepted by both, %d refused by both, %d refused only for nesting", len(corpus), accepted, refused, deeper)
	if accepted < 5000 || refused < 2000 || deeper != 2 {
		t.Errorf("corpus too one-sided: %d accepted, %d refused, %d deeper", accepted, refused, deeper)
	}
}

func show(s string) string {
	if len(s) > 120 {
		return fmt.Sprintf("%q... (%d bytes)", s[:120], len(s))
	}
	return fmt.Sprintf("%q", s)
}

// randomJSON generates a payload from a grammar that mostly follows JSON and
// jsonb's rules and sometimes breaks one of them.
func randomJSON(rng *rand.Rand) string {
	var b strings.Builder
	g := gen{rng: rng, b: &b}
	g.ws()
	g.value(0)
	g.ws()
	s := b.String()
	if rng.IntN(12) == 0 && len(s) > 1 { // a broken document
		i := rng.IntN(len(s))
		switch rng.IntN(3) {
		case 0:
			s = s[:i] + s[i+1:]
		case 1:
			const junk = "{}[],:\"\\e-0 \x00\xff"
			j := rng.IntN(len(junk))
			s = s[:i] + junk[j:j+1] + s[i:]
		default:
			s = s[:i]
		}
	}
	return s
}

type gen struct {
	rng *rand.Rand
	b   *strings.Builder
}

func (g gen) pick(options ...string) string { return options[g.rng.IntN(len(options))] }

func (g gen) ws() {
	if g.rng.IntN(4) == 0 {
		g.b.WriteString(g.pick(" ", "\t", "\n", "\r\n", "  "))
	}
}

func (g gen) value(depth int) {
	k := g.rng.IntN(10)
	if depth > 4 {
		k = g.rng.IntN(6)
	}
	switch {
	case k < 2:
		g.b.WriteString(g.pick("true", "false", "null"))
	case k < 4:
		g.number()
	case k < 6:
		g.str(false)
	case k < 8:
		g.b.WriteByte('[')
		for i := range g.rng.IntN(5) {
			if i > 0 {
				g.b.WriteByte(',')
			}
			g.ws()
			g.value(depth + 1)
			g.ws()
		}
		g.b.WriteByte(']')
	default:
		g.b.WriteByte('{')
		for i := range g.rng.IntN(6) {
			if i > 0 {
				g.b.WriteByte(',')
			}
			g.ws()
			if g.rng.IntN(2) == 0 { // few distinct keys: duplicates
				g.b.WriteString(g.pick(`"a"`, `"b"`, `"ab"`, `"\u0061"`, `"é"`, `"\u00e9"`, `""`, `"\ud83d\ude00"`, `"😀"`, `"a\nb"`, `"a\u000ab"`))
			} else {
				g.str(true)
			}
			g.ws()
			g.b.WriteByte(':')
			g.ws()
			g.value(depth + 1)
		}
		g.b.WriteByte('}')
	}
}

func (g gen) digits(n int, first bool) {
	for i := range n {
		d := g.rng.IntN(10)
		if i == 0 && first && d == 0 {
			d = 1
		}
		if g.rng.IntN(4) == 0 {
			d = 0 // trailing and inner zeros
		}
		if i == 0 && first && d == 0 {
			d = 9
		}
		g.b.WriteByte(byte('0' + d))
	}
}

func (g gen) number() {
	if g.rng.IntN(3) == 0 {
		g.b.WriteByte('-')
	}
	intDigits := 1
	if g.rng.IntN(3) == 0 {
		g.b.WriteByte('0')
	} else {
		intDigits = 1 + g.rng.IntN(25)
		g.digits(intDigits, true)
	}
	fracDigits := 0
	if g.rng.IntN(2) == 0 {
		g.b.WriteByte('.')
		fracDigits = 1 + g.rng.IntN(25)
		g.digits(fracDigits, false)
	}
	if g.rng.IntN(2) == 0 {
		return
	}
	g.b.WriteString(g.pick("e", "E", "e+", "E-", "e-", "e+00"))
	// Exponents that put the leading digit or the scale at, just below or
	// just above numeric's limits, or anywhere small.
	var exp int
	switch g.rng.IntN(4) {
	case 0:
		exp = 131072 - intDigits + g.rng.IntN(5) - 2
	case 1:
		exp = 16383 - fracDigits + g.rng.IntN(5) - 2
	case 2:
		exp = 1073741823 + g.rng.IntN(3) - 2
	default:
		exp = g.rng.IntN(40)
	}
	fmt.Fprint(g.b, max(exp, 0))
}

func (g gen) str(key bool) {
	g.b.WriteByte('"')
	for range g.rng.IntN(6) {
		var piece string
		switch g.rng.IntN(12) {
		case 0, 1, 2:
			piece = g.pick("a", "key", "Hello world", "x/y", "'", "<>&")
		case 3:
			piece = g.pick(`\"`, `\\`, `\/`, `\b`, `\f`, `\n`, `\r`, `\t`)
		case 4, 5:
			piece = `\u` + g.pick("0001", "001f", "0020", "007f", "0080", "00e9", "07ff", "0800", "2028", "fffe", "ffff", "0041", "005C", "0022", "000a", "0008")
		case 6:
			piece = g.pick(`\ud83d\ude00`, `\uD800\uDC00`, `\udbff\udfff`)
		case 7:
			piece = g.pick("é", "😀", "\u2028", "\x7f", "日本")
		case 8: // what jsonb refuses
			if g.rng.IntN(3) == 0 {
				piece = g.pick(`\u0000`, `\ud800`, `\udc00`, `\ud800\ud800`, `\ud800x`, `\ude00\ud83d`, "\xff", "\xc3", "\xed\xa0\x80", "\xc0\xaf", "\x01", `\x`, `\u12`)
			}
		default:
			piece = fmt.Sprint(g.rng.IntN(1000))
		}
		g.b.WriteString(piece)
	}
	g.b.WriteByte('"')
}
