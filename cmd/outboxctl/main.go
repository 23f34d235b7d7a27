// Command outboxctl operates an fxoutbox table: it shows how the relays are
// doing, lists, shows, requeues and deletes parked events, replays
// published events, checks, shows and drops what the streaming relay uses
// (its replication slot and publication), and counts, lists, shows and
// deletes an inbox's parked records; `outboxctl ui` serves the same as a
// web UI (package adminui). It is a shell over package admin, the
// API the inbox's List and Delete use too.
//
//	go run github.com/fxoutbox/outbox/cmd/outboxctl@latest status
//
// It reads DATABASE_URL and the services' OUTBOX_SCHEMA, OUTBOX_TABLE and
// OUTBOX_LANES (as fxoutbox.ConfigFromEnv does; with --prefix AUDIT_,
// AUDIT_OUTBOX_SCHEMA and so on, as fxoutbox.ConfigFromEnvPrefix does;
// status --all covers every outbox and inbox table it finds; the inbox commands
// OUTBOX_INBOX_SCHEMA and OUTBOX_INBOX_TABLE, as
// fxoutbox.InboxConfigFromEnv does), prints tables for people
// and JSON with --json, asks before it changes anything unless --yes, and
// exits with 0 (done), 1 (error), 2 (usage or configuration), 3 (nothing
// matched) or 4 (not confirmed). Run `outboxctl help` for the commands.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"

	"github.com/fxoutbox/outbox/internal/envconfig"
	"github.com/fxoutbox/outbox/internal/textcut"
	"github.com/fxoutbox/outbox/outboxconfig"
)

// Exit codes.
const (
	exitOK           = 0 // done
	exitError        = 1 // the database or the operation failed
	exitUsage        = 2 // bad arguments or configuration
	exitNoMatch      = 3 // nothing matched: no such event, no parked event matches
	exitNotConfirmed = 4 // a change was not confirmed (or could not be: no terminal and no --yes)
)

// env is what a run sees of the world.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	// interactive: stdin and stderr are terminals, so a change can be
	// confirmed at a prompt.
	interactive bool
	// progress: stderr is a terminal, so long operations draw a progress
	// line (--progress forces it).
	progress bool
	getenv   func(string) string
	// config reads the services' configuration (the OUTBOX_* variables).
	config func() (outboxconfig.Config, error)
	// prefixConfig reads it with prefix in front of the names (--prefix);
	// nil reads the environment.
	prefixConfig func(prefix string) (outboxconfig.Config, error)
	// inboxConfig reads the consuming services' (OUTBOX_INBOX_*); nil reads
	// the environment.
	inboxConfig func() (outboxconfig.InboxConfig, error)
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], env{
		stdin:        os.Stdin,
		stdout:       os.Stdout,
		stderr:       os.Stderr,
		interactive:  isTerminal(os.Stdin) && isTerminal(os.Stderr),
		progress:     isTerminal(os.Stderr),
		getenv:       os.Getenv,
		config:       readConfig,
		prefixConfig: readPrefixConfig,
		inboxConfig:  readInboxConfig,
	})
	stop()
	os.Exit(code)
}

func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

