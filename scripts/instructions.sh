#!/usr/bin/env bash
# Guards the per-message cost of memory://, and AceMQ's own work per request/reply round
# trip against RabbitMQ, with instruction counts (valgrind callgrind),
# which a noisy machine does not move: the same binary and input give about the same
# count, where a timing would swing by 2x.
#
# For each path it runs acemq-bench twice under callgrind, with N and 2N messages, and
# takes (I(2N) - I(N)) / N: the instructions one more message costs, with start-up and
# tear-down cancelled out. It fails when a path costs more than its budget, set at about
# twice the figure measured when the budget was last lowered (crates/acemq-bench/README.md,
# "Instructions per message"), so a 2x regression fails CI and noise does not.
#
#   scripts/instructions.sh            # build the bench (release) and check
#   ACEMQ_INSTRUCTIONS_BUILD=0 scripts/instructions.sh   # use the binary already built
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Budgets, in instructions per message (publish + consume) and per round trip.
MEMORY_BUDGET=64000
REQUEST_REPLY_BUDGET=140000
# Against RabbitMQ: AceMQ's own work per request/reply round trip, i.e. AceMQ's count less
# raw lapin's writing everything the wire contract asks (`--raw-contract`) on two
# connections: lapin's own work, which dominates both, and the contract's (ids, trace
# context, headers) cancel out. 13.5-28k when set (2026-12-07, afternoon).
BROKER_OWN_BUDGET=55000
# The broker for that check (the tests' variable); without one it is skipped, unless
# ACEMQ_TEST_REQUIRE_BROKER=1 (CI), where a missing broker fails.
URL="${ACEMQ_TEST_AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/%2f}"

if ! command -v valgrind >/dev/null; then
  echo "instructions.sh: valgrind is not installed (apt-get install valgrind)" >&2
  exit 1
fi
if [[ "${ACEMQ_INSTRUCTIONS_BUILD:-1}" == 1 ]]; then
  cargo build -q --release -p acemq-bench
fi
bench="${CARGO_TARGET_DIR:-target}/release/acemq-bench"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

# Instructions of one run: the `summary:` line callgrind writes at the end of its file.
count() {
  local scenario=$1 n=$2 file="$out/$1.$2"
  valgrind --tool=callgrind --callgrind-out-file="$file" "$bench" \
    --scenarios "$scenario" --memory-only --rounds 1 --messages "$n" >/dev/null 2>&1
  awk '/^summary:/ { print $2 }' "$file"
}

failed=0
check() {
  local scenario=$1 n=$2 budget=$3 what=$4
  local one two per
  one=$(count "$scenario" "$n")
  two=$(count "$scenario" $((2 * n)))
  per=$(((two - one) / n))
  printf 'instructions.sh: %-32s %8d instructions (budget %d; %d then %d in all)\n' \
    "$what" "$per" "$budget" "$one" "$two"
  if ((per > budget)); then
    echo "instructions.sh: $what costs $per instructions, over its budget of $budget: find what grew (callgrind_annotate, see crates/acemq-bench/README.md)" >&2
    failed=1
  fi
}

# Instructions of one side's RabbitMQ request/reply run (`--only`, so no memory:// row);
# empty when the bench found no broker (it then runs no broker row).
count_broker() {
  local n=$1 side=$2 file="$out/broker.$1.$2"
  shift 2
  valgrind --tool=callgrind --callgrind-out-file="$file" "$bench" --url "$URL" \
    --scenarios request-reply --rounds 1 --messages "$n" --only "$side" "$@" \
    >"$file.table" 2>/dev/null
  grep -q '| classic ' "$file.table" && awk '/^summary:/ { print $2 }' "$file"
}

# Per round trip, with start-up cancelled out as in `check`.
per_trip_broker() {
  local n=$1 one two
  one=$(count_broker "$n" "${@:2}") && two=$(count_broker $((2 * n)) "${@:2}") || return 1
  echo $(((two - one) / n))
}

check_broker() {
  local n=$1 budget=$2 what="RabbitMQ request/reply, own/trip" ace raw own
  if ! ace=$(per_trip_broker "$n" acemq) ||
    ! raw=$(per_trip_broker "$n" raw --raw-contract --raw-two-connections); then
    if [[ "${ACEMQ_TEST_REQUIRE_BROKER:-0}" == 1 ]]; then
      echo "instructions.sh: no broker at $URL, and ACEMQ_TEST_REQUIRE_BROKER=1" >&2
      failed=1
    else
      echo "instructions.sh: no broker at $URL: the RabbitMQ check is skipped"
    fi
    return
  fi
  own=$((ace - raw))
  printf 'instructions.sh: %-32s %8d instructions (budget %d; AceMQ %d, raw lapin writing the contract %d)\n' \
    "$what" "$own" "$budget" "$ace" "$raw"
  if ((own > budget)); then
    echo "instructions.sh: AceMQ's own work per RabbitMQ round trip is $own instructions, over its budget of $budget: profile both sides (--only acemq / --only raw --raw-contract --raw-two-connections, see crates/acemq-bench/README.md)" >&2
    failed=1
  fi
}

check memory 5000 "$MEMORY_BUDGET" "memory:// publish + consume, per msg"
check request-reply 1000 "$REQUEST_REPLY_BUDGET" "memory:// request/reply, per trip"
check_broker 1000 "$BROKER_OWN_BUDGET"
exit "$failed"
