package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/admin"
)

// printable returns s for a table cell or a line: as is when it is valid
// UTF-8 without control characters, quoted otherwise; cut to max runes
// with "…".
func printable(s string, max int) string {
	clean := utf8.ValidString(s)
	for _, r := range s {
		if !clean || unicode.IsControl(r) {
			clean = false
			break
		}
	}
	if !clean {
		s = strconv.Quote(s)
	}
	if utf8.RuneCountInString(s) > max {
		r := []rune(s)
		s = string(r[:max-1]) + "…"
	}
	return s
}

// cutErr returns an error's text cut to a screenful.
func cutErr(err error) string { return printable(err.Error(), 500) }

// thousands formats n with thousands separators.
func thousands[T int | int64](n T) string {
	s := strconv.FormatInt(int64(n), 10)
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

// age formats a duration for people: 850ms, 42s, 3m12s, 5h07m, 2d03h.
func age(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(time.Second).String()
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%02dh", int(d.Hours())/24, int(d.Hours())%24)
}

func stamp(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05Z") }

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// explain says what went wrong and what to do. op names the privilege the
// operation needs ("UPDATE", "DELETE"); "" for reading.
func explain(err error, table outbox.Table, op string) string {
	var pg *pgconn.PgError
	var ce *pgconn.ConnectError
	switch {
	case errors.As(err, &pg) && (pg.Code == "42P01" || pg.Code == "3F000"):
		return fmt.Sprintf("the outbox table %s does not exist in this database (%s): run the migrations (migrations.Outbox.Up, or start a service with OUTBOX_MIGRATE=true), or set OUTBOX_SCHEMA and OUTBOX_TABLE to the table your services use",
			table, printable(pg.Message, 200))
	case errors.As(err, &pg) && pg.Code == "42501":
		need, rls := "SELECT", ""
		switch op {
		case "UPDATE":
			need = "SELECT and UPDATE of published_at, parked_at and attempts"
		case "DELETE":
			need, rls = "SELECT and DELETE", " (with row-level security, also a DELETE policy that admits parked rows)"
		}
		on := "on " + table.String()
		if strings.Contains(pg.Message, "for schema") {
			need, on, rls = "USAGE", "on the schema of "+table.String(), ""
		}
		return fmt.Sprintf("permission denied (%s): the role in DATABASE_URL needs %s %s%s; connect as the relay's role, which has them (migrations/roles.example.sql)",
			printable(pg.Message, 200), need, on, rls)
	case errors.As(err, &pg) && (pg.Code == "28P01" || pg.Code == "28000"):
		return fmt.Sprintf("the database refused the login (%s): check the user and password in DATABASE_URL", printable(pg.Message, 200))
	case errors.As(err, &pg) && pg.Code == "3D000":
		return fmt.Sprintf("%s: check the database name in DATABASE_URL", printable(pg.Message, 200))
	case errors.As(err, &ce):
		return fmt.Sprintf("cannot connect to the database in DATABASE_URL: %s; check its host and port, and that PostgreSQL accepts connections", cutErr(ce.Unwrap()))
	case errors.Is(err, admin.ErrNoFilter):
		return "name event ids or filters, or pass --all to act on every event"
	}
	return cutErr(err)
}

// writeRecord prints a parked record for people: its fields, aligned; its
// headers, sorted, or "Headers: (none)"; and its body (label: payload or
// value), indented as JSON when it is JSON. Stored values are cut and made
// printable.
func writeRecord(w io.Writer, fields [][2]string, headers map[string]string, label string, body []byte) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, kv := range fields {
		fmt.Fprintf(tw, "%s:\t%s\n", kv[0], kv[1])
	}
	_ = tw.Flush()
	// The section is always there, so that "no headers" is said, not left
	// to be guessed from a missing line.
	if len(headers) == 0 {
		fmt.Fprintln(w, "Headers: (none)")
	} else {
		fmt.Fprintln(w, "Headers:")
		for _, k := range slices.Sorted(maps.Keys(headers)) {
			fmt.Fprintf(w, "  %s: %s\n", printable(k, 100), printable(headers[k], 500))
		}
	}
	var pretty bytes.Buffer
	if json.Indent(&pretty, body, "  ", "  ") != nil {
		pretty.Reset()
		pretty.WriteString(printable(string(body), 1<<20))
	}
	fmt.Fprintf(w, "%s (%s bytes):\n  %s\n", label, thousands(len(body)), pretty.String())
}
