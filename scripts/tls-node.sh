#!/usr/bin/env bash
# A RabbitMQ node with a TLS listener beside the system node, for the TLS drill.
#
#   scripts/tls-node.sh start    generate certificates, start tls@localhost, wait (bounded)
#                                until it runs and its amqps port answers
#   scripts/tls-node.sh stop     stop the node and remove its directory (idempotent)
#   scripts/tls-node.sh status   exit 0 only when the node runs
#
# Ports (127.0.0.1): amqps 5691 (verify_peer, fail_if_no_peer_cert), plain AMQP 5690,
# Erlang distribution 25690, and 5692 (openssl s_server with the X.509 v1 certificate). The system node (rabbit@localhost on 5672) and the drill
# cluster (r1..r3 on 5681..5683) are never touched: every rabbitmqctl call names tls@localhost.
#
# Certificates, written by openssl into $ACEMQ_TLS_DIR/certs (default /tmp/acemq-tls/certs),
# never committed:
#   ca.pem                   a private CA (X.509 v3)
#   server.pem, server.key   signed by it; SAN localhost, 127.0.0.1, rabbit.acemq.test
#   client.pem, client.key   signed by it (mutual TLS; CN acemq-drill)
#   rogue-ca.pem             another CA the server does not trust
#   rogue-client.pem/.key    a client certificate signed by the rogue CA (refused by the server)
#   v1.pem, v1.key           an X.509 v1 server certificate (no extensions), signed by ca.pem,
#                            presented by `openssl s_server` on 127.0.0.1:5692 (the negative
#                            case; Erlang 25's sni_hosts, which would let the node present it,
#                            crashes TLS 1.3 handshakes whose SNI does not match)
#
# The node runs as the rabbitmq user with HOME=/var/lib/rabbitmq (the system node's Erlang
# cookie, so rabbitmqctl -n tls@localhost works). Needs root (or the rabbitmq user); on
# Debian, openssl is installed with apt-get when missing.
#
# Environment: ACEMQ_TLS_DIR, ACEMQ_TLS_TIMEOUT (seconds for start, default 120).
set -euo pipefail

export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

BASE="${ACEMQ_TLS_DIR:-/tmp/acemq-tls}"
TIMEOUT="${ACEMQ_TLS_TIMEOUT:-120}"
NODE=tls@localhost
AMQPS_PORT=5691
AMQP_PORT=5690
DIST_PORT=25690
V1_PORT=5692
RABBIT_HOME=/var/lib/rabbitmq
SERVER=/usr/lib/rabbitmq/bin/rabbitmq-server

die() {
  echo "tls-node.sh: $*" >&2
  exit 1
}

ctl() {
  timeout 60 rabbitmqctl -q -n "$NODE" "$@"
}

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
  ctl status >/dev/null 2>&1
}

ensure_tools() {
  if ! command -v openssl >/dev/null 2>&1; then
    command -v apt-get >/dev/null 2>&1 || die "openssl is missing (and apt-get is not available)"
    echo "installing openssl"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q openssl >/dev/null
  fi
  [ -x "$SERVER" ] || die "$SERVER is missing; run scripts/services.sh (it installs rabbitmq-server)"
  # Debian's rabbitmq-server depends on erlang-ssl; check, and install it if it went missing.
  if ! ls -d /usr/lib/erlang/lib/ssl-* >/dev/null 2>&1; then
    command -v apt-get >/dev/null 2>&1 || die "Erlang's ssl application is missing"
    echo "installing erlang-ssl"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q erlang-ssl >/dev/null
  fi
}

# Signs a CSR: $1 csr, $2 CA name (ca|rogue-ca), $3 output, $4 extensions file or "" (v1).
sign() {
  local csr="$1" ca="$2" out="$3" ext="$4"
  local -a extargs=()
  if [ -n "$ext" ]; then extargs=(-extfile "$ext"); fi
  openssl x509 -req -in "$csr" -CA "$ca.pem" -CAkey "$ca.key" -CAcreateserial \
    -days 2 -sha256 -out "$out" "${extargs[@]}" 2>/dev/null
}

