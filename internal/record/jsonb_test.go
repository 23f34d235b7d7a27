package record

import (
	"bytes"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// jsonbSeeds are inputs whose jsonb verdict and output PostgreSQL 15 was
// asked for (internal/limitstest repeats them against the server): each
// maps to the length of `$1::jsonb::text`, or -1 where jsonb refuses it.
var jsonbSeeds = map[string]int{
	`null`: 4, `true`: 4, `false`: 5, ` 1 `: 1, `"a"`: 3, `"\/"`: 3, `"/"`: 3,
	`-0`: 1, `-0.0`: 3, `0.000`: 5, `1.0e2`: 3, `1E+2`: 3, `1e-2`: 4, `100e-2`: 4, `-1.50`: 5,
	`1e131071`: 131072, `1e131072`: -1, `10e131070`: 131072, `0.00001e131076`: 131072, `0.00001e131077`: -1,
	`1e-16383`: 16385, `1e-16384`: -1, `0.0e-16383`: -1, `0e-16383`: 16385, `0e1073741822`: 1, `0e1073741823`: -1,
	`1e-1073741823`: -1, `1e+0000000000000000000000005`: 6,
	`{"b":1,"a":2,"b":3}`: 16, `{"a":{"a":1,"a":{}},"a":[]}`: 9, `{"\u0061":1,"a":2}`: 8, `{}`: 2, `[]`: 2,
	`[1,[2,[3]]]`: 13, `{ "k" : [ 1 , 2 ] }`: 13,
	`"\u0000"`: -1, `"a\u0000b"`: -1, `"\ud800"`: -1, `"\udc00"`: -1, `"\ud800\ud800"`: -1, `"\ud800x"`: -1,
	`"\ud800\u0041"`: -1, `"\ud83d\ude00"`: 6, `"\uD83D\uDE00"`: 6, `"\u00e9"`: 4, `"\uffff"`: 5,
	`"\u001f"`: 8, `"\u0008\u000c\u000a\u000d\u0009"`: 12, `"\"\\"`: 6, "\"\x7f\"": 3, `"é"`: 4,
	"\"\xff\"": -1, "\"\xed\xa0\x80\"": -1, "\"\xc3\"": -1, "\xff": -1, "\"a\x01\"": -1,
	`{"a":1,}`: -1, `[1,]`: -1, `01`: -1, `1.`: -1, `.5`: -1, `+1`: -1, `1e`: -1, `truex`: -1, `nul`: -1,
	`"\x"`: -1, `"\u12"`: -1, ``: -1, ` `: -1, `1 2`: -1, "\u00a0 1": -1,
}

func TestJSONBSizeSeeds(t *testing.T) {
	for in, want := range jsonbSeeds {
		got, err := jsonbSize([]byte(in))
		if want < 0 {
			if err == nil {
				t.Errorf("jsonbSize(%q) = %d, want PostgreSQL's refusal", in, got)
			}
			continue
		}
		if err != nil || got != want {
			t.Errorf("jsonbSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
}

func TestJSONBSizeDepth(t *testing.T) {
	for _, depth := range []int{1, maxJSONDepth} {
		in := strings.Repeat("[", depth) + strings.Repeat("]", depth)
		if n, err := jsonbSize([]byte(in)); err != nil || n != len(in) {
			t.Errorf("depth %d: %d, %v", depth, n, err)
		}
	}
	in := strings.Repeat(`{"a":`, maxJSONDepth+1) + "1" + strings.Repeat("}", maxJSONDepth+1)
	if _, err := jsonbSize([]byte(in)); err == nil || !strings.Contains(err.Error(), "nesting") {
		t.Errorf("depth %d: err = %v, want a refusal naming the nesting", maxJSONDepth+1, err)
	}
}

// A large object takes the sorting path to find duplicate keys.
func TestJSONBSizeLargeObjectDuplicates(t *testing.T) {
	var b strings.Builder
	b.WriteByte('{')
	for i := range 500 {
		if i > 0 {
			b.WriteByte(',')
		}
		// keys k0..k99, each five times; the last value of each is "xx".
		v := `"x"`
		if i >= 400 {
			v = `"xx"`
		}
		b.WriteString(`"k` + strconv.Itoa(i%100) + `":` + v)
	}
	b.WriteByte('}')
	got, err := jsonbSize([]byte(b.String()))
	want := len(refJSONB(t, []byte(b.String())))
	if err != nil || got != want {
		t.Errorf("500 members, 100 keys: %d, %v; want %d", got, err, want)
	}
}

// FuzzJSONBSize checks the one-pass scanner against encoding/json and a
// plain rendering of jsonb's output: whatever it accepts is valid JSON, it
// accepts no invalid JSON, and its size is the length of the text jsonb
// prints (keys deduplicated, numbers in full, jsonb's escapes and
// separators). Whether PostgreSQL accepts the same inputs is proved against
// the server in internal/limitstest.
//
//	go test -run '^$' -fuzz FuzzJSONBSize .
func FuzzJSONBSize(f *testing.F) {
	for in := range jsonbSeeds {
		f.Add([]byte(in))
	}
	f.Add([]byte(`{"order":{"id":"o-1","lines":[{"sku":"A","qty":2,"price":9.99}],"note":"\u00e9\n"},"total":19.98e0}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		n, err := jsonbSize(data)
		if err != nil {
			return
		}
		if !json.Valid(data) {
			t.Fatalf("jsonbSize accepts %q, which is not valid JSON", data)
		}
		if want := len(refJSONB(t, data)); n != want {
			t.Fatalf("jsonbSize(%q) = %d, jsonb prints %d bytes", data, n, want)
		}
	})
}

// refJSONB renders data as jsonb_out prints it, by decoding it with
// encoding/json (which keeps the last of duplicate keys) and printing the
// result the way PostgreSQL does: keys sorted by length, then bytes; ": " and
// ", "; numbers written out in full with their scale.
func refJSONB(t testing.TB, data []byte) string {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("decode %q: %v", data, err)
	}
	var b strings.Builder
	var render func(v any)
	render = func(v any) {
		switch v := v.(type) {
		case nil:
			b.WriteString("null")
		case bool:
			if v {
				b.WriteString("true")
			} else {
				b.WriteString("false")
			}
		case string:
			renderString(&b, v)
		case json.Number:
			b.WriteString(numericOut(string(v)))
		case []any:
			b.WriteByte('[')
			for i, e := range v {
				if i > 0 {
					b.WriteString(", ")
				}
				render(e)
			}
			b.WriteByte(']')
		case map[string]any:
			keys := make([]string, 0, len(v))
			for k := range v {
				keys = append(keys, k)
			}
			slices.SortFunc(keys, func(a, b string) int {
				if len(a) != len(b) {
					return len(a) - len(b)
				}
				return strings.Compare(a, b)
			})
			b.WriteByte('{')
			for i, k := range keys {
				if i > 0 {
					b.WriteString(", ")
				}
				renderString(&b, k)
				b.WriteString(": ")
				render(v[k])
			}
			b.WriteByte('}')
		}
	}
	render(v)
	return b.String()
}

func renderString(b *strings.Builder, s string) {
	if !utf8.ValidString(s) {
		panic("renderString: invalid UTF-8 reached the reference")
	}
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		default:
			if c < ' ' {
				const hex = "0123456789abcdef"
				b.WriteString(`\u00`)
				b.WriteByte(hex[c>>4])
				b.WriteByte(hex[c&15])
			} else {
				b.WriteByte(c)
			}
		}
	}
	b.WriteByte('"')
}

// numericOut writes a JSON number as numeric_out prints it: no exponent,
// scale = fraction digits - exponent (at least 0), no sign for zero.
func numericOut(num string) string {
	neg := strings.HasPrefix(num, "-")
	num = strings.TrimPrefix(num, "-")
	mant, expText, _ := strings.Cut(strings.ToLower(num), "e")
	exp := 0
	if expText != "" {
		sign := 1
		switch expText[0] {
		case '-':
			sign, expText = -1, expText[1:]
		case '+':
			expText = expText[1:]
		}
		for _, c := range expText {
			exp = exp*10 + int(c-'0')
		}
		exp *= sign
	}
	intPart, frac, _ := strings.Cut(mant, ".")
	digits := intPart + frac
	point := len(intPart) + exp // the decimal point is before digits[point]
	scale := max(len(frac)-exp, 0)
	var ip, fp string
	zero := strings.Trim(digits, "0") == ""
	switch {
	case zero: // the exponent may be huge: write no integer digits
		ip = "0"
		fp = ""
	case point <= 0:
		ip = "0"
		fp = strings.Repeat("0", -point) + digits
	case point >= len(digits):
		ip = digits + strings.Repeat("0", point-len(digits))
	default:
		ip, fp = digits[:point], digits[point:]
	}
	ip = strings.TrimLeft(ip, "0")
	if ip == "" {
		ip = "0"
	}
	if len(fp) < scale {
		fp += strings.Repeat("0", scale-len(fp))
	}
	fp = fp[:scale]
	out := ip
	if scale > 0 {
		out += "." + fp
	}
	if neg && !zero {
		out = "-" + out
	}
	return out
}

// BenchmarkJSONBSize compares the scan with encoding/json's validity check
// (what Prepare ran on raw payloads before) on a 1 KB order payload.
//
//	go test -run '^$' -bench JSONBSize .
func BenchmarkJSONBSize(b *testing.B) {
	payload := []byte(`{"orderId":"0191b3c2-7a4e-7cc1-9d1e-5c3b2a1f0e9d","customerId":"c-20481","currency":"EUR","total":1234.56,` +
		`"lines":[` + strings.TrimSuffix(strings.Repeat(`{"sku":"SKU-000042","name":"Item number 3 with a name","quantity":3,"price":12.99},`, 8), ",") + `],` +
		`"shipping":{"city":"Köln","country":"DE","street":"Hauptstraße 12","zip":"50667"},"note":"Please deliver after 5 pm; ring twice. \"Fragile\" items inside."}`)
	b.Run("jsonbSize", func(b *testing.B) {
		b.SetBytes(int64(len(payload)))
		for b.Loop() {
			if _, err := jsonbSize(payload); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json.Valid", func(b *testing.B) {
		b.SetBytes(int64(len(payload)))
		for b.Loop() {
			if !json.Valid(payload) {
				b.Fatal("invalid")
			}
		}
	})
}
