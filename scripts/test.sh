#!/usr/bin/env bash
# The AceMQ test command: `scripts/test.sh [extra cargo test args]`
#
#   1. scripts/services.sh   ensure RabbitMQ, PostgreSQL, MariaDB are up
#   2. cargo fmt --check; scripts/check-layout.py (transport/ imports nothing above it, no
#      import circle across two top-level modules, no file over 600 lines without a reason)
#   3. cargo clippy (all targets, all features, warnings are errors), cargo doc (same); then
#      clippy on the other builds the crates promise: acemq memory-only
#      (--no-default-features --features testing, all targets) and acemq-sql with each
#      backend alone (postgres, mysql, sqlite); cargo package of the three published crates
#      (each builds from its own tarball)
#   4. cargo test --workspace --all-features [extra args], in parallel; the tests that
#      change global broker state and the drills are #[ignore]d, so they are not among
#      them; then acemq with its default features (unit and integration tests) and
#      memory-only (unit and integration tests on memory:// alone: that build has no
#      RabbitMQ transport)
#   5. cargo run -p acemq --example quickstart, on memory:// and on RabbitMQ (ACEMQ_URL);
#      the examples/ that need no services, on memory://; the operator console in headless
#      Chromium (Debian's chromium and chromium-driver, installed as root when missing);
#      scripts/instructions.sh: memory://'s instructions per message under callgrind
#      (valgrind, installed as root when missing) within their budgets
#   6. one at a time: the serial tests (`--ignored` in acemq's `serial` test binary), then
#      the recovery drills, which stop the broker, force-close connections and start a
#      local 3-node cluster (scripts/cluster.sh) and a TLS node (scripts/tls-node.sh); a
#      trap restores the broker and stops both whatever happens
#
# Stops at the first failure. Works from any directory. Extra arguments go to
# `cargo test`, e.g. `scripts/test.sh -- --nocapture`.
#
# Test environment (each left alone when the caller already set it):
#   ACEMQ_TEST_AMQP_URL       amqp://guest:guest@127.0.0.1:5672/%2f
#   ACEMQ_TEST_REQUIRE_BROKER 1
#   ACEMQ_TEST_POSTGRES_URL   postgres://postgres@127.0.0.1:5432/test
#   ACEMQ_TEST_MYSQL_URL      mysql://root@127.0.0.1:3306/test
#   ACEMQ_FAMILY_FIXTURES     <repo>/../shared/fixtures, only if it exists
#   ACEMQ_SKIP_DRILLS         1 skips step 6 outside CI (it needs root for rabbitmqctl)
set -euo pipefail

export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$ROOT"

step() {
  printf '\n==> %s\n' "$*"
}

if [ "${CI:-}" = "true" ]; then
  export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
  # A one-off build gains nothing from incremental state, which costs gigabytes.
  export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
fi

step "services"
scripts/services.sh

# A crashed test may have left the memory watermark at 0, which blocks every
# publisher. rabbitmqctl only works as root (or the rabbitmq user).
if [ "$(id -u)" -eq 0 ]; then
  rabbitmqctl -q set_vm_memory_high_watermark 0.4 >/dev/null ||
    { echo "test.sh: rabbitmqctl set_vm_memory_high_watermark 0.4 failed" >&2; exit 1; }
else
  echo "test.sh: not root; skipping 'rabbitmqctl set_vm_memory_high_watermark 0.4'" \
    "(run it with sudo if publishes hang on a memory alarm)" >&2
fi

export ACEMQ_TEST_AMQP_URL="${ACEMQ_TEST_AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/%2f}"
export ACEMQ_TEST_REQUIRE_BROKER="${ACEMQ_TEST_REQUIRE_BROKER:-1}"
export ACEMQ_TEST_POSTGRES_URL="${ACEMQ_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}"
export ACEMQ_TEST_MYSQL_URL="${ACEMQ_TEST_MYSQL_URL:-mysql://root@127.0.0.1:3306/test}"
if [ -z "${ACEMQ_FAMILY_FIXTURES:-}" ] && [ -d "$ROOT/../shared/fixtures" ]; then
  ACEMQ_FAMILY_FIXTURES="$(cd "$ROOT/../shared/fixtures" && pwd -P)"
  export ACEMQ_FAMILY_FIXTURES
fi

step "rust toolchain"
command -v cargo >/dev/null 2>&1 ||
  { echo "test.sh: cargo not found; install Rust with rustup (https://rustup.rs)" >&2; exit 1; }
for comp in fmt:rustfmt clippy:clippy; do
  sub="${comp%%:*}"
  pkg="${comp#*:}"
  if ! cargo "$sub" --version >/dev/null 2>&1; then
    command -v rustup >/dev/null 2>&1 ||
      { echo "test.sh: 'cargo $sub' is missing and rustup is not available; install $pkg" >&2; exit 1; }
    echo "installing $pkg"
    rustup component add "$pkg"
  fi
