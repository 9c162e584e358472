#!/usr/bin/env bash
# TPROC-C: TPC-C's five transactions as PL/pgSQL functions (bench/tprocc/),
# driven by our own Go driver with no think time, on the same data:
#   plain_call     plain PostgreSQL 15, each transaction one function call
#   tessera_call   Tessera, the functions distributed by warehouse and delegated
#                  (a call's writes to another warehouse go through the link
#                  relay and commit with it)
#   tessera_sql    Tessera, the same statements sent one by one by the driver
# The three alternate (plain, Tessera calls, Tessera statements, …) for
# $ROUNDS rounds; each round warms up, then measures. After every run the
# TPC-C consistency conditions are checked (bench/tprocc/check.sql) on that
# target. Reported: NOPM (new orders per minute) and TPM (transactions per
# minute), median per target, and the ratios' min/median/max over the rounds.
#
# Environment:
#   WAREHOUSES=10   warehouses (about 85 MB of CSV each)
#   VUS=8           virtual users (each with a home warehouse)
#   WARMUP=10       seconds before each measured run
#   DURATION=60     measured seconds per run
#   ROUNDS=3        rounds
#   SHARDS=32       shards of the warehouse co-location group
#   GO_TPC=1        also run go-tpc (github.com/pingcap/go-tpc v1.0.9) against both,
#                   once, before the rounds: prepare, run for $DURATION s, check
#                   (reported; GOTPC_CHECK_TIMEOUT=300 s at most)
#   GOTPC_WAREHOUSES=4  its warehouses
#   BENCH_LOG_DIR, TESSERA_BIN, PG_BIN, TESSERA_START_TIMEOUT as for bench/pgbench.sh
#
# Quick smoke run from the repo root:  WAREHOUSES=2 VUS=4 WARMUP=2 DURATION=10 ROUNDS=1 bench/tprocc.sh
set -euo pipefail

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd -- "$SCRIPT_DIR/.." && pwd)
WAREHOUSES=${WAREHOUSES:-10}
VUS=${VUS:-8}
WARMUP=${WARMUP:-10}
DURATION=${DURATION:-60}
ROUNDS=${ROUNDS:-3}
SHARDS=${SHARDS:-32}
GO_TPC=${GO_TPC:-0}

# shellcheck source=bench/lib.sh
source "$SCRIPT_DIR/lib.sh"
require_positive WAREHOUSES VUS DURATION ROUNDS SHARDS
is_uint "$WARMUP" || die "WARMUP must be a number of seconds (got '$WARMUP')"
command -v go >/dev/null || die "the TPROC-C driver needs Go"

KIT=$SCRIPT_DIR/tprocc
DRIVER=$BENCH_LOG_DIR/tprocc
TABLES=(warehouse district customer history orders new_order order_line item stock)

log "building the driver"
(cd "$KIT/driver" && go build -o "$DRIVER" .) >"$BENCH_LOG_DIR/driver-build.log" 2>&1 ||
    die "go build of bench/tprocc/driver failed" "$BENCH_LOG_DIR/driver-build.log"

DATA=$(mktemp -d "${TMPDIR:-/tmp}/tessera-tprocc-data.XXXXXX")
trap 'rc=$?; rm -rf -- "$DATA"; (exit $rc); cleanup' EXIT
log "generating $WAREHOUSES warehouses into $DATA"
"$DRIVER" gen -dir "$DATA" -warehouses "$WAREHOUSES"
chmod -R a+rX -- "$DATA"

# load_plain PORT / load_tessera PORT: schema, rows, functions.
load_plain() {
    local out=$BENCH_LOG_DIR/plain-load.log t
    log "plain: schema, COPY, functions"
    {
        psql_at "$1" -f "$KIT/schema.sql"
        for t in "${TABLES[@]}"; do psql_at "$1" -c "\\copy $t FROM '$DATA/$t.csv' WITH (FORMAT csv)"; done
        psql_at "$1" -f "$KIT/procedures.sql"
        psql_at "$1" -c 'VACUUM ANALYZE'
    } >"$out" 2>&1 || die "plain: loading failed" "$out"
}

