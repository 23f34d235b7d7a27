#!/usr/bin/env bash
# devkafka.sh - run the development Kafka-protocol broker (examples/cmd/devkafka)
# in the background for tests and the demo.
#
# It is an in-memory development broker (kfake), NOT Apache Kafka: one broker,
# 127.0.0.1 only, and everything is lost when it stops.
#
# Usage: scripts/devkafka.sh up|down [--all]|url|status
#
# Each port has a broker of its own: DEVKAFKA_PORT selects the broker every
# command acts on, so brokers on two ports run side by side.
#
#   up      Build examples/cmd/devkafka to <repo>/.cache/bin/devkafka, start it
#           on DEVKAFKA_PORT (or reuse the one running there, if it has the
#           asked settings), wait until its port accepts TCP, and print
#           KAFKA_BROKERS=127.0.0.1:<port> on stdout (only that line;
#           progress goes to stderr), so that
#             eval "$(scripts/devkafka.sh up)"   or   export $(scripts/devkafka.sh up)
#           works. If KAFKA_BROKERS is already set, print it and start nothing.
#   down    Stop the broker that `up` started on DEVKAFKA_PORT (only that
#           pid); with --all, every broker `up` started, whatever its port.
#   url     Print the KAFKA_BROKERS=... line (the environment's, else that of
#           the broker running on DEVKAFKA_PORT).
#   status  Say on stderr whether the broker on DEVKAFKA_PORT runs, and its
#           settings; exit 0 if it does, 3 if not.
#
# Environment:
#   KAFKA_BROKERS          use these brokers instead of starting one (up/url)
#   DEVKAFKA_PORT          port on 127.0.0.1 (default: 59092)
#   DEVKAFKA_PARTITIONS    partitions of auto-created topics (default: 12)
#   DEVKAFKA_AUTO_CREATE   on (default) or off: whether a metadata request or a
#                          produce creates a missing topic. Off, a produce to a
#                          missing topic fails with UNKNOWN_TOPIC_OR_PARTITION,
#                          as on a broker with auto.create.topics.enable=false.
#
# Files: .cache/bin/devkafka; per port, .cache/devkafka-<port>.{log,pid,lock}
# (.cache/devkafka.{log,pid,lock} for the default port, 59092).
set -euo pipefail

readonly PROG="${0##*/}"
REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
readonly REPO_DIR
readonly CACHE="$REPO_DIR/.cache"
readonly BIN="$CACHE/bin/devkafka"
readonly DEFAULT_PORT=59092
readonly PORT="${DEVKAFKA_PORT:-$DEFAULT_PORT}"
readonly PARTITIONS="${DEVKAFKA_PARTITIONS:-12}"
readonly READY_TIMEOUT=30

log() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() {
	printf '%s: error: %s\n' "$PROG" "$*" >&2
	exit 1
}

# state_file PORT EXT: the broker's state file for PORT. The default port
# keeps the names it always had, so a broker started before state was kept
# per port is still found.
state_file() {
	if [[ "$1" == "$DEFAULT_PORT" ]]; then
		printf '%s\n' "$CACHE/devkafka.$2"
	else
		printf '%s\n' "$CACHE/devkafka-$1.$2"
	fi
}

