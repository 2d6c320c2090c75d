#!/usr/bin/env bash
# A local 3-node RabbitMQ cluster beside the system node, for the failover drill.
#
#   scripts/cluster.sh start    start r1, r2, r3@localhost, join r2 and r3 to r1, and wait
#                               (bounded) until cluster_status shows 3 running nodes
#   scripts/cluster.sh stop     stop the three nodes and remove their directories (idempotent)
#   scripts/cluster.sh status   print the running nodes; exit 0 only when all 3 run
#
# Node   AMQP (127.0.0.1)   Erlang distribution
# r1     5681               25681
# r2     5682               25682
# r3     5683               25683
#
# The system node (rabbit@localhost on 5672, distribution port 25672) is never touched:
# every rabbitmqctl call here names one of r1..r3 with -n.
#
# Each node has its own config file (`listeners.tcp.local`, `loopback_users = none`, so
# guest/guest works on 127.0.0.1:568N), its own env file, and its data, logs and pid file in
# <base>/<node>. The base is a fresh directory from `mktemp -d` (under $ACEMQ_CLUSTER_DIR,
# default $TMPDIR or /tmp), handed to the rabbitmq user, and everything in it is written
# and removed as that user: nothing here removes or re-owns a tree as root. `start`
# records the base in a state file ($ACEMQ_CLUSTER_STATE, default
# <repo>/target/acemq-cluster.state), which `stop` reads to find it and then deletes. The
# nodes run as that user with HOME=/var/lib/rabbitmq, so they share the system node's
# Erlang cookie with rabbitmqctl. Needs root (or the rabbitmq user).
#
# Environment: ACEMQ_CLUSTER_DIR, ACEMQ_CLUSTER_STATE, ACEMQ_CLUSTER_TIMEOUT (seconds for
# start, default 180).
set -euo pipefail

export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
PARENT="${ACEMQ_CLUSTER_DIR:-${TMPDIR:-/tmp}}"
STATE="${ACEMQ_CLUSTER_STATE:-$ROOT/target/acemq-cluster.state}"
BASE="" # set by new_base (start) or recorded_base (start, stop)
TIMEOUT="${ACEMQ_CLUSTER_TIMEOUT:-180}"
NODES=(r1 r2 r3)
RABBIT_HOME=/var/lib/rabbitmq
SERVER=/usr/lib/rabbitmq/bin/rabbitmq-server

die() {
  echo "cluster.sh: $*" >&2
  exit 1
}