load_tessera() {
    local out=$BENCH_LOG_DIR/tessera-load.log t
    log "tessera: schema, create_distributed_table, tessera load, functions"
    {
        psql_at "$1" -f "$KIT/schema.sql"
        psql_at "$1" -v shards="$SHARDS" -f "$KIT/distribute.sql"
        for t in "${TABLES[@]}"; do
            "$TESSERA_BIN" load "$DATA/$t.csv" --table "$t" --port "$1" --jobs 2 --config "$TESSERA_DIR/tessera.toml"
        done
        psql_at "$1" -f "$KIT/procedures.sql"
        psql_at "$1" -f "$KIT/delegate.sql"
        psql_at "$1" -c 'VACUUM ANALYZE'
    } >"$out" 2>&1 || die "tessera: loading failed" "$out"
}

declare -A NOPM=() TPM=()

# measure TARGET PORT MODE: one warm-up and measured run, then the check.
measure() {
    local target=$1 port=$2 out=$BENCH_LOG_DIR/$1-round$ROUND.log line
    "$DRIVER" run -url "postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable" -warehouses "$WAREHOUSES" \
        -vus "$VUS" -warmup "${WARMUP}s" -duration "${DURATION}s" -mode "$3" >"$out" 2>&1 ||
        die "$target: the driver failed" "$out"
    line=$(grep '^nopm=' "$out") || die "$target: no result line" "$out"
    NOPM[$target:$ROUND]=$(sed 's/.*nopm=\([0-9]*\).*/\1/' <<<"$line")
    TPM[$target:$ROUND]=$(sed 's/.*tpm=\([0-9]*\).*/\1/' <<<"$line")
    log "$target round $ROUND: $line"
    if [[ $line != *" failed=0" ]]; then
        log "$target: some transactions failed: $(grep '^error:' "$out" | head -n 3 | tr '\n' ' ')"
    fi
    check "$target" "$port"
}

check() { # check TARGET PORT: the TPC-C consistency conditions hold
    local out=$BENCH_LOG_DIR/$1-check-round$ROUND.log
    psql_at "$2" -At -f "$KIT/check.sql" >"$out" 2>&1 || die "$1: the consistency check failed to run" "$out"
    [[ ! -s $out ]] || die "$1: TPC-C consistency conditions broken" "$out"
}

start_plain
load_plain "$PLAIN_PORT"
start_tessera
load_tessera "$TESSERA_PORT"

# go-tpc, an outside driver: `tpcc prepare`, `run` and `check` in the schema
# gotpc of each target (its tables have our kit's names). Its plain SQL is
# sent statement by statement, so Tessera routes every statement. On Tessera
# its tables are made first from the DDL go-tpc gave the plain server, then
# distributed by warehouse (item a reference table), before it loads them.
declare -A GOTPC_TPMC=() GOTPC_CHECK=()
GOTPC_CHECK_TIMEOUT=${GOTPC_CHECK_TIMEOUT:-300}
gotpc() { # gotpc PORT COMMAND [args...]
    local port=$1; shift
    "$GOTPC" tpcc -d postgres -H 127.0.0.1 -P "$port" -U postgres -D postgres \
        --conn-params 'sslmode=disable&search_path=gotpc' --warehouses "$GOTPC_WAREHOUSES" -T "$VUS" "$@"
}
run_gotpc() { # run_gotpc TARGET PORT
    local out=$BENCH_LOG_DIR/$1-gotpc.log
    {
        gotpc "$2" prepare --no-check
        gotpc "$2" run --time "${DURATION}s"
    } >"$out" 2>&1 || die "$1: go-tpc failed" "$out"
    GOTPC_TPMC[$1]=$(sed -n 's/.*tpmC: \([0-9.]*\).*/\1/p' "$out" | tail -n 1)
    # Its check is reported, not fatal: some of its queries need the
    # general fallback on Tessera (see docs/sql-reference.md, Known limits).
    if timeout "$GOTPC_CHECK_TIMEOUT" "$GOTPC" tpcc -d postgres -H 127.0.0.1 -P "$2" -U postgres -D postgres \
        --conn-params 'sslmode=disable&search_path=gotpc' --warehouses "$GOTPC_WAREHOUSES" -T 1 check >"$BENCH_LOG_DIR/$1-gotpc-check.log" 2>&1 &&
        ! grep -q 'check failed' "$BENCH_LOG_DIR/$1-gotpc-check.log"; then
        GOTPC_CHECK[$1]=passed
    else
        GOTPC_CHECK[$1]="FAILED ($(grep -m1 -o 'at condition [0-9.]* failed' "$BENCH_LOG_DIR/$1-gotpc-check.log" || echo "timeout after ${GOTPC_CHECK_TIMEOUT}s"); $1-gotpc-check.log)"
    fi
    log "$1: go-tpc tpmC ${GOTPC_TPMC[$1]}, check ${GOTPC_CHECK[$1]}"
}
if [[ $GO_TPC == 1 ]]; then
    GOTPC_WAREHOUSES=${GOTPC_WAREHOUSES:-4}
    log "building go-tpc v1.0.9"
    GOBIN=$BENCH_LOG_DIR go install github.com/pingcap/go-tpc/cmd/go-tpc@v1.0.9 >"$BENCH_LOG_DIR/gotpc-build.log" 2>&1 ||
        die "go install of go-tpc failed" "$BENCH_LOG_DIR/gotpc-build.log"
    GOTPC=$BENCH_LOG_DIR/go-tpc
    psql_at "$PLAIN_PORT" -c 'CREATE SCHEMA gotpc'
    run_gotpc plain "$PLAIN_PORT"
    out=$BENCH_LOG_DIR/tessera-gotpc-schema.log
    {
        psql_at "$TESSERA_PORT" -c 'CREATE SCHEMA gotpc'
        "$PG_BIN/pg_dump" -h 127.0.0.1 -p "$PLAIN_PORT" -U postgres -s -n gotpc postgres |
            grep -v '^CREATE SCHEMA\|^ALTER SCHEMA\|^CREATE INDEX' | psql_at "$TESSERA_PORT"
        psql_at "$TESSERA_PORT" -v shards="$SHARDS" -c 'SET search_path = gotpc' -f "$KIT/distribute.sql"
    } >"$out" 2>&1 || die "tessera: go-tpc's tables could not be made" "$out"
    run_gotpc tessera "$TESSERA_PORT"
