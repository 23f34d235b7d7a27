#!/usr/bin/env bash
# Run a real single-node Apache Kafka broker (KRaft, broker+controller in one
# JVM) on loopback, without Docker. The broker jars come from Maven Central and
# are cached under <repo>/.cache/kafka/<version>/libs (Maven's local repository
# is <repo>/.cache/m2, so nothing outside the repo is written).
#
#   scripts/kafka.sh up                    start (or reuse) the broker; prints KAFKA_BROKERS=host:port
#   scripts/kafka.sh start                 start (or reuse) the broker without waiting until it serves
#                                          (the nodes of a cluster: start each, then 'up' each)
#   scripts/kafka.sh down                  SIGTERM the broker (SIGKILL after 30 s)
#   scripts/kafka.sh kill                  SIGKILL the broker (crash tests); data is kept
#   scripts/kafka.sh destroy               down + delete the broker's state: the KAFKA_STATE_DIR folder,
#                                          or in the default one everything but the jar cache
#   scripts/kafka.sh status                say whether the broker is running
#   scripts/kafka.sh topic NAME PARTITIONS create a topic (no-op if it exists)
#   scripts/kafka.sh tool CLASS [ARGS...]  run a Kafka tool class with the broker's classpath,
#                                          e.g. org.apache.kafka.tools.ConsoleProducer
#
# Environment: KAFKA_PORT (39092), KAFKA_CONTROLLER_PORT (39093),
# KAFKA_START_TIMEOUT seconds (90), KAFKA_HEAP_OPTS, KAFKA_JVM_OPTS,
# KAFKA_STATE_DIR (<repo>/.cache/kafka): where this broker keeps its data dir,
# config, log and pid file. A second broker needs its own KAFKA_STATE_DIR and
# ports (the fault tests in internal/faulttest run one that way, so killing it
# does not disturb other tests); the jar cache is shared.
#
# A cluster of several nodes (each broker+controller, static voters) is one
# state dir and pair of ports per node, started with the same
# KAFKA_CLUSTER_ID (22 characters, Kafka's base64 Uuid) and:
#   KAFKA_NODE_ID (1)              this node's id
#   KAFKA_QUORUM_VOTERS            every node's id@host:controller-port, comma-separated
#                                  (default: this node alone)
#   KAFKA_REPLICATION_FACTOR (1)   default replication factor, also of the internal topics
#   KAFKA_MIN_INSYNC_REPLICAS (1)  min.insync.replicas, also transaction.state.log.min.isr
#
# Transactions (the relay's exactly-once mode, read_committed consumers):
#   KAFKA_TXN_ABORT_CLEANUP_INTERVAL_MS (1000)
#                                  transaction.abort.timed.out.transaction.cleanup.interval.ms:
#                                  how often the broker aborts transactions that outlived their
#                                  timeout (Kafka's default is 10000), so the open transaction of a
#                                  producer that died holds read_committed consumers for about its
#                                  timeout plus this; transaction.max.timeout.ms keeps its default (15 min)
#
# Only the `up` line goes to stdout, so a Makefile can do
#   export $(scripts/kafka.sh up)
set -euo pipefail

KAFKA_VERSION=4.4.0      # org.apache.kafka:kafka_2.13 (newest 4.x on Maven Central when pinned)
LOG4J_VERSION=2.25.3     # log4j2 binding so the broker logs (Kafka 4.x uses log4j2 + slf4j 1.7)

