#!/usr/bin/env bash
# The AceMQ test command: `scripts/test.sh [extra cargo test args]`
#
#   1. scripts/services.sh   ensure RabbitMQ, PostgreSQL, MariaDB are up
#   2. cargo fmt --check
#   3. cargo clippy (all targets, all features, warnings are errors)
#   4. cargo test --workspace --all-features [extra args]
#   5. cargo run -p acemq --example quickstart, on memory:// and on RabbitMQ (ACEMQ_URL)
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

step "cargo test --workspace --all-features $*"
cargo test --workspace --all-features "$@"

# The README's first command must work: the quickstart on memory://, then on the broker.
step "cargo run -p acemq --example quickstart (memory://)"
env -u ACEMQ_URL cargo run -q -p acemq --example quickstart

step "cargo run -p acemq --example quickstart (RabbitMQ at ACEMQ_TEST_AMQP_URL)"
ACEMQ_URL="$ACEMQ_TEST_AMQP_URL" cargo run -q -p acemq --example quickstart

step "all checks passed"