fi

TARGETS=(plain_call tessera_call tessera_sql)
for ((ROUND = 1; ROUND <= ROUNDS; ROUND++)); do
    measure plain_call "$PLAIN_PORT" call
    measure tessera_call "$TESSERA_PORT" call
    measure tessera_sql "$TESSERA_PORT" sql
done

# ratio_stats A B: min/median/max over the rounds of NOPM[A]/NOPM[B].
ratio_stats() {
    local r
    for ((r = 1; r <= ROUNDS; r++)); do
        awk -v a="${NOPM[$1:$r]}" -v b="${NOPM[$2:$r]}" 'BEGIN { if (b > 0) printf "%.2f\n", a / b }'
    done | sort -g | awk '{ v[NR] = $1 } END { if (NR) printf "%s/%s/%s", v[1], (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2, v[NR] }'
}

echo
printf 'TPROC-C, %s warehouses, %s virtual users, %ss measured after %ss, %s rounds\n' "$WAREHOUSES" "$VUS" "$DURATION" "$WARMUP" "$ROUNDS"
printf '%-14s %12s %12s\n' target NOPM TPM
for t in "${TARGETS[@]}"; do
    printf '%-14s %12s %12s\n' "$t" \
        "$(for ((r = 1; r <= ROUNDS; r++)); do echo "${NOPM[$t:$r]}"; done | median)" \
        "$(for ((r = 1; r <= ROUNDS; r++)); do echo "${TPM[$t:$r]}"; done | median)"
done
echo "NOPM ratios (min/median/max): tessera_call/tessera_sql $(ratio_stats tessera_call tessera_sql), tessera_call/plain_call $(ratio_stats tessera_call plain_call)"
if [[ $GO_TPC == 1 ]]; then
    echo "go-tpc v1.0.9, $GOTPC_WAREHOUSES warehouses, $VUS threads, ${DURATION}s: tpmC plain ${GOTPC_TPMC[plain]}, tessera ${GOTPC_TPMC[tessera]} ($(awk -v a="${GOTPC_TPMC[tessera]}" -v b="${GOTPC_TPMC[plain]}" 'BEGIN { printf "%.2f", a / b }')x); check: plain ${GOTPC_CHECK[plain]}, tessera ${GOTPC_CHECK[tessera]}"
fi
echo "(medians; TPC-C consistency conditions held after every run. Raw outputs: $BENCH_LOG_DIR)"