KAFKA_PORT=${KAFKA_PORT:-39092}
KAFKA_CONTROLLER_PORT=${KAFKA_CONTROLLER_PORT:-39093}
KAFKA_START_TIMEOUT=${KAFKA_START_TIMEOUT:-90}
KAFKA_HEAP_OPTS=${KAFKA_HEAP_OPTS:--Xms256m -Xmx512m}
KAFKA_JVM_OPTS=${KAFKA_JVM_OPTS:--XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true}
HOST=127.0.0.1
NODE_ID=${KAFKA_NODE_ID:-1}
QUORUM_VOTERS=${KAFKA_QUORUM_VOTERS:-$NODE_ID@$HOST:$KAFKA_CONTROLLER_PORT}
REPLICATION_FACTOR=${KAFKA_REPLICATION_FACTOR:-1}
MIN_ISR=${KAFKA_MIN_INSYNC_REPLICAS:-1}
TXN_ABORT_CLEANUP_INTERVAL_MS=${KAFKA_TXN_ABORT_CLEANUP_INTERVAL_MS:-1000}
[[ $TXN_ABORT_CLEANUP_INTERVAL_MS =~ ^[1-9][0-9]*$ ]] ||
  { echo "kafka.sh: KAFKA_TXN_ABORT_CLEANUP_INTERVAL_MS=$TXN_ABORT_CLEANUP_INTERVAL_MS: give milliseconds, a positive integer" >&2; exit 64; }

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=$REPO/.cache
M2=$CACHE/m2
JARDIR=$CACHE/kafka
VDIR=$JARDIR/$KAFKA_VERSION
LIBS=$VDIR/libs
MARKER=$VDIR/.resolved
JARLOCK=$JARDIR/.jars.lock
KDIR=${KAFKA_STATE_DIR:-$CACHE/kafka}
DATA=$KDIR/data
CONF=$KDIR/server.properties
LOG4J_BROKER=$KDIR/log4j2-broker.xml
LOG4J_TOOLS=$KDIR/log4j2-tools.xml
LOG=$KDIR/broker.log
PIDF=$KDIR/broker.pid
LOCK=$KDIR/.lock

BROKERS=$HOST:$KAFKA_PORT

