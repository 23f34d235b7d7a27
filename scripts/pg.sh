#!/usr/bin/env bash
# pg.sh - a throwaway PostgreSQL cluster for tests, the demo and benchmarks.
#
# Usage: scripts/pg.sh up|down|url|restart|destroy|status
#
#   up       Start (or reuse) a local cluster and print DATABASE_URL=... on
#            stdout (only that line; progress goes to stderr), so that
#              eval "$(scripts/pg.sh up)"   or   export $(scripts/pg.sh up)
#            works. If DATABASE_URL is already set, only check that it
#            answers and print it; nothing is started.
#   down     Stop the cluster that `up` started (pg_ctl stop -m fast).
#   url      Print the DATABASE_URL=... line (the environment's, else the
#            local cluster's if it is running).
#   restart  pg_ctl restart -m fast of the local cluster (used by tests to
#            simulate a database restart); waits until it accepts connections.
#   destroy  down, then remove the cluster directory.
#   status   Say on stderr whether the local cluster runs; exit 0 if it does.
#
# Environment:
#   DATABASE_URL       use this server instead of starting one (up/url)
#   OUTBOX_PG_DIR      cluster directory (default: <repo>/.cache/pg). It holds
#                      data/ (PGDATA), sock/ (unix socket), postgres.log, env.
#   OUTBOX_PG_PORT     TCP port on 127.0.0.1 (default: 55432)
#   OUTBOX_PG_BINDIR   directory with initdb/pg_ctl/postgres (default: found
#                      via pg_config --bindir, then /usr/lib/postgresql/*/bin,
#                      then PATH)
#   OUTBOX_PG_WAL_LEVEL  wal_level of a cluster `up` starts: logical (the
#                      default; the streaming relay needs it) or replica
#                      (bench/ starts a second cluster with it, on its own
#                      OUTBOX_PG_DIR and OUTBOX_PG_PORT, to price logical)
#
# initdb and postgres refuse to run as root: as root, they run as the
# unprivileged "postgres" user. fsync stays on so that benchmarks are honest.
set -euo pipefail

readonly PROG="${0##*/}"
REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
readonly REPO_DIR
readonly PG_PORT="${OUTBOX_PG_PORT:-55432}"
readonly PG_WAL_LEVEL="${OUTBOX_PG_WAL_LEVEL:-logical}"
readonly PG_USER_OS="postgres"
readonly DB_NAME="outbox"
readonly READY_TIMEOUT=30
readonly MARKER=".fxoutbox-pg"

log() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() {
	local code="$1"
	shift
	printf '%s: error: %s\n' "$PROG" "$*" >&2
	exit "$code"
}

usage() {
	sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
}

is_root() { [[ "$(id -u)" -eq 0 ]]; }

# run_as_pg CMD ARGS...: run a server-side command as the user that owns the
# cluster (postgres when we are root, otherwise ourselves). It runs from / so
# that an unreadable current directory does not bother it.
# File descriptor 9 (our lock) is closed for it, so that a postmaster started
# here does not inherit and hold the lock forever.
run_as_pg() {
	if ! is_root; then
		(cd / && "$@") 9>&-
	elif command -v runuser >/dev/null 2>&1; then
		(cd / && runuser -u "$PG_USER_OS" -- "$@") 9>&-
	else
		local cmd
		cmd="$(printf '%q ' "$@")"
		(cd / && su "$PG_USER_OS" -s /bin/bash -c "$cmd") 9>&-
	fi
}

ensure_pg_user() {
	is_root || return 0
	if ! id -u "$PG_USER_OS" >/dev/null 2>&1; then
		log "creating system user '$PG_USER_OS' (initdb and postgres refuse to run as root)"
		useradd --system --user-group --no-create-home --home-dir /nonexistent \
			--shell /usr/sbin/nologin "$PG_USER_OS" ||
			die 1 "could not create user '$PG_USER_OS'; create it or run this script as a non-root user"
	fi
}

not_found() {
	die 2 "PostgreSQL server binaries not found: install them (Debian/Ubuntu: apt-get install postgresql) or set DATABASE_URL to an existing server"
}

