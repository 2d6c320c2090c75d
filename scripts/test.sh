#!/usr/bin/env bash
# The AceMQ test command: `scripts/test.sh [extra cargo test args]`
#
#   1. scripts/services.sh   ensure RabbitMQ, PostgreSQL, MariaDB are up
#   2. cargo fmt --check
#   3. cargo clippy (all targets, all features, warnings are errors), cargo doc (same)
#   4. cargo test --workspace --all-features [extra args], in parallel, without the tests
#      that change global broker state
#   5. cargo run -p acemq --example quickstart, on memory:// and on RabbitMQ (ACEMQ_URL);
#      the examples/ that need no services, on memory://
#   6. one at a time: those tests, then the recovery drills (issue 10), which stop the
#      broker, force-close connections and start a local 3-node cluster
#      (scripts/cluster.sh) and a TLS node (scripts/tls-node.sh); a trap restores the
#      broker and stops both whatever happens
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
#   ACEMQ_SKIP_DRILLS         1 skips step 5 outside CI (it needs root for rabbitmqctl)
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

step "cargo clippy --workspace --all-targets --all-features -- -D warnings"
cargo clippy --workspace --all-targets --all-features -- -D warnings

step "cargo doc --workspace --all-features --no-deps (warnings are errors)"
RUSTDOCFLAGS="${RUSTDOCFLAGS:-} -D warnings" cargo doc --workspace --all-features --no-deps

# Tests that change global broker state (a memory alarm blocks every publisher) run in the
# serial step below, not beside the others: every test of these targets is skipped in the
# parallel step by its exact name (`--exact`: a plain `--skip` matches by substring and
# once skipped two unrelated tests whose names contain a serial test's name).
SERIAL_TESTS=(amqp_blocked blocked_health amqp_blocked_moves)
SERIAL_SKIP=(--exact)
for t in "${SERIAL_TESTS[@]}"; do
  names="$(cargo test -q -p acemq --all-features --test "$t" -- --list 2>/dev/null |
    sed -n 's/^\([A-Za-z0-9_:]*\): test$/\1/p')"
  [ -n "$names" ] || { echo "test.sh: no tests listed in the serial target $t" >&2; exit 1; }
  while read -r name; do SERIAL_SKIP+=(--skip "$name"); done <<<"$names"
done
case " $* " in
*" -- "*) test_args=("$@" "${SERIAL_SKIP[@]}") ;;
*) test_args=("$@" -- "${SERIAL_SKIP[@]}") ;;
esac

step "cargo test --workspace --all-features ${test_args[*]}"
cargo test --workspace --all-features "${test_args[@]}"

# The README's first command must work: the quickstart on memory://, then on the broker.
step "cargo run -p acemq --example quickstart (memory://)"
env -u ACEMQ_URL cargo run -q -p acemq --example quickstart

step "cargo run -p acemq --example quickstart (RabbitMQ at ACEMQ_TEST_AMQP_URL)"
ACEMQ_URL="$ACEMQ_TEST_AMQP_URL" cargo run -q -p acemq --example quickstart

# The examples that need no services run on memory:// (the rest are built by cargo test).
for example in publish_202 custom_codec replay_dead_letters outbox_axum; do
  step "cargo run -p acemq-examples --example $example (memory://)"
  env -u ACEMQ_URL cargo run -q -p acemq-examples --example "$example"
done

# --- drills: one at a time, after the parallel tests (issue 10) -------------------------
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

  serial=()
  for t in "${SERIAL_TESTS[@]}"; do serial+=(--test "$t"); done
  step "serial: tests that change global broker state, one at a time"
  cargo test -p acemq --all-features "${serial[@]}" -- --test-threads=1

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
