#!/usr/bin/env bash
# Installs what building, running and testing Tessera needs and the machine
# lacks: PostgreSQL 15 (server, contrib, client tools incl. pgbench, the hll and
# tdigest extensions for approximate aggregates), libclang for
# the pg_query parser bindings, sysbench for the benchmarks, SQLsmith for the
# random-query corpus tests, iptables for the network-partition test
# (tests/failover.rs), and Chromium and Python's Prometheus parser for the
# dashboard and /metrics test (tests/monitoring.rs). Idempotent.
set -euo pipefail

packages=(postgresql-15 postgresql-contrib postgresql-client-15 postgresql-15-hll postgresql-15-tdigest libclang-dev clang pkg-config sysbench sqlsmith iptables chromium python3-prometheus-client)
missing=()
for p in "${packages[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done

if ((${#missing[@]})); then
    echo "installing: ${missing[*]}"
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null || { echo "need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
        sudo="sudo"
    fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Debian's package starts a default cluster on 5432; Tessera runs its own servers.
if command -v pg_lsclusters >/dev/null && pg_lsclusters -h 2>/dev/null | grep -q '^15 *main .* online'; then
    if [ "$(id -u)" -eq 0 ]; then pg_ctlcluster 15 main stop || true; fi
fi

command -v cargo >/dev/null || { echo "Rust (cargo) is required: https://rustup.rs" >&2; exit 1; }
