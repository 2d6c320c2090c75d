#!/usr/bin/env bash
# Ensure the services the AceMQ test suite talks to are installed, running
# and reachable on loopback:
#
#   RabbitMQ    127.0.0.1:5672  guest/guest
#   PostgreSQL  127.0.0.1:5432  user postgres, no password; database test, role root
#   MariaDB     127.0.0.1:3306  user root, empty password; database test
#
# Idempotent, and quick when everything is already up. Debian/Ubuntu only
# (apt-get, pg_ctlcluster). As root it installs missing packages, starts
# stopped services and creates the database/role the tests need. Without root
# it only checks, and says exactly what to run when something is missing.
#
# Loopback auth (PostgreSQL trust, MariaDB root without password) is only
# changed when the server was installed by this run, when CI=true, or when
# ACEMQ_SERVICES_FIX_AUTH=1; otherwise the script prints the fix and fails.
#
# Environment:
#   ACEMQ_SERVICES_TIMEOUT  seconds to wait for each service to accept
#                           connections (default 90)
set -euo pipefail

export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

TIMEOUT="${ACEMQ_SERVICES_TIMEOUT:-90}"
IS_ROOT=0
[ "$(id -u)" -eq 0 ] && IS_ROOT=1

# Set per service to 1 when this run installed its package.
INSTALLED_RABBITMQ=0
INSTALLED_POSTGRES=0
INSTALLED_MARIADB=0

die() {
  echo "services.sh: error: $*" >&2
  exit 1
}

note() {
  echo "services.sh: $*" >&2
}

port_open() {
  # Cheap reachability test with bash's /dev/tcp; bounded so a filtered port
  # cannot hang us.
  timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null
}

have() {
  command -v "$1" >/dev/null 2>&1
}

# wait_until DESCRIPTION COMMAND...: poll COMMAND once a second until it
# succeeds or $TIMEOUT seconds have passed.
wait_until() {
  local what="$1"
  shift
  local start=$SECONDS
  until "$@" >/dev/null 2>&1; do
    if [ $((SECONDS - start)) -ge "$TIMEOUT" ]; then
      return 1
    fi
    sleep 1
  done
  note "$what accepting connections after $((SECONDS - start))s"
}

fix_auth_allowed() {
  # $1: 1 when this run installed the server.
  [ "$IS_ROOT" -eq 1 ] || return 1
  [ "$1" -eq 1 ] || [ "${CI:-}" = "true" ] || [ "${ACEMQ_SERVICES_FIX_AUTH:-}" = "1" ]
}

show_log_tail() {
  local f
  for f in "$@"; do
    if [ -r "$f" ]; then
      echo "---- last lines of $f ----" >&2
      tail -n 25 "$f" >&2 || true
    fi
  done
}

# ---------------------------------------------------------------------------
# Installation of missing servers (one apt-get update, one apt-get install).
# A server counts as missing only when its port is closed AND its binaries are
# absent, so services provided some other way are left alone.

rabbitmq_present() { [ -x /usr/sbin/rabbitmq-server ] && have rabbitmqctl; }
postgres_present() {
  have pg_ctlcluster && have pg_isready && have psql &&
    compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null
}
mariadb_present() { [ -x /usr/sbin/mariadbd ] && have mariadb-admin && have mariadb; }

missing=()
port_open 5672 || rabbitmq_present || missing+=(rabbitmq-server)
port_open 5432 || postgres_present || missing+=(postgresql)
port_open 3306 || mariadb_present || missing+=(mariadb-server)

if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$IS_ROOT" -ne 1 ]; then
    die "missing packages: ${missing[*]}
Install them with:
  sudo apt-get update && sudo apt-get install -y ${missing[*]}
