package adminui

import (
	"fmt"
	"html/template"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// funcs are the templates' functions. None of them returns markup: every
// value reaches the page through html/template's escaping (link returns a
// template.URL built from the handler's own path and escaped values).
var funcs = template.FuncMap{
	"ago":    ago,
	"time":   func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05Z") },
	"num":    num,
	"link":   link,
	"points": points,
	"maxOf":  maxOf,
	"bytes":  sizeOf,
	"seconds": func(d time.Duration) string {
		return d.Round(time.Second).String()
	},
}

// link is base+page with the query parameters kv (name, value, ...), the
// empty ones left out.
func link(base, page string, kv ...any) template.URL {
	v := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		val := fmt.Sprint(kv[i+1])
		if val != "" && val != "0" {
			v.Set(fmt.Sprint(kv[i]), val)
		}
	}
	u := base + page
	if len(v) > 0 {
		u += "?" + v.Encode()
	}
	if !strings.HasPrefix(u, "/") {
		u = "/"
	}
	return template.URL(u) //nolint:gosec // a path of ours and escaped values
}

// num writes n with thousands separators.
func num(n any) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func maxOf(a, b []int64) int64 {
	m := int64(1)
	for _, s := range [][]int64{a, b} {
		for _, v := range s {
			m = max(m, v)
		}
	}
	return m
}

// Chart geometry, shared with app.js.
const (
	chartW = 600
	chartH = 120
)

// points is an SVG polyline's points for series scaled to top.
func points(series []int64, top int64) string {
	var b strings.Builder
	for i, v := range series {
		x := float64(i) * chartW / float64(max(len(series)-1, 1))
		y := chartH - float64(v)*(chartH-4)/float64(max(top, 1))
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(strconv.FormatFloat(x, 'f', 1, 64) + "," + strconv.FormatFloat(y, 'f', 1, 64))
	}
	return b.String()
}

func sizeOf(p *int64) string {
	if p == nil {
		return "unknown"
	}
	n := float64(*p)
	for _, u := range []string{"B", "kB", "MB", "GB"} {
		if n < 1024 || u == "GB" {
			return strconv.FormatFloat(n, 'f', 1, 64) + " " + u
		}
		n /= 1024
	}
	return ""
}