[[ "$PORT" =~ ^[0-9]+$ ]] && ((10#$PORT >= 1 && 10#$PORT <= 65535)) && [[ "$PORT" != 0* ]] ||
	die "DEVKAFKA_PORT=$PORT is not a TCP port: use a number from 1 to 65535"
LOG_FILE="$(state_file "$PORT" log)"
PID_FILE="$(state_file "$PORT" pid)"
LOCK_FILE="$(state_file "$PORT" lock)"
readonly LOG_FILE PID_FILE LOCK_FILE

# check_settings checks the settings `up` starts a broker with and sets
# AUTO_CREATE to true or false.
check_settings() {
	[[ "$PARTITIONS" =~ ^[1-9][0-9]*$ ]] ||
		die "DEVKAFKA_PARTITIONS=$PARTITIONS is not a partition count: use a number from 1 up"
	case "${DEVKAFKA_AUTO_CREATE:-on}" in
	[Oo][Nn] | [Tt][Rr][Uu][Ee] | [Yy][Ee][Ss] | 1) AUTO_CREATE=true ;;
	[Oo][Ff][Ff] | [Ff][Aa][Ll][Ss][Ee] | [Nn][Oo] | 0) AUTO_CREATE=false ;;
	*) die "DEVKAFKA_AUTO_CREATE=${DEVKAFKA_AUTO_CREATE} is not on or off: use on (the default: missing topics are created) or off (a produce to a missing topic fails)" ;;
	esac
}

# on_off true|false: on or off, as DEVKAFKA_AUTO_CREATE spells it.
on_off() { if [[ "$1" == true ]]; then echo on; else echo off; fi; }

usage() {
	sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
}

lock() {
	mkdir -p "$CACHE"
	command -v flock >/dev/null 2>&1 || return 0
	exec 9>>"$LOCK_FILE"
	flock -w 120 9 || die "timed out waiting for the lock on $LOCK_FILE"
}

log_tail() {
	if [[ -r "$LOG_FILE" ]]; then
		printf -- '--- last lines of %s ---\n' "$LOG_FILE" >&2
		tail -n 30 "$LOG_FILE" >&2 || true
		printf -- '---\n' >&2
	fi
}

