#!/usr/bin/env bash
# Runs the whole test suite: unit tests, then integration tests that start real
# PostgreSQL servers and Tessera clusters in temporary directories. Ends with one
# line totalling every test binary's results.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/setup-clients.sh  # the client matrix's libraries (tests/clients.rs)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo test --profile suite --no-fail-fast -- --test-threads="${TEST_THREADS:-2}" "$@" 2>&1 | tee "$log" || status=$?
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "%d passed, %d failed\n", p, f }' "$log"
exit "$status"