# find_bindir prints the directory holding initdb, pg_ctl and postgres.
find_bindir() {
	local d
	if [[ -n "${OUTBOX_PG_BINDIR:-}" ]]; then
		if [[ -x "$OUTBOX_PG_BINDIR/initdb" && -x "$OUTBOX_PG_BINDIR/pg_ctl" ]]; then
			printf '%s\n' "$OUTBOX_PG_BINDIR"
			return 0
		fi
		return 1
	fi
	if command -v pg_config >/dev/null 2>&1; then
		d="$(pg_config --bindir 2>/dev/null || true)"
		if [[ -n "$d" && -x "$d/initdb" && -x "$d/pg_ctl" ]]; then
			printf '%s\n' "$d"
			return 0
		fi
	fi
	local newest=""
	while IFS= read -r d; do
		[[ -x "$d/initdb" && -x "$d/pg_ctl" ]] && newest="$d"
	done < <(compgen -G '/usr/lib/postgresql/*/bin' | sort -V || true)
	if [[ -n "$newest" ]]; then
		printf '%s\n' "$newest"
		return 0
	fi
	if d="$(command -v initdb 2>/dev/null)"; then
		d="$(dirname "$d")"
		if [[ -x "$d/pg_ctl" ]]; then
			printf '%s\n' "$d"
			return 0
		fi
	fi
	return 1
}

# Client tools: prefer the server's bindir, fall back to PATH.
client_tool() {
	local name="$1"
	if [[ -n "${BINDIR:-}" && -x "$BINDIR/$name" ]]; then
		printf '%s\n' "$BINDIR/$name"
	elif command -v "$name" >/dev/null 2>&1; then
		command -v "$name"
	else
		return 1
	fi
}