port_open() {
	(exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# cmdline PID: the process's command line, arguments separated by spaces.
cmdline() {
	if [[ -r "/proc/$1/cmdline" ]]; then
		tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null || true
	else
		ps -p "$1" -o command= 2>/dev/null || true
	fi
}

# broker_pid FILE [PORT]: print the pid in pid file FILE if that process is
# alive and is positively our devkafka binary (not an unrelated process that
# reused the pid), started with -port PORT when PORT is given; anything it
# cannot verify is not ours, so we never signal it.
broker_pid() {
	local file="$1" port="${2:-}" pid cmd
	[[ -r "$file" ]] || return 1
	pid="$(head -n 1 "$file" 2>/dev/null || true)"
	[[ "$pid" =~ ^[0-9]+$ ]] && ((pid > 1)) || return 1
	kill -0 "$pid" 2>/dev/null || return 1
	# A killed-but-unreaped process (zombie) is not running.
	if [[ -r "/proc/$pid/stat" ]]; then
		[[ "$(sed -e 's/^.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1 || true)" != "Z" ]] || return 1
	fi
	cmd="$(cmdline "$pid") "
	[[ "$cmd" == "$BIN "* ]] || return 1
	[[ -z "$port" || "$cmd" == *" -port $port "* ]] || return 1
	printf '%s\n' "$pid"
}

# our_pid: the pid of the broker `up` started on PORT, if it runs.
our_pid() { broker_pid "$PID_FILE" "$PORT"; }

# broker_arg PID NAME DEFAULT: the value the broker was started with for
# -NAME (as "-NAME value" or "-NAME=value"), else DEFAULT.
broker_arg() {
	local -a args
	local i
	read -r -a args <<<"$(cmdline "$1")"
	for ((i = 0; i < ${#args[@]}; i++)); do
		case "${args[i]}" in
		"-$2="* | "--$2="*) printf '%s\n' "${args[i]#*=}" && return 0 ;;
		"-$2" | "--$2") printf '%s\n' "${args[i + 1]:-$3}" && return 0 ;;
		esac
	done
	printf '%s\n' "$3"
}

# settings PID: the broker's settings, for people.
settings() {
	printf 'auto-create %s, %s partitions per auto-created topic' \
		"$(on_off "$(broker_arg "$1" auto-create true)")" "$(broker_arg "$1" partitions 12)"
}

# adopt_legacy: an earlier version of this script kept the default port's
# pid file and log whatever the port. A broker it started on another port
# gets that port's files, so that down, status and url on its port find it
# (and up on the default port does not lose it).
adopt_legacy() {
	local file pid port
	file="$(state_file "$DEFAULT_PORT" pid)"
	pid="$(broker_pid "$file")" || return 0
	port="$(broker_arg "$pid" port "$DEFAULT_PORT")"
	[[ "$port" =~ ^[1-9][0-9]*$ && "$port" != "$DEFAULT_PORT" ]] || return 0
	! broker_pid "$(state_file "$port" pid)" "$port" >/dev/null || return 0
	mv -f "$file" "$(state_file "$port" pid)" || return 0
	mv -f "$(state_file "$DEFAULT_PORT" log)" "$(state_file "$port" log)" 2>/dev/null || true
	log "moved the pid file and log of the development broker on port $port (pid $pid), started by an earlier $PROG, to $(state_file "$port" '{pid,log}')"
}

# running_line prints the broker's KAFKA_BROKERS=... line from its log.
running_line() {
	local line
	line="$(grep -a '^KAFKA_BROKERS=' "$LOG_FILE" 2>/dev/null | tail -n 1 || true)"
	[[ -n "$line" ]] || return 1
	printf '%s\n' "$line"
}

# build builds the broker into a file of its own and renames it over BIN,
# so that a broker running from BIN (on another port) is not disturbed and
# two builds at once do not mix their output.
build() {
	command -v go >/dev/null 2>&1 || die "go not found in PATH; it is needed to build examples/cmd/devkafka"
	mkdir -p "$(dirname "$BIN")"
	log "building examples/cmd/devkafka -> $BIN"
	local tmp="$BIN.tmp.$$"
	if ! (cd "$REPO_DIR/examples" && go build -o "$tmp" ./cmd/devkafka) >&2; then
		rm -f "$tmp"
		die "building examples/cmd/devkafka failed"
	fi
	mv -f "$tmp" "$BIN"
}

cmd_up() {
	if [[ -n "${KAFKA_BROKERS:-}" ]]; then
		log "using KAFKA_BROKERS from the environment; nothing started"
		printf 'KAFKA_BROKERS=%s\n' "$KAFKA_BROKERS"
		return 0
	fi
	check_settings
	lock
	local pid line
	if pid="$(our_pid)"; then
		if line="$(running_line)" && port_open "${line##*:}"; then
			if [[ "$(broker_arg "$pid" auto-create true)" != "$AUTO_CREATE" || "$(broker_arg "$pid" partitions 12)" != "$PARTITIONS" ]]; then
				die "the development broker on 127.0.0.1:$PORT (pid $pid) runs with $(settings "$pid"), not with the asked auto-create $(on_off "$AUTO_CREATE"), $PARTITIONS partitions; stop it first (DEVKAFKA_PORT=$PORT $PROG down) or set DEVKAFKA_PORT to another port"
			fi
			log "reusing the running development broker (pid $pid, $(settings "$pid"))"
			printf '%s\n' "$line"
			return 0
		fi
		log "pid $pid is running but does not answer; stopping it"
		stop_pid "$pid"
	fi
	rm -f "$PID_FILE"
	if port_open "$PORT"; then
		die "127.0.0.1:$PORT is already in use by another process; set DEVKAFKA_PORT to a free port"
	fi
	build
	log "starting the development in-memory Kafka-protocol broker (kfake, not Apache Kafka) on 127.0.0.1:$PORT, auto-create $(on_off "$AUTO_CREATE"); log in $LOG_FILE"
	# fd 9 (our lock) is closed for the broker so that it does not hold it.
	nohup "$BIN" -port "$PORT" -partitions "$PARTITIONS" -auto-create="$AUTO_CREATE" -pidfile "$PID_FILE" \
		>"$LOG_FILE" 2>&1 </dev/null 9>&- &
	pid=$!
	printf '%s\n' "$pid" >"$PID_FILE"

	local deadline=$((SECONDS + READY_TIMEOUT))
	while ! port_open "$PORT"; do
		if ! kill -0 "$pid" 2>/dev/null; then
			log_tail
			rm -f "$PID_FILE"
			die "the development broker exited while starting (see the log above)"
		fi
		if ((SECONDS >= deadline)); then
			log_tail
			stop_pid "$pid"
			die "the development broker did not accept connections on 127.0.0.1:$PORT within ${READY_TIMEOUT}s (see the log above)"
		fi
		sleep 0.1
	done
	# The broker prints its line right after it listens; wait briefly for it.
	for _ in $(seq 1 50); do
		line="$(running_line)" && break
		sleep 0.1
	done
	[[ -n "${line:-}" ]] || line="KAFKA_BROKERS=127.0.0.1:$PORT"
	log "ready (pid $pid): $line"
	printf '%s\n' "$line"
}

# gone PID: has PID exited (or is it a zombie waiting to be reaped)?
gone() {
	kill -0 "$1" 2>/dev/null || return 0
	[[ "$(sed -e 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1 || true)" == "Z" ]]
}

# stop_pid PID [PIDFILE]: SIGTERM, wait up to 10 s, then SIGKILL; remove
# PIDFILE (default: PORT's).
stop_pid() {
	local pid="$1" file="${2:-$PID_FILE}" i
	kill -TERM "$pid" 2>/dev/null || return 0
	for ((i = 0; i < 100; i++)); do
		gone "$pid" && break
		sleep 0.1
	done
	if ! gone "$pid"; then
		log "pid $pid did not stop after SIGTERM; sending SIGKILL"
		kill -KILL "$pid" 2>/dev/null || true
	fi
	rm -f "$file"
}

cmd_down() {
	case "${1:-}" in
	"") ;;
	--all)
		cmd_down_all
		return
		;;
	*) die "down takes no argument but --all (got: $1); DEVKAFKA_PORT selects the broker" ;;
	esac
	lock
	local pid
	if ! pid="$(our_pid)"; then
		log "no development broker started by $PROG is running on port $PORT; nothing to stop"
		rm -f "$PID_FILE"
		return 0
	fi
	log "stopping the development broker on port $PORT (pid $pid)"
	stop_pid "$pid"
	log "stopped"
}