amqp_port() { echo $((5680 + ${1#r})); }
dist_port() { echo $((25680 + ${1#r})); }

# rabbitmqctl against one of our nodes, bounded in time.
ctl() {
  local node="$1"
  shift
  timeout 60 rabbitmqctl -q -n "$node@localhost" "$@"
}

# Runs a command as the rabbitmq user (the nodes' owner).
as_rabbitmq() {
  if [ "$(id -un)" = rabbitmq ]; then
    "$@"
  elif [ "$(id -u)" -eq 0 ]; then
    runuser -u rabbitmq -- "$@"
  else
    die "run as root or as the rabbitmq user"
  fi
}

node_up() {
  ctl "$1" status >/dev/null 2>&1
}

# The base directory `start` recorded, when the record names one this script made: a real
# directory (not a symlink) called acemq-cluster.*, owned by the rabbitmq user. Prints
# nothing otherwise.
recorded_base() {
  local b
  [ -f "$STATE" ] || return 0
  b="$(head -n 1 "$STATE")"
  case "$(basename -- "$b")" in acemq-cluster.*) ;; *) return 0 ;; esac
  if [ -d "$b" ] && [ ! -L "$b" ] && [ "$(stat -c %U -- "$b")" = rabbitmq ]; then
    printf '%s\n' "$b"
  fi
}

# A fresh base directory for this cluster, handed to the rabbitmq user, and recorded.
new_base() {
  mkdir -p "$PARENT" "$(dirname -- "$STATE")"
  BASE="$(mktemp -d "$PARENT/acemq-cluster.XXXXXXXX")"
  # mktemp made it 0700 and ours alone; the nodes (the rabbitmq user) own it from here.
  if [ "$(id -un)" != rabbitmq ]; then
    chown rabbitmq:rabbitmq "$BASE"
  fi
  printf '%s\n' "$BASE" >"$STATE"
}

# The number of running nodes r1 reports (0 when r1 is down).
running_count() {
  local out
  out="$(ctl r1 eval 'length(rabbit_nodes:all_running()).' 2>/dev/null)" || out=0
  case "$out" in
  '' | *[!0-9]*) echo 0 ;;
  *) echo "$out" ;;
  esac
}

start_node() {
  local n="$1" dir="$BASE/$1" port dist
  port="$(amqp_port "$n")"
  dist="$(dist_port "$n")"
  if node_up "$n"; then
    echo "$n@localhost already running"
    return
  fi
  if ss -ltn "( sport = :$port or sport = :$dist )" | grep -q LISTEN; then
    die "port $port or $dist is taken by another process; cannot start $n@localhost"
  fi
  # A node directory that is not running is started afresh, as the rabbitmq user, who owns
  # the base and everything in it.
  as_rabbitmq rm -rf -- "$dir"
  as_rabbitmq mkdir -p "$dir/mnesia" "$dir/log"
  printf 'listeners.tcp.local = 127.0.0.1:%s\nloopback_users = none\n' "$port" |
    as_rabbitmq tee "$dir/rabbitmq.conf" >/dev/null
  echo '[].' | as_rabbitmq tee "$dir/enabled_plugins" >/dev/null
  # Our own env file instead of /etc/rabbitmq/rabbitmq-env.conf, which names rabbit@localhost.
  as_rabbitmq tee "$dir/rabbitmq-env.conf" >/dev/null <<EOF
NODENAME=$n@localhost
ERL_EPMD_ADDRESS=127.0.0.1
export ERL_FLAGS="-kernel inet_dist_use_interface {127,0,0,1}"
EOF
  echo "starting $n@localhost on 127.0.0.1:$port (distribution $dist)"
  (
    cd "$dir"
    as_rabbitmq env \
      HOME="$RABBIT_HOME" \
      RABBITMQ_NODENAME="$n@localhost" \
      RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
      RABBITMQ_NODE_PORT="$port" \
      RABBITMQ_DIST_PORT="$dist" \
      RABBITMQ_CONF_ENV_FILE="$dir/rabbitmq-env.conf" \
      RABBITMQ_CONFIG_FILE="$dir/rabbitmq" \
      RABBITMQ_ADVANCED_CONFIG_FILE="$dir/advanced.config" \
      RABBITMQ_MNESIA_BASE="$dir/mnesia" \
      RABBITMQ_LOG_BASE="$dir/log" \
      RABBITMQ_PID_FILE="$dir/pid" \
      RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins" \
      sh -c 'exec "$0" -detached >"$1" 2>&1' "$SERVER" "$dir/startup.log"
  ) || die "rabbitmq-server -detached failed for $n@localhost (see $dir/startup.log)"
}

# Waits until a node's application runs, within the start budget.
await_node() {
  local n="$1" deadline="$2"
  while ! ctl "$n" await_startup --timeout 10 >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$deadline" ] ||
      die "$n@localhost did not start within ${TIMEOUT}s (logs in $BASE/$n/log)"
    sleep 1
  done
}

# Whether r1 already counts the node as a cluster member.
joined() {
  [ "$(ctl r1 eval "lists:member('$1@localhost', rabbit_nodes:all())." 2>/dev/null)" = true ]
}

cmd_start() {
  local start deadline n
  start="$(date +%s)"
  deadline=$((start + TIMEOUT))
  BASE="$(recorded_base)"
  if [ -z "$BASE" ]; then
    new_base
  fi
  for n in "${NODES[@]}"; do start_node "$n"; done
  for n in "${NODES[@]}"; do await_node "$n" "$deadline"; done
  for n in "${NODES[@]:1}"; do
    if joined "$n"; then
      continue
    fi
    echo "joining $n@localhost to r1@localhost"
    ctl "$n" stop_app
    ctl "$n" join_cluster r1@localhost
    ctl "$n" start_app
  done
  until [ "$(running_count)" -eq "${#NODES[@]}" ]; do
    [ "$(date +%s)" -lt "$deadline" ] ||
      die "cluster_status did not show ${#NODES[@]} running nodes within ${TIMEOUT}s"
    sleep 1
  done
  echo "cluster up: ${#NODES[@]} running nodes in $(($(date +%s) - start))s;" \
    "amqp://guest:guest@127.0.0.1:{5681,5682,5683}/%2f"
}

cmd_stop() {
  local n dir pid
  BASE="$(recorded_base)"
  for n in "${NODES[@]}"; do
    # Without a recorded base the nodes are still stopped by name; there are no files.
    dir="${BASE:-/nonexistent}/$n"
    if node_up "$n"; then
      echo "stopping $n@localhost"
      if [ -f "$dir/pid" ]; then
        ctl "$n" stop "$dir/pid" >/dev/null 2>&1 || true
      else
        ctl "$n" stop >/dev/null 2>&1 || true
      fi
    fi
    # A node that would not stop: end its own process (by the pid it wrote), nothing else.
    if [ -f "$dir/pid" ]; then
      pid="$(cat "$dir/pid" 2>/dev/null || true)"
      if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null &&
        tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "-sname $n@localhost\|$n@localhost"; then
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 1 30); do
          kill -0 "$pid" 2>/dev/null || break
          sleep 1
        done
        kill -9 "$pid" 2>/dev/null || true
      fi
    fi
    if [ -n "$BASE" ]; then
      as_rabbitmq rm -rf -- "$dir"
    fi
  done
  if [ -n "$BASE" ]; then
    rmdir -- "$BASE" 2>/dev/null || echo "cluster.sh: $BASE is not empty; left in place" >&2
  fi
  rm -f -- "$STATE"
  echo "cluster stopped"
}

cmd_status() {
  local count
  count="$(running_count)"
  if [ "$count" -gt 0 ]; then
    echo "running nodes: $(ctl r1 eval 'rabbit_nodes:all_running().')"
  else
    echo "running nodes: none (r1@localhost is down)"
  fi
  [ "$count" -eq "${#NODES[@]}" ]
}

case "${1:-}" in
start) cmd_start ;;
stop) cmd_stop ;;
status) cmd_status ;;
*)
  echo "usage: scripts/cluster.sh start|stop|status" >&2
  exit 2
  ;;
esac
