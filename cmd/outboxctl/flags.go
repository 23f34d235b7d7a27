package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/admin"
	"github.com/fxoutbox/outbox/internal/textcut"
	"github.com/fxoutbox/outbox/outboxconfig"
)

// command holds what every subcommand parses.
type command struct {
	name string
	e    env
	fs   *flag.FlagSet
	help func()
	// about is printed under the usage line by --help.
	about string

	json     bool
	prefix   string
	yes      bool
	progress bool
	chunk    int
	all      bool

	topic, typ, key, errText string
	since, until             string
	fromID, toID, after      int64
	limit                    int
}

func newCommand(name string, e env, synopsis string) *command {
	c := &command{name: name, e: e, fs: flag.NewFlagSet("outboxctl "+name, flag.ContinueOnError)}
	c.fs.SetOutput(io.Discard)
	c.fs.Usage = func() {} // errors are reported by parse, help printed by help
	c.help = func() {
		fmt.Fprintf(e.stdout, "Usage: outboxctl %s %s\n\n", name, synopsis)
		if c.about != "" {
			fmt.Fprintf(e.stdout, "%s\n\n", c.about)
		}
		fmt.Fprint(e.stdout, "Flags:\n")
		c.fs.SetOutput(e.stdout)
		c.fs.PrintDefaults()
		c.fs.SetOutput(io.Discard)
		fmt.Fprint(e.stdout, "\nExit codes: 0 done, 1 error, 2 usage, 3 nothing matched, 4 not confirmed.\n")
	}
	c.fs.BoolVar(&c.json, "json", false, "print JSON on stdout")
	c.fs.StringVar(&c.prefix, "prefix", "", "read the variables of the outbox configured with this prefix (fxoutbox.NamedFromEnv), e.g. AUDIT_ for AUDIT_OUTBOX_TABLE")
	return c
}

func (c *command) filterFlags(limitDefault string) {
	c.fs.StringVar(&c.topic, "topic", "", "only events of this topic")
	c.fs.StringVar(&c.typ, "type", "", "only events of this type, e.g. order.created.v1")
	c.fs.StringVar(&c.key, "key", "", "only events of this partition key")
	c.fs.StringVar(&c.since, "since", "", "only events written at or after: RFC 3339 time, date (2026-12-03) or age (90m, 2h, 3d)")
	c.fs.StringVar(&c.until, "until", "", "only events written before: RFC 3339 time, date or age")
	c.fs.StringVar(&c.errText, "error", "", "only events whose last error contains this text (any case)")
	c.fs.Int64Var(&c.fromID, "from-id", 0, "only rows with id >= this")
	c.fs.Int64Var(&c.toID, "to-id", 0, "only rows with id <= this")
	c.fs.IntVar(&c.limit, "limit", 0, "at most this many events ("+limitDefault+")")
}

func (c *command) bulkFlags() {
	c.fs.BoolVar(&c.yes, "yes", false, "do not ask for confirmation")
	c.fs.BoolVar(&c.all, "all", false, "act on every event (no other filter needed)")
	c.fs.BoolVar(&c.progress, "progress", false, "draw the progress line even if stderr is not a terminal")
	c.fs.IntVar(&c.chunk, "chunk", 1000, "rows per statement, each committed on its own")
}

// parseNone parses the flags of a command that takes no arguments; ok is
// false when the command must end, with code.
func (c *command) parseNone(args []string) (ok bool, code int) {
	pos, ok, code := c.parse(args)
	if ok && len(pos) > 0 {
		return false, c.usageErr("takes no arguments, got %s", textcut.Quote(pos[0], 40))
	}
	return ok, code
}

// parse parses flags anywhere among the arguments and returns the
// positional ones; when ok is false the run ends with code (help was
// printed, or a usage error).
func (c *command) parse(args []string) (pos []string, ok bool, code int) {
	for {
		if err := c.fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				c.help()
				return nil, false, exitOK
			}
			fmt.Fprintf(c.e.stderr, "outboxctl %s: %v (outboxctl %s --help)\n", c.name, cutErr(err), c.name)
			return nil, false, exitUsage
		}
		args = c.fs.Args()
		if len(args) == 0 {
			return pos, true, 0
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), true, 0
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// usageErr reports a usage error and returns its exit code.
func (c *command) usageErr(format string, a ...any) int {
	fmt.Fprintf(c.e.stderr, "outboxctl %s: %s (outboxctl %s --help)\n", c.name, fmt.Sprintf(format, a...), c.name)
	return exitUsage
}