log() { printf 'kafka.sh: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

need_java() {
  if ! command -v java >/dev/null 2>&1; then
    echo "Java 17+ not found: apt-get install openjdk-17-jre-headless" >&2
    exit 2
  fi
  local v major
  v=$(java -version 2>&1 | sed -n 's/.*version "\([^"]*\)".*/\1/p' | head -n1)
  major=${v%%.*}
  [[ $major == 1 ]] && major=$(echo "$v" | cut -d. -f2)
  if [[ ! $major =~ ^[0-9]+$ ]] || (( major < 17 )); then
    echo "Java 17+ not found (found ${v:-unknown}): apt-get install openjdk-17-jre-headless" >&2
    exit 2
  fi
}

need_mvn() {
  if ! command -v mvn >/dev/null 2>&1; then
    echo "Maven not found: apt-get install maven" >&2
    exit 2
  fi
}

# Serialise up/down/kill/destroy between concurrent callers (e.g. make -j).
take_lock() {
  mkdir -p "$KDIR"
  if command -v flock >/dev/null 2>&1; then
    exec 9>"$LOCK"
    flock -w 300 9 || die "timed out waiting for $LOCK"
  fi
}

# ---------------------------------------------------------------- jars

write_pom() {
  cat >"$VDIR/pom.xml.tmp.$$" <<EOF
<?xml version="1.0" encoding="UTF-8"?>
<!-- Throwaway pom generated by scripts/kafka.sh: only used to resolve the broker's jars. -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.kafka-sh</groupId>
  <artifactId>kafka-broker-libs</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <!-- broker (kafka.Kafka), storage formatter (kafka.tools.StorageTool); pulls in
         kafka-server, -metadata, -raft, -storage, -clients, coordinators, scala -->
    <dependency>
      <groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>$KAFKA_VERSION</version>
    </dependency>
    <!-- CLI tools: TopicCommand, ConsoleProducer/Consumer, BrokerApiVersionsCommand.
         connect-runtime is only needed by the connect plugin tool and is large. -->
    <dependency>
      <groupId>org.apache.kafka</groupId><artifactId>kafka-tools</artifactId><version>$KAFKA_VERSION</version>
      <exclusions>
        <exclusion><groupId>org.apache.kafka</groupId><artifactId>connect-runtime</artifactId></exclusion>
      </exclusions>
    </dependency>
    <!-- logging backend (the Kafka poms only declare slf4j-api) -->
    <dependency>
      <groupId>org.apache.logging.log4j</groupId><artifactId>log4j-api</artifactId><version>$LOG4J_VERSION</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId><version>$LOG4J_VERSION</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>$LOG4J_VERSION</version>
    </dependency>
  </dependencies>
</project>
EOF
  # Replace it only when it changed (a rename, so a concurrent reader never
  # sees half a file).
  if cmp -s "$VDIR/pom.xml.tmp.$$" "$VDIR/pom.xml"; then
    rm -f "$VDIR/pom.xml.tmp.$$"
  else
    mv -f "$VDIR/pom.xml.tmp.$$" "$VDIR/pom.xml"
  fi
}

pom_sum() { sha256sum "$VDIR/pom.xml" | cut -d' ' -f1; }

resolve_jars() {
  mkdir -p "$VDIR"
  # Brokers with different KAFKA_STATE_DIRs share the jars: resolve them under
  # a lock of their own (fd 8, closed for the JVM).
  if command -v flock >/dev/null 2>&1; then
    exec 8>"$JARLOCK"
    flock -w 600 8 || die "timed out waiting for $JARLOCK"
  fi
  write_pom
  if [[ -f $MARKER && -d $LIBS && $(cat "$MARKER") == "$(pom_sum)" ]]; then
    return 0
  fi
  need_mvn
  log "resolving Kafka $KAFKA_VERSION jars from Maven Central into $LIBS ..."
  local t0=$SECONDS
  rm -rf "$LIBS.tmp"
  # (Debian's Maven 3.8 prints bare ANSI resets even with -q -B: strip them.)
  if ! (cd "$VDIR" && mvn -q -B -Dstyle.color=never -Dmaven.repo.local="$M2" \
        dependency:copy-dependencies -DoutputDirectory="$LIBS.tmp" -DincludeScope=runtime) 2>&1 \
      | sed -e 's/\x1b\[[0-9;]*m//g' -e '/^[[:space:]]*$/d' >&2; then
    rm -rf "$LIBS.tmp"
    die "Maven could not resolve org.apache.kafka:kafka_2.13:$KAFKA_VERSION (see output above)"
  fi
  rm -rf "$LIBS"
  mv "$LIBS.tmp" "$LIBS"
  pom_sum >"$MARKER"
  log "resolved $(find "$LIBS" -name '*.jar' | wc -l) jars in $((SECONDS - t0))s"
}

unlock_jars() { exec 8>&-; }

# ---------------------------------------------------------------- config

write_configs() {
  mkdir -p "$DATA"
  cat >"$CONF" <<EOF
# Generated by scripts/kafka.sh on each 'up'; edit the script, not this file.
process.roles=broker,controller
node.id=$NODE_ID
listeners=PLAINTEXT://$HOST:$KAFKA_PORT,CONTROLLER://$HOST:$KAFKA_CONTROLLER_PORT
advertised.listeners=PLAINTEXT://$HOST:$KAFKA_PORT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
# Static voter set: the controller endpoint lives in this file, not in the
# metadata log, so the ports can change between runs on the same data dir.
controller.quorum.voters=$QUORUM_VOTERS
log.dirs=$DATA
num.partitions=12
default.replication.factor=$REPLICATION_FACTOR
min.insync.replicas=$MIN_ISR
auto.create.topics.enable=false
delete.topic.enable=true
offsets.topic.replication.factor=$REPLICATION_FACTOR
offsets.topic.num.partitions=12
transaction.state.log.replication.factor=$REPLICATION_FACTOR
transaction.state.log.min.isr=$MIN_ISR
transaction.state.log.num.partitions=12
# Abort a transaction that outlived its timeout (its producer died) within
# about 1 s of the timeout rather than 10 s: until then it holds back
# read_committed consumers of its partitions.
transaction.abort.timed.out.transaction.cleanup.interval.ms=$TXN_ABORT_CLEANUP_INTERVAL_MS
share.coordinator.state.topic.replication.factor=$REPLICATION_FACTOR
share.coordinator.state.topic.min.isr=$MIN_ISR
group.initial.rebalance.delay.ms=0
# After a SIGKILL the restarted node must wait for its old registration to be
# fenced before it can register again: keep that wait short (defaults 9 s / 2 s).
broker.session.timeout.ms=3000
broker.heartbeat.interval.ms=500
num.network.threads=2
num.io.threads=4
log.retention.hours=24
log.retention.bytes=1073741824
log.segment.bytes=67108864
log.retention.check.interval.ms=60000
EOF
  cat >"$LOG4J_BROKER" <<'EOF'
<?xml version="1.0" encoding="UTF-8"?>
<!-- Generated by scripts/kafka.sh: broker logs at INFO to stdout (= broker.log). -->
<Configuration status="WARN">
  <Appenders>
    <Console name="STDOUT" target="SYSTEM_OUT">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
    </Console>
  </Appenders>
  <Loggers>
    <Logger name="kafka.request.logger" level="WARN"/>
    <Logger name="kafka.authorizer.logger" level="WARN"/>
    <Logger name="state.change.logger" level="WARN"/>
    <Logger name="org.apache.kafka.common.config.AbstractConfig" level="WARN"/>
    <Root level="INFO"><AppenderRef ref="STDOUT"/></Root>
  </Loggers>
</Configuration>
EOF
  cat >"$LOG4J_TOOLS" <<'EOF'
<?xml version="1.0" encoding="UTF-8"?>
<!-- Generated by scripts/kafka.sh: CLI tools log warnings to stderr only. -->
<Configuration status="WARN">
  <Appenders>
    <Console name="STDERR" target="SYSTEM_ERR">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
    </Console>
  </Appenders>
  <Loggers>
    <Root level="WARN"><AppenderRef ref="STDERR"/></Root>
  </Loggers>
</Configuration>
EOF
}

# Run a Kafka CLI class with the cached classpath (short-lived JVM, C1 only).
run_tool() {
  java -Xms32m -Xmx256m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Djava.awt.headless=true \
    -Dlog4j2.shutdownHookEnabled=false -Dlog4j2.configurationFile="$LOG4J_TOOLS" -cp "$LIBS/*" "$@"
}

new_cluster_id() {
  # A Kafka Uuid: 16 random bytes, base64url without padding (22 chars). Kafka
  # refuses ids starting with '-' on the command line, so draw again if needed.
  local id
  while :; do
    id=$(head -c16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')
    [[ $id != -* && ${#id} == 22 ]] && break
  done
  printf '%s\n' "$id"
}

format_storage() {
  if [[ -f $DATA/meta.properties ]]; then
    return 0
  fi
  local id=${KAFKA_CLUSTER_ID:-}
  [[ -n $id ]] || id=$(new_cluster_id)
  log "formatting $DATA (cluster id $id)"
  local out
  if ! out=$(run_tool kafka.tools.StorageTool format -t "$id" -c "$CONF" --ignore-formatted 2>&1); then
    printf '%s\n' "$out" >&2
    die "storage format failed"
  fi
}

# ---------------------------------------------------------------- process

# The pid in $PIDF if it is a live (non-zombie) broker started by this script.
broker_pid() {
  [[ -f $PIDF ]] || return 1
  local pid state
  pid=$(cat "$PIDF" 2>/dev/null) || return 1
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 1
  [[ $state != Z ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "kafka.Kafka $CONF" || return 1
  printf '%s\n' "$pid"
}

port_open() { (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null; }

# api_versions_ok sends an ApiVersions v0 request to the client port and
# succeeds if the broker answers it (correlation id 1, error code 0). Done
# in bash rather than with a CLI tool: a tool's JVM takes seconds of CPU,
# which a broker restarting on a small machine competes for.
api_versions_ok() {
  local hex
  hex=$(
    exec 2>/dev/null 3<>"/dev/tcp/$HOST/$KAFKA_PORT" || exit 1
    # size 10 | api key 18 | version 0 | correlation id 1 | client id null
    printf '\x00\x00\x00\x0a\x00\x12\x00\x00\x00\x00\x00\x01\xff\xff' >&3
    timeout 5 head -c 10 <&3 | od -An -tx1 | tr -d ' \n'
  ) || return 1
  [[ ${hex:8} == 000000010000 ]]
}

start_broker() {
  local p
  for p in "$KAFKA_PORT" "$KAFKA_CONTROLLER_PORT"; do
    if port_open "$p"; then
      die "port $HOST:$p is already in use by another process (not a broker started by this script)"
    fi
  done
  [[ -f $LOG ]] && mv -f "$LOG" "$LOG.1"
  rm -f "$PIDF"
  log "starting Kafka $KAFKA_VERSION on $BROKERS (log: $LOG)"
  # setsid: own session, so ^C in the caller's terminal does not reach it.
  # The inner shell records its own pid and execs java, so the pid is the JVM's.
  # fd 9 (the lock) is closed so the JVM does not hold it.
  # shellcheck disable=SC2086
  setsid bash -c 'echo $$ >"$0"; exec "$@"' "$PIDF" \
    java $KAFKA_HEAP_OPTS $KAFKA_JVM_OPTS \
      -Dlog4j2.configurationFile="$LOG4J_BROKER" \
      -cp "$LIBS/*" kafka.Kafka "$CONF" \
      </dev/null >"$LOG" 2>&1 9>&- &
  # Wait for the pid file, then for the exec into java (broker_pid checks the
  # command line), so wait_ready does not mistake the launcher for a dead JVM.
  local _ pid
  for _ in $(seq 1 100); do
    if [[ -s $PIDF ]]; then
      broker_pid >/dev/null && return 0
      pid=$(cat "$PIDF")
      kill -0 "$pid" 2>/dev/null || break
    fi
    sleep 0.05
  done
  [[ -s $PIDF ]] || die "broker did not start (no pid file)"
}

log_tail() {
  log "---- last lines of $LOG ----"
  tail -n 40 "$LOG" >&2 2>/dev/null || true
}

# Wait until the broker answers a metadata request (bounded).
wait_ready() {
  local deadline=$((SECONDS + KAFKA_START_TIMEOUT)) pid
  while :; do
    if ! pid=$(broker_pid); then
      log "broker process exited during startup"
      log_tail
      exit 1
    fi
    # The broker logs 'Kafka Server started' once it is registered and
    # unfenced; then one real round trip on the client port.
    if grep -q 'Kafka Server started' "$LOG" 2>/dev/null && api_versions_ok; then
      return 0
    fi
    if (( SECONDS >= deadline )); then
      log "broker not ready after ${KAFKA_START_TIMEOUT}s"
      log_tail
      # Do not leave a half-started JVM behind (the data dir is kept).
      [[ ${STARTED_HERE:-0} == 1 ]] && stop_broker
      exit 1
    fi
    sleep 0.5
  done
}

stop_broker() {
  local pid deadline=$((SECONDS + 30))
  if ! pid=$(broker_pid); then
    log "broker not running"
    rm -f "$PIDF"
    return 0
  fi
  log "stopping broker pid $pid (SIGTERM)"
  kill -TERM "$pid" 2>/dev/null || true
  while broker_pid >/dev/null && (( SECONDS < deadline )); do
    sleep 0.1
  done
  if broker_pid >/dev/null; then
    log "broker pid $pid still alive after 30s: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  wait_gone "$pid"
  rm -f "$PIDF"
  log "broker stopped"
}

# wait_gone PID: waits until the killed or stopped broker PID has exited
# and its ports are closed. broker_pid cannot tell: an exiting process has
# no cmdline once its memory is released, and a JVM's main thread is a
# zombie while its other threads still exit, holding the listening
# sockets; a broker started then found its own ports taken ("already in
# use by another process").
wait_gone() {
  local _ state
  for _ in $(seq 1 200); do
    state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || state=gone
    if [[ $state == gone || $state == Z ]] && ! port_open "$KAFKA_PORT" && ! port_open "$KAFKA_CONTROLLER_PORT"; then
      return 0
    fi
    sleep 0.1
  done
  die "pid $1 did not go away, or its ports $HOST:$KAFKA_PORT, $HOST:$KAFKA_CONTROLLER_PORT stayed open, after 20s"
}

# ---------------------------------------------------------------- commands

cmd_up() {
  cmd_start
  wait_ready
  log "broker ready (pid $(broker_pid))"
  echo "KAFKA_BROKERS=$BROKERS"
}

cmd_start() {
  need_java
  take_lock
  local pid
  if pid=$(broker_pid); then
    if [[ -f $CONF ]] && ! grep -qxF "listeners=PLAINTEXT://$HOST:$KAFKA_PORT,CONTROLLER://$HOST:$KAFKA_CONTROLLER_PORT" "$CONF"; then
      die "broker pid $pid runs with other ports ($(grep '^listeners=' "$CONF")): run '$0 down' first"
    fi
    log "reusing running broker pid $pid"
    write_configs_if_missing
  else
    resolve_jars
    unlock_jars
    write_configs
    format_storage
    start_broker
    STARTED_HERE=1
  fi
}

# When reusing, keep the config the running broker was started with.
write_configs_if_missing() {
  [[ -f $CONF && -f $LOG4J_TOOLS && -f $LOG4J_BROKER ]] || write_configs
}

cmd_down() { take_lock; stop_broker; }

cmd_kill() {
  take_lock
  local pid
  if ! pid=$(broker_pid); then
    log "broker not running"
    rm -f "$PIDF"
    return 0
  fi
  log "killing broker pid $pid (SIGKILL)"
  kill -KILL "$pid" 2>/dev/null || true
  wait_gone "$pid"
  rm -f "$PIDF"
  log "broker killed"
}

# destroy removes the broker's state, as pg.sh destroy removes its cluster:
# the data dir, config, logs, pid and lock files, and then the
# KAFKA_STATE_DIR folder itself (only once it is empty: a folder holding
# anything else is kept). The default folder also holds the shared jar
# cache (<version>/libs), which stays.
cmd_destroy() {
  take_lock
  stop_broker
  exec 9>&- # the lock file goes too
  log "removing the broker's state in $KDIR"
  rm -rf -- "$DATA" "$CONF" "$LOG4J_BROKER" "$LOG4J_TOOLS" "$LOG" "$LOG.1" "$PIDF" "$LOCK"
  if [[ $KDIR != "$JARDIR" ]] && ! rmdir -- "$KDIR" 2>/dev/null && [[ -d $KDIR ]]; then
    log "kept $KDIR: it holds files this script did not write"
  fi
}

cmd_status() {
  local pid
  if pid=$(broker_pid); then
    log "running: pid $pid on $BROKERS"
  else
    log "not running"
    return 1
  fi
}

cmd_topic() {
  [[ $# == 2 && $2 =~ ^[0-9]+$ ]] || die "usage: $0 topic NAME PARTITIONS"
  need_java
  [[ -f $MARKER ]] || die "jars not resolved yet: run '$0 up' first"
  write_configs_if_missing
  run_tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$BROKERS" \
    --create --if-not-exists --topic "$1" --partitions "$2" --replication-factor 1 >&2
}

cmd_tool() {
  [[ $# -ge 1 ]] || die "usage: $0 tool CLASS [ARGS...]"
  need_java
  [[ -f $MARKER ]] || die "jars not resolved yet: run '$0 up' first"
  write_configs_if_missing
  run_tool "$@"
}

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
  exit 64
}

cmd=${1:-}
[[ $# -gt 0 ]] && shift
case $cmd in
  up) cmd_up ;;
  start) cmd_start ;;
  down) cmd_down ;;
  kill) cmd_kill ;;
  destroy) cmd_destroy ;;
  status) cmd_status ;;
  topic) cmd_topic "$@" ;;
  tool) cmd_tool "$@" ;;
  *) usage ;;
esac