gen_certs() {
  local d="$BASE/certs"
  rm -rf "$d"
  mkdir -p "$d"
  (
    cd "$d"
    umask 077
    for ca in ca rogue-ca; do
      openssl req -x509 -newkey rsa:2048 -nodes -keyout "$ca.key" -out "$ca.pem" -days 2 \
        -subj "/O=AceMQ drill/CN=AceMQ drill $ca" \
        -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
        2>/dev/null
    done
    cat >server.ext <<'EOF'
basicConstraints = CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost, IP:127.0.0.1, DNS:rabbit.acemq.test
EOF
    cat >client.ext <<'EOF'
basicConstraints = CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = clientAuth
EOF
    openssl req -new -newkey rsa:2048 -nodes -keyout server.key -out server.csr \
      -subj "/O=AceMQ drill/CN=localhost" 2>/dev/null
    sign server.csr ca server.pem server.ext
    openssl req -new -newkey rsa:2048 -nodes -keyout client.key -out client.csr \
      -subj "/O=AceMQ drill/CN=acemq-drill" 2>/dev/null
    sign client.csr ca client.pem client.ext
    openssl req -new -newkey rsa:2048 -nodes -keyout rogue-client.key -out rogue-client.csr \
      -subj "/O=AceMQ drill/CN=rogue-client" 2>/dev/null
    sign rogue-client.csr rogue-ca rogue-client.pem client.ext
    # No extensions file: openssl writes an X.509 v1 certificate.
    openssl req -new -newkey rsa:2048 -nodes -keyout v1.key -out v1.csr \
      -subj "/O=AceMQ drill/CN=v1.acemq.test" 2>/dev/null
    sign v1.csr ca v1.pem ""
    rm -f ./*.csr ./*.ext ./*.srl
  )
  openssl x509 -in "$d/v1.pem" -noout -text | grep -q 'Version: 1 ' ||
    die "openssl did not write an X.509 v1 certificate"
  openssl verify -CAfile "$d/ca.pem" "$d/server.pem" "$d/client.pem" >/dev/null ||
    die "the generated certificates do not verify"
}

cmd_start() {
  local dir="$BASE/node" start deadline
  start="$(date +%s)"
  deadline=$((start + TIMEOUT))
  ensure_tools
  if node_up; then
    ss -ltn "( sport = :$V1_PORT )" | grep -q LISTEN || start_v1_server
    echo "$NODE already running (amqps://127.0.0.1:$AMQPS_PORT, certificates in $BASE/certs)"
    return
  fi
  if ss -ltn "( sport = :$AMQPS_PORT or sport = :$AMQP_PORT or sport = :$DIST_PORT or sport = :$V1_PORT )" | grep -q LISTEN; then
    die "port $AMQPS_PORT, $AMQP_PORT, $DIST_PORT or $V1_PORT is taken by another process"
  fi
  rm -rf "$BASE"
  mkdir -p "$dir/mnesia" "$dir/log"
  gen_certs
  local c="$BASE/certs"
  cat >"$dir/rabbitmq.conf" <<EOF
listeners.tcp.local = 127.0.0.1:$AMQP_PORT
listeners.ssl.local = 127.0.0.1:$AMQPS_PORT
loopback_users = none
ssl_options.cacertfile = $c/ca.pem
ssl_options.certfile = $c/server.pem
ssl_options.keyfile = $c/server.key
ssl_options.verify = verify_peer
ssl_options.fail_if_no_peer_cert = true
EOF
  echo '[].' >"$dir/advanced.config"
  echo '[].' >"$dir/enabled_plugins"
  cat >"$dir/rabbitmq-env.conf" <<EOF
NODENAME=$NODE
ERL_EPMD_ADDRESS=127.0.0.1
export ERL_FLAGS="-kernel inet_dist_use_interface {127,0,0,1}"
EOF
  chown -R rabbitmq:rabbitmq "$BASE"
  echo "starting $NODE: amqps 127.0.0.1:$AMQPS_PORT, amqp 127.0.0.1:$AMQP_PORT (distribution $DIST_PORT)"
  (
    cd "$dir"
    as_rabbitmq env \
      HOME="$RABBIT_HOME" \
      RABBITMQ_NODENAME="$NODE" \
      RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
      RABBITMQ_NODE_PORT="$AMQP_PORT" \
      RABBITMQ_DIST_PORT="$DIST_PORT" \
      RABBITMQ_CONF_ENV_FILE="$dir/rabbitmq-env.conf" \
      RABBITMQ_CONFIG_FILE="$dir/rabbitmq" \
      RABBITMQ_ADVANCED_CONFIG_FILE="$dir/advanced.config" \
      RABBITMQ_MNESIA_BASE="$dir/mnesia" \
      RABBITMQ_LOG_BASE="$dir/log" \
      RABBITMQ_PID_FILE="$dir/pid" \
      RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins" \
      "$SERVER" -detached >"$dir/startup.log" 2>&1
  ) || die "rabbitmq-server -detached failed for $NODE (see $dir/startup.log)"
  while ! ctl await_startup --timeout 10 >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$deadline" ] || die "$NODE did not start within ${TIMEOUT}s (logs in $dir/log)"
    sleep 1
  done
  until ss -ltn "( sport = :$AMQPS_PORT )" | grep -q LISTEN; do
    [ "$(date +%s)" -lt "$deadline" ] || die "$NODE runs but does not listen on $AMQPS_PORT (logs in $dir/log)"
    sleep 1
  done
  start_v1_server
  echo "$NODE up in $(($(date +%s) - start))s: amqps://guest:guest@127.0.0.1:$AMQPS_PORT/%2f," \
    "certificates in $c"
}

# The X.509 v1 certificate's TLS endpoint (a handshake is all the drill asks of it).
start_v1_server() {
  local c="$BASE/certs" deadline=$(($(date +%s) + 30))
  setsid openssl s_server -accept "127.0.0.1:$V1_PORT" -cert "$c/v1.pem" -key "$c/v1.key" \
    -quiet </dev/null >"$BASE/v1-server.log" 2>&1 &
  echo $! >"$BASE/v1-server.pid"
  until ss -ltn "( sport = :$V1_PORT )" | grep -q LISTEN; do
    [ "$(date +%s)" -lt "$deadline" ] || die "openssl s_server did not listen on $V1_PORT (see $BASE/v1-server.log)"
    sleep 0.2
  done
}

cmd_stop() {
  local dir="$BASE/node" pid
  if [ -f "$BASE/v1-server.pid" ]; then
    pid="$(cat "$BASE/v1-server.pid" 2>/dev/null || true)"
    if [ -n "$pid" ] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "s_server -accept 127.0.0.1:$V1_PORT"; then
      kill "$pid" 2>/dev/null || true
    fi
  fi
  if node_up; then
    echo "stopping $NODE"
    if [ -f "$dir/pid" ]; then
      ctl stop "$dir/pid" >/dev/null 2>&1 || true
    else
      ctl stop >/dev/null 2>&1 || true
    fi
  fi
  # A node that would not stop: end its own process (by the pid it wrote), nothing else.
  if [ -f "$dir/pid" ]; then
    pid="$(cat "$dir/pid" 2>/dev/null || true)"
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null &&
      tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$NODE"; then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 30); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 1
      done
      kill -9 "$pid" 2>/dev/null || true
    fi
  fi
  rm -rf "$BASE"
  echo "$NODE stopped"
}

case "${1:-}" in
start) cmd_start ;;
stop) cmd_stop ;;
status)
  if node_up; then echo "$NODE running"; else
    echo "$NODE not running"
    exit 1
  fi
  ;;
*)
  echo "usage: scripts/tls-node.sh start|stop|status" >&2
  exit 2
  ;;
esac