const usage = `outboxctl operates an fxoutbox outbox table.

Usage:
  outboxctl status                          backlog, oldest age, rates, parked events by
                                            topic and reason, lanes held, relay sessions
  outboxctl status --all                    the same for every outbox table in the database
                                            (found by its columns), and every inbox table
                                            with its consumers and parked records
  outboxctl parked list [filters]           parked events, oldest first (--limit, --after)
  outboxctl parked show <event-id>          one parked event, with payload and headers
  outboxctl parked requeue <event-id>...    put parked events back in line
  outboxctl parked requeue [filters|--all]
  outboxctl parked delete <event-id>...     delete parked events for good
  outboxctl parked delete [filters|--all]
  outboxctl replay [filters|--all]          publish already published events again
  outboxctl stream status                   the streaming relay's slot (lag, WAL kept),
                                            publication and server settings
  outboxctl stream check                    check the server's setup for the streaming
                                            relay, as it does at start; exit 1 if wrong
  outboxctl stream drop-slot [--force]      drop the table's replication slot (frees
                                            its WAL); --force ends the relay streaming
  outboxctl inbox status                    an inbox's parked records by consumer, topic
                                            and error type
  outboxctl inbox parked list               parked inbox records, oldest first
                                            (--consumer, --limit, --after)
  outboxctl inbox parked show <id>          one parked record, with value and headers
  outboxctl inbox parked delete <id>...     drop parked records without applying them
                                            (retrying runs the handler: it is the consuming
                                            service's Consumer.Retry)
  outboxctl cursor rebase                   carry a cursor table (OUTBOX_PROGRESS=cursor) over to the
                                            cluster it was restored or moved into, when the relay
                                            says its positions come from another cluster
  outboxctl ui [--addr 127.0.0.1:8089]      the admin web UI: overview, parked events by
               [--allow-write]              cause, event detail, inbox; read only unless
                                            --allow-write; token OUTBOX_UI_TOKEN, else
                                            printed at start
  outboxctl version
  outboxctl help [command]

Filters (parked list/requeue/delete, replay):
  --topic T --type T --key K     exact match on topic, event type, partition key
  --since S --until U            written (created_at) at or after S, before U:
                                 2026-12-03T09:00:00Z, 2026-12-03, or an age: 90m, 2h, 3d
  --error TEXT                   last error contains TEXT (any case)
  --from-id N --to-id N          row ids (the id column), inclusive
  --limit N                      at most N events (list: default 100)

Common flags:
  --prefix P    read the variables of the outbox a service configures with
                fxoutbox.NamedFromEnv(name, P): P+OUTBOX_SCHEMA, P+OUTBOX_TABLE,
                P+OUTBOX_LANES (e.g. --prefix AUDIT_: AUDIT_OUTBOX_TABLE); before or
                after the command
  --json        machine-readable output on stdout
  --yes         do not ask before requeue, delete, replay or drop-slot
  --progress    draw the progress line even when stderr is not a terminal
  --chunk N     rows per statement for requeue, delete and replay (default 1000)

Environment:
  DATABASE_URL   the database of the outbox table, e.g.
                 postgres://orders_relay:secret@db:5432/orders?sslmode=verify-full
  OUTBOX_SCHEMA, OUTBOX_TABLE, OUTBOX_LANES
                 as configured for the services (default: outbox_event in the
                 search_path, 64 lanes); with --prefix P, P+OUTBOX_SCHEMA, ...
  OUTBOX_INBOX_SCHEMA, OUTBOX_INBOX_TABLE
                 the inbox commands' table, as configured for the consuming
                 services (default: outbox_inbox in the search_path)
  OUTBOX_UI_TOKEN
                 ui: the token (at least 16 bytes); unset, one is generated
  Connect as the relay's role: it may read the table, set published_at,
  parked_at and attempts, and delete parked rows (migrations/roles.example.sql).
  stream check and drop-slot need the streaming relay's role (REPLICATION).
  The inbox commands need the consumer's role (migrations/inbox/roles.example.sql).

Exit codes:
  0  done
  1  error (database unreachable, permission denied, table missing, ...)
  2  usage or configuration error
  3  nothing matched (no such parked event, no event matches the filters)
  4  not confirmed: answered no, or no terminal to ask on and no --yes
`

