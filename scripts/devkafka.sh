#!/usr/bin/env bash
# devkafka.sh - run the development Kafka-protocol broker (examples/cmd/devkafka)
# in the background for tests and the demo.
#
# It is an in-memory development broker (kfake), NOT Apache Kafka: one broker,
# 127.0.0.1 only, and everything is lost when it stops.
#
# Usage: scripts/devkafka.sh up|down|url|status
#
#   up      Build examples/cmd/devkafka to <repo>/.cache/bin/devkafka, start it
#           (or reuse the one running), wait until its port accepts TCP, and
#           print KAFKA_BROKERS=127.0.0.1:<port> on stdout (only that line;
#           progress goes to stderr), so that
#             eval "$(scripts/devkafka.sh up)"   or   export $(scripts/devkafka.sh up)
#           works. If KAFKA_BROKERS is already set, print it and start nothing.
#   down    Stop the broker that `up` started (only that pid).
#   url     Print the KAFKA_BROKERS=... line (the environment's, else the
#           running broker's).
#   status  Say on stderr whether the broker runs; exit 0 if it does.
#
# Environment:
#   KAFKA_BROKERS          use these brokers instead of starting one (up/url)
#   DEVKAFKA_PORT          port on 127.0.0.1 (default: 59092)
#   DEVKAFKA_PARTITIONS    partitions of auto-created topics (default: 12)
#
# Files: .cache/bin/devkafka, .cache/devkafka.log, .cache/devkafka.pid
set -euo pipefail

readonly PROG="${0##*/}"
REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
readonly REPO_DIR
readonly CACHE="$REPO_DIR/.cache"
readonly BIN="$CACHE/bin/devkafka"
readonly LOG_FILE="$CACHE/devkafka.log"
readonly PID_FILE="$CACHE/devkafka.pid"
readonly LOCK_FILE="$CACHE/devkafka.lock"
readonly PORT="${DEVKAFKA_PORT:-59092}"
readonly PARTITIONS="${DEVKAFKA_PARTITIONS:-12}"
readonly READY_TIMEOUT=30

log() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() {
	printf '%s: error: %s\n' "$PROG" "$*" >&2
	exit 1
}

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

# our_pid prints the pid from the pid file if that process is alive and is
# positively our devkafka binary (not an unrelated process that reused the
# pid); anything it cannot verify is not ours, so we never signal it.
our_pid() {
	local pid cmd
	[[ -r "$PID_FILE" ]] || return 1
	pid="$(head -n 1 "$PID_FILE" 2>/dev/null || true)"
	[[ "$pid" =~ ^[0-9]+$ ]] && ((pid > 1)) || return 1
	kill -0 "$pid" 2>/dev/null || return 1
	if [[ -d "/proc/$pid" ]]; then
		# A killed-but-unreaped process (zombie) is not running.
		[[ "$(sed -e 's/^.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1 || true)" != "Z" ]] || return 1
		cmd="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)"
	else
		cmd="$(ps -p "$pid" -o command= 2>/dev/null || true)"
	fi
	[[ "$cmd" == "$BIN "* ]] || return 1
	printf '%s\n' "$pid"
}

# running_line prints the broker's KAFKA_BROKERS=... line from its log.
running_line() {
	local line
	line="$(grep -a '^KAFKA_BROKERS=' "$LOG_FILE" 2>/dev/null | tail -n 1 || true)"
	[[ -n "$line" ]] || return 1
	printf '%s\n' "$line"
}

build() {
	command -v go >/dev/null 2>&1 || die "go not found in PATH; it is needed to build examples/cmd/devkafka"
	mkdir -p "$(dirname "$BIN")"
	log "building examples/cmd/devkafka -> $BIN"
	(cd "$REPO_DIR/examples" && go build -o "$BIN" ./cmd/devkafka) >&2 ||
		die "building examples/cmd/devkafka failed"
}

cmd_up() {
	if [[ -n "${KAFKA_BROKERS:-}" ]]; then
		log "using KAFKA_BROKERS from the environment; nothing started"
		printf 'KAFKA_BROKERS=%s\n' "$KAFKA_BROKERS"
		return 0
	fi
	lock
	local pid line
	if pid="$(our_pid)"; then
		if line="$(running_line)" && port_open "${line##*:}"; then
			log "reusing the running development broker (pid $pid)"
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
	log "starting the development in-memory Kafka-protocol broker (kfake, not Apache Kafka) on 127.0.0.1:$PORT; log in $LOG_FILE"
	# fd 9 (our lock) is closed for the broker so that it does not hold it.
	nohup "$BIN" -port "$PORT" -partitions "$PARTITIONS" -pidfile "$PID_FILE" \
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

# stop_pid PID: SIGTERM, wait up to 10 s, then SIGKILL.
stop_pid() {
	local pid="$1" i
	kill -TERM "$pid" 2>/dev/null || return 0
	for ((i = 0; i < 100; i++)); do
		gone "$pid" && break
		sleep 0.1
	done
	if ! gone "$pid"; then
		log "pid $pid did not stop after SIGTERM; sending SIGKILL"
		kill -KILL "$pid" 2>/dev/null || true
	fi
	rm -f "$PID_FILE"
}

cmd_down() {
	lock
	local pid
	if ! pid="$(our_pid)"; then
		log "no development broker started by $PROG is running; nothing to stop"
		rm -f "$PID_FILE"
		return 0
	fi
	log "stopping the development broker (pid $pid)"
	stop_pid "$pid"
	log "stopped"
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
	log "no development broker started by $PROG is running (run: $PROG up)"
	return 1
}

cmd_status() {
	local pid
	if pid="$(our_pid)"; then
		log "running (pid $pid): $(running_line || echo "port unknown")"
		return 0
	fi
	log "not running"
	return 3
}

main() {
	case "${1:-}" in
	up) cmd_up ;;
	down | stop) cmd_down ;;
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