// filter builds the admin filter from the flags and the event ids.
func (c *command) filter(ids []string, now time.Time) (f admin.Filter, code int) {
	f.Topic, f.Type, f.Key, f.Error = c.topic, c.typ, c.key, c.errText
	f.FromID, f.ToID, f.Limit, f.All = c.fromID, c.toID, c.limit, c.all
	var err error
	if f.Since, err = parseTime(c.since, now); err != nil {
		return f, c.usageErr("--since: %v", err)
	}
	if f.Until, err = parseTime(c.until, now); err != nil {
		return f, c.usageErr("--until: %v", err)
	}
	for _, s := range ids {
		id, err := uuid.Parse(s)
		if err != nil {
			return f, c.usageErr("%s is not an event id (a UUID such as 0192f1c4-5d6e-7a8b-9c0d-1e2f3a4b5c6d)", textcut.Quote(s, 60))
		}
		f.EventIDs = append(f.EventIDs, id)
	}
	if c.limit < 0 || c.fromID < 0 || c.toID < 0 {
		return f, c.usageErr("--limit, --from-id and --to-id must not be negative")
	}
	return f, 0
}

// parseTime reads an RFC 3339 time, a date (midnight UTC), or an age
// (90m, 2h, 3d: that long before now). Empty is the zero time.
func parseTime(s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return time.Time{}, nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02 15:04:05", "2006-01-02 15:04", "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	if days, ok := strings.CutSuffix(s, "d"); ok {
		if n, err := strconv.ParseFloat(days, 64); err == nil && n >= 0 {
			return now.Add(-time.Duration(n * 24 * float64(time.Hour))), nil
		}
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("%s is neither a time (2026-12-03T09:00:00Z, 2026-12-03) nor an age (90m, 2h, 3d)", textcut.Quote(s, 60))
}

// config reads the services' configuration, with --prefix when given.
func (c *command) config() (outboxconfig.Config, error) {
	if c.prefix == "" {
		return c.e.config()
	}
	read := c.e.prefixConfig
	if read == nil {
		read = readPrefixConfig
	}
	return read(c.prefix)
}

// connect reads the configuration and connects; code is non-zero on
// failure, with the reason printed.
func (c *command) connect(ctx context.Context) (conn *pgx.Conn, table outbox.Table, lanes int, code int) {
	cfg, err := c.config()
	if err != nil {
		fmt.Fprintf(c.e.stderr, "outboxctl: configuration: %v\n", err)
		return nil, table, 0, exitUsage
	}
	table, lanes = cfg.Table.WithDefaults(), cfg.Relay.Lanes
	conn, code = c.dial(ctx, "outbox", func(err error) string { return explain(err, table, "") })
	return conn, table, lanes, code
}

// dial connects to DATABASE_URL, the database of the outbox or inbox
// (what) table; code is non-zero on failure, with the reason printed.
func (c *command) dial(ctx context.Context, what string, explain func(error) string) (conn *pgx.Conn, code int) {
	url := c.e.getenv("DATABASE_URL")
	if strings.TrimSpace(url) == "" {
		fmt.Fprintf(c.e.stderr, "outboxctl: DATABASE_URL is not set: set it to the database of the %s table, e.g. postgres://user:password@host:5432/db (the services' own DATABASE_URL)\n", what)
		return nil, exitUsage
	}
	pc, err := pgx.ParseConfig(url)
	if err != nil {
		// pgx leaves the password out of its parse errors.
		fmt.Fprintf(c.e.stderr, "outboxctl: DATABASE_URL is not a valid connection string: %v\n", cutErr(err))
		return nil, exitUsage
	}
	if _, ok := pc.RuntimeParams["application_name"]; !ok {
		pc.RuntimeParams["application_name"] = "outboxctl"
	}
	if pc.ConnectTimeout == 0 {
		pc.ConnectTimeout = 15 * time.Second
	}
	conn, err = pgx.ConnectConfig(ctx, pc)
	if err != nil {
		fmt.Fprintf(c.e.stderr, "outboxctl: %s\n", explain(err))
		return nil, exitError
	}
	return conn, 0
}