done
cargo --version
echo "ACEMQ_FAMILY_FIXTURES=${ACEMQ_FAMILY_FIXTURES:-<unset>}"

step "cargo fmt --all -- --check"
cargo fmt --all -- --check

step "scripts/check-layout.py"
python3 scripts/check-layout.py

step "cargo clippy --workspace --all-targets --all-features -- -D warnings"
cargo clippy --workspace --all-targets --all-features -- -D warnings

step "cargo doc --workspace --all-features --no-deps (warnings are errors)"
RUSTDOCFLAGS="${RUSTDOCFLAGS:-} -D warnings" cargo doc --workspace --all-features --no-deps

# The builds besides --all-features that the crates promise, each checked on its own: acemq
# without its default `amqp` feature (memory:// only, no lapin, no TLS stack), and each SQL
# backend of acemq-sql alone (its code for the other backends compiled out, not dead).
step "cargo clippy -p acemq --no-default-features --features testing --all-targets -- -D warnings"
cargo clippy -p acemq --no-default-features --features testing --all-targets -- -D warnings
for backend in postgres mysql sqlite; do
  step "cargo clippy -p acemq-sql --features $backend -- -D warnings"
  cargo clippy -p acemq-sql --features "$backend" -- -D warnings
done

# Each published crate builds from its own package, as crates.io and docs.rs get it (cargo
# packages the workspace members against each other). --allow-dirty: local runs too.
step "package"
cargo package --allow-dirty -p acemq -p acemq-sql -p acemq-cli

# The tests that change global broker state are #[ignore = "serial: ..."] (in acemq's
# `serial` test binary), as are the drills: a plain `cargo test` leaves both out, and step
# 6 runs them one at a time.
step "cargo test --workspace --all-features $*"
cargo test --workspace --all-features "$@"

# acemq as most users build it (default features): the unit and integration tests.
step "cargo test -p acemq --lib --test it (default features)"
cargo test -p acemq --lib --test it

# The memory-only build runs on memory:// alone: without the `amqp` feature there is no
# RabbitMQ transport to test (the tests' support says so at compile time; the broker is
# still required everywhere else). Its unit and
# integration tests; the doctests run in the --all-features step (some show RabbitMQ
# options).
step "cargo test -p acemq --no-default-features --features testing --lib --tests (memory:// only)"
cargo test -p acemq --no-default-features --features testing --lib --tests

# The README's first command must work: the quickstart on memory://, then on the broker.
step "cargo run -p acemq --example quickstart (memory://)"
env -u ACEMQ_URL cargo run -q -p acemq --example quickstart

step "cargo run -p acemq --example quickstart (RabbitMQ at ACEMQ_TEST_AMQP_URL)"
ACEMQ_URL="$ACEMQ_TEST_AMQP_URL" cargo run -q -p acemq --example quickstart

# The examples that need no services run on memory:// (the rest are built by cargo test).
for example in publish_202 custom_codec replay_dead_letters outbox_axum scheduled_reminder pipeline_orders saga_booking durable_saga; do
  step "cargo run -p acemq-examples --example $example (memory://)"
  env -u ACEMQ_URL cargo run -q -p acemq-examples --example "$example"
done

# The operator console in a real browser: acemq-cli's #[ignore]d browser test starts
# `acemq console` against the broker and drives headless Chromium over WebDriver
# (chromedriver). Screenshots: $CARGO_TARGET_DIR (else target/)/console-screenshots/.
step "console in headless Chromium (cargo test -p acemq-cli --test it -- --ignored console_browser)"
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "test.sh: chromium or chromedriver missing; run: sudo apt-get install -y chromium chromium-driver" >&2
    exit 1
  fi
  echo "installing chromium chromium-driver"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1 ||
    { apt-get update -qq >/dev/null && apt-get install -y -qq chromium chromium-driver >/dev/null; } ||
    { echo "test.sh: apt-get install chromium chromium-driver failed" >&2; exit 1; }
fi
cargo test -p acemq-cli --all-features --test it -- --ignored console_browser

# The per-message cost of memory:// publish + consume and of a request/reply round trip,
# and AceMQ's own work per RabbitMQ request/reply round trip (against raw lapin carrying
# the same headers), counted in instructions under callgrind (repeatable where timings are
# not): a 2x regression fails here. A release build of acemq-bench.
step "scripts/instructions.sh (instructions per message under callgrind)"
if ! command -v valgrind >/dev/null; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "test.sh: valgrind missing; run: sudo apt-get install -y valgrind" >&2
    exit 1
  fi
  echo "installing valgrind"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq valgrind >/dev/null 2>&1 ||
    { apt-get update -qq >/dev/null && apt-get install -y -qq valgrind >/dev/null; } ||
    { echo "test.sh: apt-get install valgrind failed" >&2; exit 1; }
