#!/usr/bin/env bash
# Runs the whole test suite: unit tests, then integration tests that start real
# PostgreSQL servers and Tessera clusters in temporary directories.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo test --no-fail-fast -- --test-threads="${TEST_THREADS:-2}" "$@"