then re-run this script (as root it installs and configures them itself)."
  fi
  have apt-get || die "missing ${missing[*]} and apt-get is not available; install them by hand"
  note "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt_log="$(mktemp)"
  if ! { apt-get update -q && apt-get install -y -q --no-install-recommends "${missing[@]}"; } \
    </dev/null >"$apt_log" 2>&1; then
    show_log_tail "$apt_log"
    rm -f "$apt_log"
    die "apt-get update / apt-get install ${missing[*]} failed"
  fi
  rm -f "$apt_log"
  for p in "${missing[@]}"; do
    case "$p" in
      rabbitmq-server) INSTALLED_RABBITMQ=1 ;;
      postgresql) INSTALLED_POSTGRES=1 ;;
      mariadb-server) INSTALLED_MARIADB=1 ;;
    esac
  done
fi

# ---------------------------------------------------------------------------
# RabbitMQ

ensure_rabbitmq() {
  local state="running"
  if ! port_open 5672; then
    [ "$IS_ROOT" -eq 1 ] || die "RabbitMQ is not listening on 127.0.0.1:5672. Start it with:
  sudo rabbitmq-server -detached && sudo rabbitmqctl await_startup"
    if timeout 30 rabbitmqctl -q status >/dev/null 2>&1; then
      # The Erlang node is up but the rabbit application is stopped
      # (e.g. after `rabbitmqctl stop_app`); rabbitmq-server would refuse to
      # start a second node with the same name.
      note "rabbitmq node is up but the application is stopped; running start_app"
      timeout 60 rabbitmqctl -q start_app >/dev/null || die "rabbitmqctl start_app failed"
    else
      # Node down: `rabbitmqctl status` failed. Start it detached; the
      # Debian wrapper switches to the rabbitmq user.
      (cd / && rabbitmq-server -detached </dev/null >/dev/null 2>&1) ||
        note "rabbitmq-server -detached returned non-zero; waiting anyway"
    fi
    # await_startup fails straight away while the node is not yet reachable,
    # so retry it (bounded by `timeout`) until the overall deadline.
    if ! wait_until rabbitmq rabbitmq_ready; then
      show_log_tail /var/log/rabbitmq/startup_err /var/log/rabbitmq/startup_log \
        /var/log/rabbitmq/rabbit@*.log
      die "RabbitMQ did not accept connections on 127.0.0.1:5672 within ${TIMEOUT}s.
If the log mentions the node name/hostname, check that \`hostname -s\` resolves (see /etc/hosts)
or set NODENAME=rabbit@localhost in /etc/rabbitmq/rabbitmq-env.conf."
    fi
    state="started"
  fi
  # The package's maintainer scripts may already have started it.
  [ "$INSTALLED_RABBITMQ" -eq 0 ] || state="installed and started"
  echo "rabbitmq: $state"
}

rabbitmq_ready() {
  timeout 15 rabbitmqctl -q await_startup --timeout 10 && port_open 5672
}

# The management HTTP API on 127.0.0.1:15672 (the `acemq` operator tool discovers
# dead-letter queues and checks bindings through it). Enabling a plugin is online and
# idempotent; it does not restart the broker.
ensure_rabbitmq_management() {
  if port_open 15672; then
    echo "rabbitmq management: running"
    return
  fi
  [ "$IS_ROOT" -eq 1 ] || die "RabbitMQ's management API is not listening on 127.0.0.1:15672. Enable it with:
  sudo rabbitmq-plugins enable rabbitmq_management"
  timeout 60 rabbitmq-plugins -q enable rabbitmq_management >/dev/null ||
    die "rabbitmq-plugins enable rabbitmq_management failed"
  wait_until "rabbitmq management" port_open 15672 ||
    die "the management API did not listen on 127.0.0.1:15672 within ${TIMEOUT}s"
  echo "rabbitmq management: enabled"
}

# ---------------------------------------------------------------------------
# PostgreSQL (Debian postgresql-common cluster layout)

PG_VER=""
PG_CLUSTER=""

pick_pg_cluster() {
  # Prefer the cluster configured for port 5432, else the newest one.
  local line
  line="$(pg_lsclusters -h 2>/dev/null | awk '$3 == 5432 { print $1, $2; exit }')"
  [ -n "$line" ] || line="$(pg_lsclusters -h 2>/dev/null | sort -V | awk 'END { if (NR) print $1, $2 }')"
  if [ -n "$line" ]; then
    read -r PG_VER PG_CLUSTER <<<"$line"
  fi
}

# psql over TCP exactly as the tests connect: user postgres, no password
# (ignore PGPASSWORD/.pgpass so a password cannot mask a missing trust rule).
pg_tcp() {
  env -u PGPASSWORD PGPASSFILE=/nonexistent/acemq-no-pgpass PGCONNECT_TIMEOUT=5 \
    psql -X -w -q -A -t -h 127.0.0.1 -p 5432 -U postgres -d postgres "$@"
}

ensure_postgres() {
  local state="running"
  if ! port_open 5432; then
    pick_pg_cluster
    if [ -z "$PG_VER" ]; then
      [ "$IS_ROOT" -eq 1 ] || die "no PostgreSQL cluster exists; create one with:
  sudo pg_createcluster --start \$(ls /usr/lib/postgresql | sort -V | tail -n1) main"
      PG_VER="$(find /usr/lib/postgresql -mindepth 1 -maxdepth 1 -printf '%f\n' | sort -V | tail -n1)"
      PG_CLUSTER=main
      note "no PostgreSQL cluster found; creating $PG_VER/$PG_CLUSTER"
      pg_createcluster "$PG_VER" "$PG_CLUSTER" >/dev/null || die "pg_createcluster failed"
    fi
    [ "$IS_ROOT" -eq 1 ] || die "PostgreSQL is not listening on 127.0.0.1:5432. Start it with:
  sudo pg_ctlcluster --skip-systemctl-redirect $PG_VER $PG_CLUSTER start"
    pg_ctlcluster --skip-systemctl-redirect "$PG_VER" "$PG_CLUSTER" start </dev/null >/dev/null 2>&1 ||
      note "pg_ctlcluster start returned non-zero; waiting anyway"
    if ! wait_until postgresql pg_isready -q -h 127.0.0.1 -p 5432 -t 2; then
      show_log_tail "/var/log/postgresql/postgresql-$PG_VER-$PG_CLUSTER.log"
      die "PostgreSQL did not accept connections on 127.0.0.1:5432 within ${TIMEOUT}s
(is it configured for port 5432 and listen_addresses including localhost?)"
    fi
    state="started"
  fi
  # The package's maintainer scripts may already have started it.
  [ "$INSTALLED_POSTGRES" -eq 0 ] || state="installed and started"

  if ! have psql; then
    echo "postgresql: $state (psql not installed; role/database not checked)"
    return
  fi

  # The tests connect as postgres over TCP without a password.
  if ! pg_tcp -c 'select 1' >/dev/null 2>&1; then
    [ -n "$PG_VER" ] || pick_pg_cluster
    local hba="/etc/postgresql/$PG_VER/$PG_CLUSTER/pg_hba.conf"
    local rule="host all all 127.0.0.1/32 trust"
    if fix_auth_allowed "$INSTALLED_POSTGRES" && [ -n "$PG_VER" ] && [ -f "$hba" ]; then
      if ! grep -q '^# acemq-test: loopback trust' "$hba"; then
        note "adding '$rule' at the top of $hba"
        sed -i "1i # acemq-test: loopback trust for the AceMQ test suite (scripts/services.sh)\n$rule" "$hba"
        pg_ctlcluster --skip-systemctl-redirect "$PG_VER" "$PG_CLUSTER" reload >/dev/null 2>&1 ||
          die "pg_ctlcluster reload failed"
        sleep 1
      fi
    fi
    if ! pg_tcp -c 'select 1' >/dev/null 2>&1; then
      local err
      err="$(pg_tcp -c 'select 1' 2>&1 || true)"
      die "cannot connect to PostgreSQL as postgres@127.0.0.1 without a password:
  $err
The tests need passwordless loopback access. Add this line at the top of
${hba:-pg_hba.conf} and reload (sudo pg_ctlcluster ${PG_VER:-VERSION} ${PG_CLUSTER:-main} reload):
  $rule
(or re-run this script as root with ACEMQ_SERVICES_FIX_AUTH=1 to do exactly that)."
    fi
  fi

  local counts has_role has_db
  counts="$(pg_tcp -F ' ' -c "select (select count(*) from pg_roles where rolname = 'root'),
                                     (select count(*) from pg_database where datname = 'test')")" ||
    die "PostgreSQL query failed"
  read -r has_role has_db <<<"$counts"
  if [ "$has_role" = "0" ]; then
    pg_tcp -c 'create role root login superuser' >/dev/null || die "could not create PostgreSQL role root"
    note "postgresql: created role root"
  fi
  if [ "$has_db" = "0" ]; then
    pg_tcp -c 'create database test owner root' >/dev/null || die "could not create PostgreSQL database test"
    note "postgresql: created database test"
  fi
  echo "postgresql: $state"
}

# ---------------------------------------------------------------------------
# MariaDB

# Client over TCP exactly as the tests connect: root, empty password, no
# option files (a ~/.my.cnf password must not mask the real situation).
my_tcp() {
  mariadb --no-defaults --connect-timeout=5 -h 127.0.0.1 -P 3306 -u root "$@"
}

ensure_mariadb() {
  local state="running"
  if ! port_open 3306; then
    [ "$IS_ROOT" -eq 1 ] || die "MariaDB is not listening on 127.0.0.1:3306. Start it with:
  sudo start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd"
    # /run is often a fresh tmpfs (containers, reboots): recreate the
    # socket/pid directory the Debian init script would normally create.
    if [ ! -d /run/mysqld ]; then
      install -d -m 0755 -o mysql -g mysql /run/mysqld
    fi
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd </dev/null >/dev/null ||
      die "start-stop-daemon could not start /usr/sbin/mariadbd"
    if ! wait_until mariadb mariadb_ready; then
      show_log_tail /var/log/mysql/error.log
      die "MariaDB did not accept connections on 127.0.0.1:3306 within ${TIMEOUT}s"
    fi
    state="started"
  fi
  # The package's maintainer scripts may already have started it.
  [ "$INSTALLED_MARIADB" -eq 0 ] || state="installed and started"

  if ! have mariadb; then
    echo "mariadb: $state (mariadb client not installed; database not checked)"
    return
  fi

  if ! my_tcp -e 'select 1' >/dev/null 2>&1; then
    # Fresh Debian installs authenticate root@localhost via unix_socket only.
    # As OS root we can get in over the socket and allow an empty password
    # from loopback, keeping unix_socket working.
    if fix_auth_allowed "$INSTALLED_MARIADB"; then
      note "allowing MariaDB root with an empty password on loopback"
      mariadb -u root <<'SQL' || die "could not adjust MariaDB root authentication (via the unix socket)"
ALTER USER 'root'@'localhost' IDENTIFIED VIA mysql_native_password USING PASSWORD('') OR unix_socket;
CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY '';
GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;
FLUSH PRIVILEGES;
SQL
    fi
    if ! my_tcp -e 'select 1' >/dev/null 2>&1; then
      local err
      err="$(my_tcp -e 'select 1' 2>&1 || true)"
      die "cannot connect to MariaDB as root@127.0.0.1 with an empty password:
  $err
The tests need it. As root, run:
  sudo mariadb -u root -e \"ALTER USER 'root'@'localhost' IDENTIFIED VIA mysql_native_password USING PASSWORD('') OR unix_socket; CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY ''; GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;\"
(or re-run this script as root with ACEMQ_SERVICES_FIX_AUTH=1 to do exactly that)."
    fi
  fi

  my_tcp -e 'CREATE DATABASE IF NOT EXISTS test' 2>/dev/null ||
    die "could not create MariaDB database test"
  echo "mariadb: $state"
}

mariadb_ready() {
  # `mariadb-admin ping` succeeds once the server answers, even if access is
  # denied; authentication is checked separately.
  port_open 3306 && mariadb-admin --no-defaults --connect-timeout=2 -h 127.0.0.1 -P 3306 -u root ping
}

ensure_rabbitmq
ensure_rabbitmq_management
ensure_postgres
ensure_mariadb