func run(ctx context.Context, args []string, e env) int {
	args = hoistPrefix(args)
	if names, ok := prefixNames(args); ok {
		// The hints name the variables the operator sets: AUDIT_OUTBOX_TABLE.
		e.stderr = renaming{w: e.stderr, names: names}
	}
	if len(args) == 0 {
		fmt.Fprint(e.stderr, usage)
		return exitUsage
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		if len(args) > 1 {
			return run(ctx, append(args[1:], "--help"), e)
		}
		fmt.Fprint(e.stdout, usage)
		return exitOK
	case "version", "--version":
		v := "(devel)"
		if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
			v = bi.Main.Version
		}
		fmt.Fprintln(e.stdout, "outboxctl", v)
		return exitOK
	case "status":
		return cmdStatus(ctx, args[1:], e)
	case "replay":
		return cmdBulk(ctx, "replay", args[1:], e, replayOp)
	case "stream":
		return cmdStream(ctx, args[1:], e)
	case "cursor":
		return cmdCursor(ctx, args[1:], e)
	case "inbox":
		return cmdInbox(ctx, args[1:], e)
	case "ui":
		return cmdUI(ctx, args[1:], e)
	case "parked":
		if len(args) < 2 {
			fmt.Fprintln(e.stderr, "outboxctl parked: name a command: list, show, requeue or delete (outboxctl help)")
			return exitUsage
		}
		switch args[1] {
		case "list":
			return cmdList(ctx, args[2:], e)
		case "show":
			return cmdShow(ctx, args[2:], e)
		case "requeue":
			return cmdBulk(ctx, "parked requeue", args[2:], e, requeueOp)
		case "delete":
			return cmdBulk(ctx, "parked delete", args[2:], e, deleteOp)
		case "-h", "--help", "help":
			fmt.Fprint(e.stdout, usage)
			return exitOK
		}
		fmt.Fprintf(e.stderr, "outboxctl parked: unknown command %s: use list, show, requeue or delete\n", textcut.Quote(args[1], 40))
		return exitUsage
	}
	fmt.Fprintf(e.stderr, "outboxctl: unknown command %s (outboxctl help lists them)\n", textcut.Quote(args[0], 40))
	return exitUsage
}

// readConfig reads the services' settings as fxoutbox.ConfigFromEnv does
// (the same code, in a package that does not link fx).
func readConfig() (outboxconfig.Config, error) { return readPrefixConfig("") }

// readPrefixConfig reads them as fxoutbox.ConfigFromEnvPrefix(prefix) does.
func readPrefixConfig(prefix string) (outboxconfig.Config, error) {
	return outboxconfig.FromEnvPrefix(prefix)
}

// readInboxConfig reads the inbox settings as fxoutbox.InboxConfigFromEnv
// does.
func readInboxConfig() (outboxconfig.InboxConfig, error) {
	return outboxconfig.InboxFromEnv()
}

// hoistPrefix moves a --prefix given before the command (outboxctl
// --prefix AUDIT_ status) behind it, where the command's flags are parsed.
func hoistPrefix(args []string) []string {
	if len(args) == 0 {
		return args
	}
	n := 0
	switch a := strings.TrimLeft(args[0], "-"); {
	case !strings.HasPrefix(args[0], "-"):
		return args
	case a == "prefix" && len(args) > 1:
		n = 2
	case strings.HasPrefix(a, "prefix="):
		n = 1
	default:
		return args
	}
	rest := slices.Clone(args[n:])
	if i := slices.Index(rest, "--"); i >= 0 {
		return slices.Concat(rest[:i], args[:n], rest[i:])
	}
	return append(rest, args[:n]...)
}

// prefixNames returns how the variables of the --prefix among args are
// named, if it is a valid one.
func prefixNames(args []string) (envconfig.Names, bool) {
	for i, a := range args {
		var p string
		switch {
		case a == "--":
			return envconfig.Names{}, false
		case (a == "--prefix" || a == "-prefix") && i+1 < len(args):
			p = args[i+1]
		case strings.HasPrefix(a, "--prefix="), strings.HasPrefix(a, "-prefix="):
			_, p, _ = strings.Cut(a, "=")
		default:
			continue
		}
		n, err := envconfig.NewNames(p, os.Environ())
		return n, err == nil && p != ""
	}
	return envconfig.Names{}, false
}

// renaming writes through w with the variables renamed by names.
type renaming struct {
	w     io.Writer
	names envconfig.Names
}

func (r renaming) Write(p []byte) (int, error) {
	if _, err := io.WriteString(r.w, r.names.Text(string(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}