# cmd_down_all stops every broker that has a pid file in CACHE.
cmd_down_all() {
	local file pid n=0
	shopt -s nullglob
	for file in "$CACHE"/devkafka.pid "$CACHE"/devkafka-*.pid; do
		if pid="$(broker_pid "$file")"; then
			log "stopping the development broker on port $(broker_arg "$pid" port '?') (pid $pid)"
			stop_pid "$pid" "$file"
			n=$((n + 1))
		else
			rm -f "$file"
		fi
	done
	log "stopped $n development broker(s)"
}

cmd_url() {
	if [[ -n "${KAFKA_BROKERS:-}" ]]; then
		printf 'KAFKA_BROKERS=%s\n' "$KAFKA_BROKERS"
		return 0
	fi
	local line
	if our_pid >/dev/null && line="$(running_line)"; then
		printf '%s\n' "$line"
		return 0
	fi
	log "no development broker started by $PROG is running on port $PORT (run: DEVKAFKA_PORT=$PORT $PROG up)"
	return 1
}

cmd_status() {
	local pid
	if pid="$(our_pid)"; then
		log "running (pid $pid): $(running_line || echo "port $PORT"), $(settings "$pid")"
		return 0
	fi
	log "not running on port $PORT"
	return 3
}

main() {
	case "${1:-}" in
	up | down | stop | url | status) adopt_legacy ;;
	esac
	case "${1:-}" in
	up) cmd_up ;;
	down | stop) cmd_down "${@:2}" ;;
	url) cmd_url ;;
	status) cmd_status ;;
	-h | --help | help) usage ;;
	*)
		usage
		exit 64
		;;
	esac
}

main "$@"