primary_dir() {
	local d="${OUTBOX_PG_DIR:-$REPO_DIR/.cache/pg}"
	# Make it absolute without requiring it to exist.
	[[ "$d" = /* ]] || d="$PWD/$d"
	printf '%s\n' "${d%/}"
}

fallback_dir() {
	local h
	h="$(primary_dir | sha256sum | cut -c1-8)"
	printf '/tmp/fxoutbox-pg-%s\n' "$h"
}

# usable_dir DIR: can the server user reach DIR (all parents traversable)
# and is the unix socket path short enough?
usable_dir() {
	local d="$1" parent
	# sun_path is 108 bytes on Linux, including the terminating NUL.
	local sock="$d/sock/.s.PGSQL.$PG_PORT"
	if ((${#sock} > 100)); then
		log "socket path $sock is too long for a unix socket"
		return 1
	fi
	is_root || return 0
	parent="$(dirname "$d")"
	mkdir -p "$parent" 2>/dev/null || return 1
	run_as_pg test -x "$parent" 2>/dev/null
}

# choose_dir_for_up sets PGROOT for `up`.
choose_dir_for_up() {
	local p
	p="$(primary_dir)"
	if usable_dir "$p"; then
		PGROOT="$p"
		return 0
	fi
	PGROOT="$(fallback_dir)"
	log "user '$PG_USER_OS' cannot reach $p (a parent directory is not traversable) or its socket path is too long; using $PGROOT instead"
}

# choose_dir_existing sets PGROOT for the other commands, by the same rule as
# `up`, but a directory that already holds a cluster wins.
choose_dir_existing() {
	local p f
	p="$(primary_dir)"
	f="$(fallback_dir)"
	if [[ -f "$p/data/PG_VERSION" ]]; then
		PGROOT="$p"
	elif [[ -f "$f/data/PG_VERSION" ]]; then
		PGROOT="$f"
	elif usable_dir "$p" 2>/dev/null; then
		PGROOT="$p"
	else
		PGROOT="$f"
	fi
}

set_paths() {
	PGDATA_DIR="$PGROOT/data"
	SOCK_DIR="$PGROOT/sock"
	LOG_FILE="$PGROOT/postgres.log"
	ENV_FILE="$PGROOT/env"
}

lock() {
	command -v flock >/dev/null 2>&1 || return 0
	mkdir -p "$PGROOT"
	exec 9>>"$PGROOT/.lock"
	flock -w 120 9 || die 1 "timed out waiting for the lock on $PGROOT/.lock"
}

postmaster_pid() {
	local p=""
	if [[ -r "$PGDATA_DIR/postmaster.pid" ]]; then
		p="$(sed -n 1p "$PGDATA_DIR/postmaster.pid" 2>/dev/null || true)"
	fi
	[[ "$p" =~ ^[0-9]+$ ]] && printf '%s\n' "$p"
}

# pid_is_zombie PID: has PID exited without being reaped yet? A killed
# postmaster's parent is init, which may reap it late; until then kill -0
# (and so pg_ctl status, and postgres' own lock file check) calls it alive.
pid_is_zombie() {
	local st
	st="$(sed -e 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1 || true)"
	[[ "$st" == "Z" || "$st" == "X" ]]
}

# running: is a postmaster alive for PGDATA_DIR? (pg_ctl status ignores a
# stale postmaster.pid whose process is gone; we also ignore a zombie.)
running() {
	[[ -f "$PGDATA_DIR/PG_VERSION" ]] || return 1
	local pid i
	for ((i = 0; i < 40; i++)); do
		run_as_pg "$BINDIR/pg_ctl" status -D "$PGDATA_DIR" >/dev/null 2>&1 || return 1
		pid="$(postmaster_pid)" || return 0
		pid_is_zombie "$pid" || return 0
		# A zombie: wait a little for init to reap it, then ask again.
		sleep 0.25
	done
	return 1
}

# clear_stale_pidfile removes postmaster.pid when its process is dead or a
# zombie (postgres itself would refuse to start over a zombie's pid file).
# Only call it when running() said no.
clear_stale_pidfile() {
	local pid
	pid="$(postmaster_pid)" || return 0
	if ! kill -0 "$pid" 2>/dev/null || pid_is_zombie "$pid"; then
		log "removing stale postmaster.pid (pid $pid is gone)"
		rm -f "$PGDATA_DIR/postmaster.pid"
	fi
}

# port_busy PORT: does something accept TCP connections on 127.0.0.1:PORT?
port_busy() {
	(exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# check_ours PORT: the server answering on PORT must be the one in PGDATA_DIR
# (not, say, another cluster that already had the port).
check_ours() {
	local port="$1" psql dd want
	psql="$(client_tool psql)" || return 0
	want="$(cd "$PGDATA_DIR" 2>/dev/null && pwd -P || printf '%s' "$PGDATA_DIR")"
	dd="$("$psql" -X -q -A -t -h 127.0.0.1 -p "$port" -U postgres -d postgres -c 'show data_directory' 2>/dev/null || true)"
	if [[ -n "$dd" && "$dd" != "$want" && "$dd" != "$PGDATA_DIR" ]]; then
		die 1 "the server on 127.0.0.1:$port is not ours (its data directory is $dd, ours is $PGDATA_DIR); set OUTBOX_PG_PORT to a free port"
	fi
}

start_server() {
	clear_stale_pidfile
	# -W: do not wait here; wait_ready polls pg_isready with our own bound.
	if ! run_as_pg "$BINDIR/pg_ctl" start -W -D "$PGDATA_DIR" -l "$LOG_FILE" >/dev/null 2>&1; then
		log_tail
		die 1 "pg_ctl start failed for $PGDATA_DIR"
	fi
}

# running_port prints the port of the running postmaster (line 4 of
# postmaster.pid), falling back to PG_PORT.
running_port() {
	local p=""
	if [[ -r "$PGDATA_DIR/postmaster.pid" ]]; then
		p="$(sed -n 4p "$PGDATA_DIR/postmaster.pid" 2>/dev/null || true)"
	fi
	[[ "$p" =~ ^[0-9]+$ ]] || p="$PG_PORT"
	printf '%s\n' "$p"
}

url_for_port() {
	printf 'postgres://postgres@127.0.0.1:%s/%s?sslmode=disable\n' "$1" "$DB_NAME"
}

log_tail() {
	if [[ -r "$LOG_FILE" ]]; then
		printf -- '--- last lines of %s ---\n' "$LOG_FILE" >&2
		tail -n 30 "$LOG_FILE" >&2 || true
		printf -- '---\n' >&2
	fi
}

# wait_ready PORT [RESTART]: wait until the server answers. With RESTART=1,
# a postmaster that exits while starting (e.g. "pre-existing shared memory
# block is still in use" right after a crash) is started again.
wait_ready() {
	local port="$1" restart="${2:-0}" isready deadline ticks=0
	isready="$(client_tool pg_isready)" || die 1 "pg_isready not found"
	deadline=$((SECONDS + READY_TIMEOUT))
	while ((SECONDS < deadline)); do
		if "$isready" -q -h 127.0.0.1 -p "$port" -U postgres -d postgres -t 1 >/dev/null 2>&1; then
			return 0
		fi
		ticks=$((ticks + 1))
		# Give a fresh postmaster 2 s to write its pid file before judging.
		if [[ "$restart" == 1 ]] && ((ticks >= 8)) && ! running; then
			log "the postmaster exited while starting; starting it again"
			start_server
			ticks=0
		fi
		sleep 0.25
	done
	log_tail
	die 1 "PostgreSQL in $PGDATA_DIR did not accept connections on 127.0.0.1:$port within ${READY_TIMEOUT}s (see the log above)"
}

write_settings() {
	local conf="$PGDATA_DIR/fxoutbox.conf"
	local tmp
	tmp="$(mktemp)"
	cat >"$tmp" <<EOF
# Written by scripts/pg.sh on every start; edits are overwritten.
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$SOCK_DIR'
max_connections = 200
shared_buffers = 256MB
# Benchmarks must be honest: keep durability on.
fsync = on
synchronous_commit = on
full_page_writes = on
logging_collector = off
log_line_prefix = '%m [%p] '
# The streaming relay (relay.Stream) reads a logical replication slot.
# wal_level = logical adds the decoding details to the WAL of UPDATE and
# DELETE only; bench/ measures what it costs the writers and the polling
# relay (wal.level_cost_*). A slot left behind by a test is invalidated
# after 1GB of WAL instead of filling the disk.
wal_level = $PG_WAL_LEVEL
max_wal_senders = 64
max_replication_slots = 64
max_slot_wal_keep_size = 1GB
EOF
	install -m 0644 "$tmp" "$conf"
	rm -f "$tmp"
	if is_root; then
		chown "$PG_USER_OS:" "$conf"
	fi
	if ! grep -q "^include_if_exists = 'fxoutbox.conf'" "$PGDATA_DIR/postgresql.conf"; then
		printf "\n# Added by scripts/pg.sh\ninclude_if_exists = 'fxoutbox.conf'\n" >>"$PGDATA_DIR/postgresql.conf"
	fi
}

init_cluster() {
	log "initialising a new cluster in $PGDATA_DIR"
	if is_root; then
		chown "$PG_USER_OS:" "$PGROOT"
		chmod 0755 "$PGROOT"
	fi
	if ! run_as_pg "$BINDIR/initdb" -D "$PGDATA_DIR" --auth=trust -U postgres \
		--encoding=UTF8 --no-locale >"$PGROOT/initdb.log" 2>&1; then
		cat "$PGROOT/initdb.log" >&2 || true
		die 1 "initdb failed"
	fi
}

ensure_db() {
	local port="$1" psql exists
	psql="$(client_tool psql)" || die 1 "psql not found; cannot create database $DB_NAME"
	exists="$("$psql" -X -q -A -t -h 127.0.0.1 -p "$port" -U postgres -d postgres \
		-c "select 1 from pg_database where datname = '$DB_NAME'")" ||
		die 1 "could not query databases on 127.0.0.1:$port"
	if [[ "$exists" != "1" ]]; then
		log "creating database $DB_NAME"
		"$psql" -X -q -h 127.0.0.1 -p "$port" -U postgres -d postgres \
			-c "create database $DB_NAME" >/dev/null ||
			die 1 "could not create database $DB_NAME"
	fi
}

write_env() {
	local line="$1" tmp
	tmp="$(mktemp)"
	printf '%s\n' "$line" >"$tmp"
	install -m 0644 "$tmp" "$ENV_FILE"
	rm -f "$tmp"
}

check_external_url() {
	local psql isready
	if psql="$(client_tool psql)"; then
		"$psql" -X -q -A -t "$DATABASE_URL" -c 'select 1' >/dev/null ||
			die 1 "DATABASE_URL is set but the server does not answer: $DATABASE_URL"
	elif isready="$(client_tool pg_isready)"; then
		"$isready" -q -d "$DATABASE_URL" -t 5 ||
			die 1 "DATABASE_URL is set but the server does not answer: $DATABASE_URL"
	else
		log "neither psql nor pg_isready found; not checking DATABASE_URL"
	fi
}

cmd_up() {
	if [[ -n "${DATABASE_URL:-}" ]]; then
		BINDIR="$(find_bindir || true)"
		check_external_url
		log "using the existing server from DATABASE_URL; nothing started"
		printf 'DATABASE_URL=%s\n' "$DATABASE_URL"
		return 0
	fi
	case "$PG_WAL_LEVEL" in
	logical | replica) ;;
	*) die 64 "OUTBOX_PG_WAL_LEVEL=$PG_WAL_LEVEL: use logical or replica" ;;
	esac
	BINDIR="$(find_bindir)" || not_found
	ensure_pg_user
	choose_dir_for_up
	set_paths
	lock
	touch "$PGROOT/$MARKER"

	local port started=0
	if running; then
		port="$(running_port)"
		log "reusing the running cluster in $PGDATA_DIR (port $port)"
	else
		if [[ ! -f "$PGDATA_DIR/PG_VERSION" ]]; then
			init_cluster
		fi
		mkdir -p "$SOCK_DIR"
		if is_root; then
			chown "$PG_USER_OS:" "$PGROOT" "$SOCK_DIR"
			touch "$LOG_FILE"
			chown "$PG_USER_OS:" "$LOG_FILE"
		fi
		write_settings
		port="$PG_PORT"
		if port_busy "$port"; then
			die 1 "127.0.0.1:$port is already in use by another process; set OUTBOX_PG_PORT to a free port"
		fi
		log "starting PostgreSQL ($BINDIR) on 127.0.0.1:$port, data in $PGDATA_DIR, log in $LOG_FILE"
		start_server
		started=1
	fi
	wait_ready "$port" "$started"
	check_ours "$port"
	ensure_db "$port"
	local line
	line="DATABASE_URL=$(url_for_port "$port")"
	write_env "$line"
	log "ready: $line (also in $ENV_FILE)"
	printf '%s\n' "$line"
}

local_setup() {
	BINDIR="$(find_bindir)" || not_found
	choose_dir_existing
	set_paths
}

cmd_down() {
	local_setup
	if ! running; then
		log "no cluster started by $PROG is running in $PGROOT; nothing to stop"
		return 0
	fi
	lock
	log "stopping PostgreSQL in $PGDATA_DIR"
	if ! run_as_pg "$BINDIR/pg_ctl" stop -m fast -w -t 60 -D "$PGDATA_DIR" >/dev/null 2>&1; then
		log_tail
		die 1 "pg_ctl stop failed for $PGDATA_DIR"
	fi
	log "stopped"
}

cmd_url() {
	if [[ -n "${DATABASE_URL:-}" ]]; then
		printf 'DATABASE_URL=%s\n' "$DATABASE_URL"
		return 0
	fi
	local_setup
	if ! running; then
		log "no cluster started by $PROG is running in $PGROOT (run: $PROG up)"
		return 1
	fi
	printf 'DATABASE_URL=%s\n' "$(url_for_port "$(running_port)")"
}

cmd_restart() {
	local_setup
	if ! running; then
		die 1 "no cluster started by $PROG is running in $PGROOT; cannot restart (run: $PROG up)"
	fi
	lock
	local port
	port="$(running_port)"
	log "restarting PostgreSQL in $PGDATA_DIR (fast)"
	# -W: pg_ctl still waits for the old server to stop, but not for the new
	# one to come up; wait_ready does that with our own bound.
	if ! run_as_pg "$BINDIR/pg_ctl" restart -m fast -W -D "$PGDATA_DIR" -l "$LOG_FILE" >/dev/null 2>&1; then
		log_tail
		die 1 "pg_ctl restart failed for $PGDATA_DIR"
	fi
	wait_ready "$port"
	log "restarted; accepting connections on 127.0.0.1:$port"
}

cmd_status() {
	local_setup
	if running; then
		log "running in $PGDATA_DIR on 127.0.0.1:$(running_port)"
		return 0
	fi
	log "not running ($PGROOT)"
	return 3
}

cmd_destroy() {
	local_setup
	cmd_down
	if [[ ! -e "$PGROOT" ]]; then
		log "nothing to remove at $PGROOT"
		return 0
	fi
	if [[ ! -e "$PGROOT/$MARKER" && ! -f "$PGDATA_DIR/PG_VERSION" ]]; then
		die 1 "$PGROOT does not look like a cluster made by $PROG; not removing it"
	fi
	log "removing $PGROOT"
	rm -rf -- "$PGROOT"
}

main() {
	local cmd="${1:-}"
	case "$cmd" in
	up) cmd_up ;;
	down | stop) cmd_down ;;
	url) cmd_url ;;
	restart) cmd_restart ;;
	destroy) cmd_destroy ;;
	status) cmd_status ;;
	-h | --help | help)
		usage
		;;
	*)
		usage
		exit 64
		;;
	esac
}

main "$@"