fi
scripts/instructions.sh

# --- serial tests and drills: one at a time, after the parallel tests -------------------
# Put the broker back whatever happens: the app running, the watermark at 0.4, the local
# cluster and the TLS node gone. Only ever started/changed on the nodes the drills use.
restore_broker() {
  local rc=$?
  echo "test.sh: restoring the broker (start_app, watermark 0.4, cluster and TLS node stop)" >&2
  rabbitmqctl -q start_app >/dev/null 2>&1 || echo "test.sh: rabbitmqctl start_app failed" >&2
  rabbitmqctl -q await_startup --timeout 60 >/dev/null 2>&1 || true
  rabbitmqctl -q set_vm_memory_high_watermark 0.4 >/dev/null 2>&1 ||
    echo "test.sh: rabbitmqctl set_vm_memory_high_watermark 0.4 failed" >&2
  scripts/cluster.sh stop >/dev/null 2>&1 || echo "test.sh: scripts/cluster.sh stop failed" >&2
  scripts/tls-node.sh stop >/dev/null 2>&1 || echo "test.sh: scripts/tls-node.sh stop failed" >&2
  return "$rc"
}

# Runs every #[ignore]d drill of one package's `drills` test target, each in a process of
# its own, one at a time, and prints how long each took (kept in DRILL_TIMES for the
# summary). Stops the script at the first failing drill (set -e), where the trap restores
# the broker.
DRILL_TIMES=()
run_drills() {
  local pkg="$1" list name start took
  local -a names
  list="$(cargo test -q -p "$pkg" --all-features --test drills -- --ignored --list)"
  mapfile -t names < <(printf '%s\n' "$list" | sed -n 's/^\([A-Za-z0-9_:]*\): test$/\1/p')
  if [ "${#names[@]}" -eq 0 ]; then
    echo "test.sh: no drills found in $pkg (cargo test --test drills -- --ignored --list)" >&2
    exit 1
  fi
  for name in "${names[@]}"; do
    step "drill $pkg $name"
    start=$SECONDS
    cargo test -p "$pkg" --all-features --test drills -- \
      --ignored --exact "$name" --test-threads=1 --nocapture
    took=$((SECONDS - start))
    echo "drill timing: $pkg $name took ${took}s"
    DRILL_TIMES+=("$(printf '%5ss  %s %s' "$took" "$pkg" "$name")")
  done
}

if [ "${ACEMQ_SKIP_DRILLS:-}" = 1 ] && [ "${CI:-}" != "true" ]; then
  echo "test.sh: ACEMQ_SKIP_DRILLS=1; the serial tests and drills did not run" >&2
elif [ "$(id -u)" -ne 0 ] && [ "$(id -un)" != rabbitmq ]; then
  if [ "${CI:-}" = "true" ]; then
    echo "test.sh: the drills need rabbitmqctl, which needs root or the rabbitmq user" >&2
    exit 1
  fi
  echo "test.sh: not root; the serial tests and drills did not run (run with sudo)" >&2
else
  trap restore_broker EXIT
  trap 'exit 130' INT TERM

  # Every test of the `serial` binary is #[ignore = "serial: ..."]; an empty list means
  # they were not built (or lost their mark), which must not pass as "nothing failed".
  step "serial: tests that change global broker state, one at a time"
  serial_list="$(cargo test -q -p acemq --all-features --test serial -- --ignored --list)"
  if ! printf '%s\n' "$serial_list" | grep -q ': test$'; then
    echo "test.sh: no serial tests listed (cargo test --test serial -- --ignored --list)" >&2
    exit 1
  fi
  cargo test -p acemq --all-features --test serial -- --ignored --test-threads=1

  drills_start=$SECONDS
  step "drills: local 3-node cluster (scripts/cluster.sh start)"
  scripts/cluster.sh start
  DRILL_TIMES+=("$(printf '%5ss  %s' $((SECONDS - drills_start)) "scripts/cluster.sh start")")

  # The TLS drill's node (its own name and ports, certificates generated into a temp dir).
  step "drills: TLS node (scripts/tls-node.sh start)"
  tls_start=$SECONDS
  scripts/tls-node.sh start
  DRILL_TIMES+=("$(printf '%5ss  %s' $((SECONDS - tls_start)) "scripts/tls-node.sh start")")

  # acemq: forced closes, stop_app/start_app, a network cut, a deleted queue, cluster
  # failover, TLS (mutual, forced closes, refusals); acemq-sql: the outbox relay across a
  # broker restart.
  run_drills acemq
  run_drills acemq-sql

  step "drill timings"
  printf '%s\n' "${DRILL_TIMES[@]}"
  echo "drills took $((SECONDS - drills_start))s in all"
fi

step "all checks passed"
