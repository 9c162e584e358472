#!/usr/bin/env bash
# Benchmark Tessera against a plain PostgreSQL 15 server on the same machine.
#
# Both targets run side by side; each workload alternates between them (plain,
# Tessera, plain, Tessera, …) for $ROUNDS rounds, so that drift of the machine
# hits both, and the report gives the median TPS and the ratio's min, median
# and max over the rounds. Workloads:
#   pgbench_select_only   pgbench -S -M prepared -c 8 -j 2 -T $DURATION -n
#   pgbench_tpcb          pgbench    -M prepared -c 8 -j 2 -T $DURATION -n
#   pgbench_select_only_c100, pgbench_select_only_c1000, pgbench_tpcb_c100,
#   pgbench_tpcb_c1000    the same with 100 or 1000 clients (plain PostgreSQL
#                         gets max_connections = 1100 for them; Tessera pools
#                         its node connections)
#   pgbench_select_only_unix, pgbench_tpcb_unix
#                         the 8-client runs over Unix-domain sockets (the
#                         coordinator's in /tmp) instead of loopback TCP
#   sysbench_oltp_insert  sysbench oltp_insert (pgsql driver), 1 table of 10000 rows, 8 threads
#   insert_1row           pgbench -f: one-row INSERT into ins (k int, v text), a random key
#   insert_9rows_1shard   pgbench -f: nine rows with one random key (one shard)
#   insert_9rows_9shards  pgbench -f: nine rows whose keys are on nine different shards
#                         (both workers, so Tessera commits with two-phase commit)
#   insert_9rows_9shards_1pc  the same with citus.multi_shard_commit_protocol = '1pc'
#                         (a start-up option; plain PostgreSQL just keeps it as a placeholder)
# ins is distributed by k over 32 shards on Tessera; the nine keys are picked on
# the plain server with satisfies_hash_partition, which is the shard hash.
#
# Environment:
#   DURATION=30         seconds per measured run
#   ROUNDS=3            measured runs per workload and target, alternating
#   ONLY=a,b            run only these workloads (names as above)
#   SCALE=10            pgbench scale factor (pgbench -i -s)
#   BENCH_LOG_DIR=DIR   where raw tool outputs go (default: a new temp dir, kept)
#   BENCH_ONLY_PLAIN=1  measure only plain PostgreSQL (skip Tessera)
#   TESSERA_BIN=PATH    coordinator binary (default: <repo>/target/release/tessera)
#   PG_BIN=DIR          PostgreSQL 15 binaries (default: /usr/lib/postgresql/15/bin)
#   TESSERA_START_TIMEOUT=180  seconds to wait for the cluster to accept connections
#
# Quick smoke run from the repo root:  DURATION=5 SCALE=1 bench/pgbench.sh
set -euo pipefail

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd -- "$SCRIPT_DIR/.." && pwd)

DURATION=${DURATION:-30}
ROUNDS=${ROUNDS:-3}
ONLY=${ONLY:-}
SCALE=${SCALE:-10}
BENCH_ONLY_PLAIN=${BENCH_ONLY_PLAIN:-0}
TESSERA_BIN=${TESSERA_BIN:-$REPO_ROOT/target/release/tessera}
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
TESSERA_START_TIMEOUT=${TESSERA_START_TIMEOUT:-180}
CLIENTS=8
JOBS=2
SB_TABLE_SIZE=10000
SB_THREADS=8
WORKLOADS=(pgbench_select_only pgbench_tpcb pgbench_select_only_c100 pgbench_select_only_c1000 pgbench_tpcb_c100 pgbench_tpcb_c1000 pgbench_select_only_unix pgbench_tpcb_unix
    sysbench_oltp_insert insert_1row insert_9rows_1shard insert_9rows_9shards insert_9rows_9shards_1pc)
if [[ -n $ONLY ]]; then
    IFS=, read -r -a only <<<"$ONLY"
    for w in "${only[@]}"; do [[ " ${WORKLOADS[*]} " == *" $w "* ]] || die "ONLY: unknown workload '$w'"; done
    WORKLOADS=("${only[@]}")
fi
# The round being measured; results are kept per target, workload and round.
ROUND=1

# shellcheck source=bench/lib.sh
source "$SCRIPT_DIR/lib.sh"
# A thousand clients need a thousand sockets in pgbench (and in the coordinator).
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

declare -A TPS=() LAT=() COORD_US=() SERVER_US=() NODE_US=() STATUS=()

# ---------------------------------------------------------------- checks

if ! is_uint "$DURATION" || [[ $DURATION -eq 0 ]]; then die "DURATION must be a positive integer (got '$DURATION')"; fi
if ! is_uint "$SCALE" || [[ $SCALE -eq 0 ]]; then die "SCALE must be a positive integer (got '$SCALE')"; fi
if ! is_uint "$ROUNDS" || [[ $ROUNDS -eq 0 ]]; then die "ROUNDS must be a positive integer (got '$ROUNDS')"; fi
HAVE_SYSBENCH=0
if command -v sysbench >/dev/null 2>&1; then HAVE_SYSBENCH=1; fi

# ---------------------------------------------------------------- workloads

run_pgbench() {
    local target=$1 port=$2 name=$3; shift 3
    local out=$BENCH_LOG_DIR/$target-$name-$ROUND.log t0 t1 s0 s1 n0 n1 tps lat txns key=$target:$name:$ROUND
    log "$target: $name (round $ROUND): pgbench ${*:+$* }-M prepared -c $CLIENTS -j $JOBS -T $DURATION -n"
    t0=$(coord_ticks) n0=$(node_ticks "$target") s0=$(sum_ticks "$n0")
    "$PG_BIN/pgbench" -h "${HOST:-127.0.0.1}" -p "$port" -U postgres "$@" -M prepared -c "$CLIENTS" -j "$JOBS" -T "$DURATION" -n postgres >"$out" 2>&1 ||
        die "$target: pgbench ($name) failed" "$out"
    # pgbench's backends are still exiting: a backend read in /proc that the
    # postmaster reaps before its own line is read counts twice (or, the
    # other way round, not at all), seconds of CPU either way.
    sleep 1
    t1=$(coord_ticks) n1=$(node_ticks "$target") s1=$(sum_ticks "$n1")
    tps=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time).*/\1/p' "$out" | head -n 1)
    lat=$(sed -n 's/^latency average = \([0-9.]*\) ms.*/\1/p' "$out" | head -n 1)
    txns=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$out" | head -n 1)
    [[ -n $tps && -n $lat && -n $txns ]] || die "$target: could not parse pgbench ($name) output" "$out"
    [[ $txns -gt 0 ]] || die "$target: pgbench ($name) processed no transactions" "$out"
    record "$key" "$tps" "$lat" "$(us_per_txn "$t0" "$t1" "$txns")" "$txns" "$(us_per_txn "$s0" "$s1" "$txns")" "$(node_us_per_txn "$n0" "$n1" "$txns")"
}

# record TARGET:WORKLOAD:ROUND TPS LATENCY COORD_US TXNS [SERVER_US [NODE_US]]
# (coordinator CPU counts for Tessera only: the coordinator idles while plain
# PostgreSQL is measured; SERVER_US is every server process of the target,
# NODE_US the same per server, "name=µs …").
record() {
    TPS[$1]=$2
    LAT[$1]=$3
    if [[ $1 == tessera:* ]]; then COORD_US[$1]=$4; fi
    if [[ -n ${6:-} ]]; then SERVER_US[$1]=$6; fi
    if [[ -n ${7:-} ]]; then NODE_US[$1]=$7; fi
    STATUS[$1]=ok
    log "$1: tps=$2 latency_ms=$3 txns=$5${COORD_US[$1]:+ coord_us_per_txn=${COORD_US[$1]}}${SERVER_US[$1]:+ server_us_per_txn=${SERVER_US[$1]}}${NODE_US[$1]:+ by_server_us_per_txn=\"${NODE_US[$1]}\"}"
}

# run_sysbench TARGET PORT: returns non-zero (with a message) on failure.
run_sysbench() {
    local target=$1 port=$2 name=sysbench_oltp_insert
    local pre=$BENCH_LOG_DIR/$target-$name-$ROUND-prepare.log
    local out=$BENCH_LOG_DIR/$target-$name-$ROUND.log
    local cln=$BENCH_LOG_DIR/$target-$name-$ROUND-cleanup.log
    local -a sb=(sysbench oltp_insert --db-driver=pgsql --pgsql-host=127.0.0.1 --pgsql-port="$port"
        --pgsql-user=postgres --pgsql-db=postgres --tables=1 --table-size="$SB_TABLE_SIZE"
        --threads="$SB_THREADS" --time="$DURATION")
    local t0 t1 tps lat txns
    log "$target: $name: prepare"
    if ! "${sb[@]}" prepare >"$pre" 2>&1; then
        SB_ERR="sysbench prepare failed (see $pre)"; SB_ERR_LOG=$pre; return 1
    fi
    if [[ $target == tessera ]]; then
        log "$target: $name: create_distributed_table('sbtest1','id')"
        if ! psql_at "$port" -c "SELECT create_distributed_table('sbtest1','id')" >>"$pre" 2>&1; then
            SB_ERR="create_distributed_table('sbtest1','id') failed (see $pre)"; SB_ERR_LOG=$pre; return 1
        fi
    fi
    log "$target: $name: run (--threads=$SB_THREADS --time=$DURATION)"
    t0=$(coord_ticks)
    if ! "${sb[@]}" run >"$out" 2>&1; then
        SB_ERR="sysbench run failed (see $out)"; SB_ERR_LOG=$out; return 1
    fi
    t1=$(coord_ticks)
    log "$target: $name: cleanup"
    "${sb[@]}" cleanup >"$cln" 2>&1 || printf 'warning: %s: sysbench cleanup failed (see %s)\n' "$target" "$cln" >&2
    tps=$(sed -n 's/^ *transactions: *[0-9]* *(\([0-9.]*\) per sec\.).*/\1/p' "$out" | head -n 1)
    txns=$(sed -n 's/^ *transactions: *\([0-9]*\) .*/\1/p' "$out" | head -n 1)
    lat=$(awk '/^Latency \(ms\):/ { f = 1 } f && $1 == "avg:" { print $2; exit }' "$out")
    if [[ -z $tps || -z $lat || -z $txns ]]; then
        SB_ERR="could not parse the sysbench output (see $out)"; SB_ERR_LOG=$out; return 1
    fi
    if [[ $txns -eq 0 ]]; then
        SB_ERR="sysbench processed no transactions (see $out)"; SB_ERR_LOG=$out; return 1
    fi
    record "$target:$name:$ROUND" "$tps" "$lat" "$(us_per_txn "$t0" "$t1" "$txns")" "$txns"
}

sysbench_part() { # sysbench_part TARGET PORT
    local target=$1 port=$2
    if [[ $HAVE_SYSBENCH -ne 1 ]]; then
        STATUS[$target:sysbench_oltp_insert:$ROUND]=skipped
        return 0
    fi
    SB_ERR='' SB_ERR_LOG=''
    if run_sysbench "$target" "$port"; then return 0; fi
    if [[ $target == plain ]]; then
        die "plain: sysbench_oltp_insert: $SB_ERR" "$SB_ERR_LOG"
    fi
    STATUS[$target:sysbench_oltp_insert:$ROUND]=failed
    printf '%s: sysbench_oltp_insert FAILED: %s\n' "$target" "$SB_ERR" >&2
    if [[ -n $SB_ERR_LOG && -f $SB_ERR_LOG ]]; then
        grep -iE 'error|fatal' -- "$SB_ERR_LOG" | head -n 5 >&2 || tail -n 5 -- "$SB_ERR_LOG" >&2 || true
    fi
    psql_at "$port" -c 'DROP TABLE IF EXISTS sbtest1' >/dev/null 2>&1 || true
    return 0
}

# ---------------------------------------------------------------- main

log "Tessera benchmark: SCALE=$SCALE DURATION=${DURATION}s clients=$CLIENTS threads=$JOBS cpus=$(nproc)"
log "raw outputs: $BENCH_LOG_DIR"
if [[ $HAVE_SYSBENCH -ne 1 ]]; then
    log "sysbench is not installed (apt-get install sysbench): skipping sysbench_oltp_insert"
fi
if [[ $BENCH_ONLY_PLAIN == 1 ]]; then
    log "BENCH_ONLY_PLAIN=1: skipping Tessera"
fi

# Nine keys that the shard hash puts on nine different shards of 32: the
# remainders of PostgreSQL's hash partitioning, which Tessera's shards follow.
nine_shard_keys() { # nine_shard_keys PORT
    psql_at "$1" -At -c "CREATE TEMP TABLE key_hash (k int) PARTITION BY HASH (k)" -c "
        SELECT string_agg(k::text, ' ' ORDER BY r) FROM (
            SELECT DISTINCT ON (r) r, k FROM generate_series(1, 1000) k, generate_series(0, 31) r
            WHERE satisfies_hash_partition('key_hash'::regclass, 32, r, k) ORDER BY r, k
        ) first_key WHERE r < 9"
}

# insert_scripts PORT: writes the pgbench scripts of the insert workloads.
insert_scripts() {
    local nine=() k values=''
    read -r -a nine <<<"$(nine_shard_keys "$1")"
    [[ ${#nine[@]} -eq 9 ]] || die "could not pick nine keys on different shards (got '${nine[*]}')"
    printf '\\set k random(1, 10000000)\nINSERT INTO ins (k, v) VALUES (:k, %s);\n' "'x'" >"$BENCH_LOG_DIR/insert_1row.sql"
    printf '\\set k random(1, 10000000)\nINSERT INTO ins (k, v) VALUES %s;\n' "$(printf "(:k, 'x'), %.0s" 1 2 3 4 5 6 7 8)(:k, 'x')" >"$BENCH_LOG_DIR/insert_9rows_1shard.sql"
    for k in "${nine[@]}"; do values+="${values:+, }($k, 'x')"; done
    printf 'INSERT INTO ins (k, v) VALUES %s;\n' "$values" >"$BENCH_LOG_DIR/insert_9rows_9shards.sql"
    log "nine keys on nine shards: ${nine[*]}"
}

# Both targets are set up first and stay up; only one is measured at a time.
start_plain
pgbench_init plain "$PLAIN_PORT"
insert_scripts "$PLAIN_PORT"
psql_at "$PLAIN_PORT" -c "CREATE TABLE ins (k int, v text)" >/dev/null || die "plain: CREATE TABLE ins failed"
TARGETS=(plain)
if [[ $BENCH_ONLY_PLAIN != 1 ]]; then
    start_tessera
    pgbench_init tessera "$TESSERA_PORT"
    distribute_pgbench_tables "$TESSERA_PORT"
    psql_at "$TESSERA_PORT" -c "CREATE TABLE ins (k int, v text)" -c "SELECT create_distributed_table('ins', 'k', shard_count => 32)" >/dev/null ||
        die "tessera: distributing ins failed"
    TARGETS+=(tessera)
fi

run_workload() { # run_workload TARGET WORKLOAD
    local port=$PLAIN_PORT socket_dir=$PLAIN_SOCKET_DIR
    if [[ $1 == tessera ]]; then port=$TESSERA_PORT; socket_dir=/tmp; fi
    case $2 in
        pgbench_select_only_unix) HOST=$socket_dir run_pgbench "$1" "$port" "$2" -S ;;
        pgbench_tpcb_unix) HOST=$socket_dir run_pgbench "$1" "$port" "$2" ;;
        pgbench_select_only) run_pgbench "$1" "$port" "$2" -S ;;
        pgbench_tpcb) run_pgbench "$1" "$port" "$2" ;;
        pgbench_select_only_c*) CLIENTS=${2##*_c} run_pgbench "$1" "$port" "$2" -S ;;
        pgbench_tpcb_c*) CLIENTS=${2##*_c} run_pgbench "$1" "$port" "$2" ;;
        sysbench_oltp_insert) sysbench_part "$1" "$port" ;;
        insert_9rows_9shards_1pc) PGOPTIONS='-c citus.multi_shard_commit_protocol=1pc' run_pgbench "$1" "$port" "$2" -f "$BENCH_LOG_DIR/insert_9rows_9shards.sql" ;;
        insert_*) run_pgbench "$1" "$port" "$2" -f "$BENCH_LOG_DIR/$2.sql" ;;
    esac
}

for ((ROUND = 1; ROUND <= ROUNDS; ROUND++)); do
    for w in "${WORKLOADS[@]}"; do
        for target in "${TARGETS[@]}"; do run_workload "$target" "$w"; done
    done
done
stop_tessera
stop_plain

# ---------------------------------------------------------------- report

fmt1() { awk -v x="$1" 'BEGIN { printf "%.1f", x }'; }

# each KIND TARGET WORKLOAD: the value of every round that ran (tps, lat, coord, server).
each() {
    local r key
    for ((r = 1; r <= ROUNDS; r++)); do
        key=$2:$3:$r
        [[ ${STATUS[$key]:-} == ok ]] || continue
        case $1 in
            tps) echo "${TPS[$key]}" ;;
            lat) echo "${LAT[$key]}" ;;
            coord) if [[ -n ${COORD_US[$key]:-} ]]; then echo "${COORD_US[$key]}"; fi ;;
            server) if [[ -n ${SERVER_US[$key]:-} ]]; then echo "${SERVER_US[$key]}"; fi ;;
        esac
    done
}

# ratios WORKLOAD: Tessera's TPS over plain's, round by round.
ratios() {
    local r
    for ((r = 1; r <= ROUNDS; r++)); do
        if [[ ${STATUS[plain:$1:$r]:-} == ok && ${STATUS[tessera:$1:$r]:-} == ok ]]; then
            awk -v p="${TPS[plain:$1:$r]}" -v t="${TPS[tessera:$1:$r]}" 'BEGIN { if (p > 0) printf "%.4f\n", t / p }'
        fi
    done
}

# status TARGET WORKLOAD: ok when every round ran, else why not.
status() {
    local r worst=ok st
    for ((r = 1; r <= ROUNDS; r++)); do
        st=${STATUS[$1:$2:$r]:-missing}
        case $st in
            failed) worst=FAILED ;;
            skipped) [[ $worst == ok ]] && worst=skipped ;;
            missing) [[ $worst == ok ]] && worst=- ;;
        esac
    done
    echo "$worst"
}

# cell TARGET WORKLOAD tps|lat|coord: the median over the rounds, or why there is none.
cell() {
    local st v
    st=$(status "$1" "$2")
    if [[ $st != ok ]]; then echo "$st"; return; fi
    v=$(each "$3" "$1" "$2" | median)
    if [[ -z $v ]]; then echo NA; elif [[ $3 == tps ]]; then fmt1 "$v"; else echo "$v"; fi
}

# by_server TARGET WORKLOAD: "name=µs …", each server's median over the rounds.
by_server() {
    local r key pair name names="" out=""
    local -A values=()
    for ((r = 1; r <= ROUNDS; r++)); do
        key=$1:$2:$r
        [[ ${STATUS[$key]:-} == ok ]] || continue
        for pair in ${NODE_US[$key]:-}; do
            name=${pair%%=*}
            values[$name]+="${pair#*=}"$'\n'
            [[ " $names " == *" $name "* ]] || names+=" $name"
        done
    done
    for name in $names; do
        out+="${out:+ }$name=$(printf '%s' "${values[$name]}" | median)"
    done
    echo "${out:-NA}"
}

spread() { # spread WORKLOAD: the ratio's min/median/max
    local values
    values=$(ratios "$1")
    if [[ -z $values ]]; then echo NA; return; fi
    printf '%.2f/%.2f/%.2f' "$(sort -g <<<"$values" | head -n 1)" "$(median <<<"$values")" "$(sort -g <<<"$values" | tail -n 1)"
}

echo
echo "Results (SCALE=$SCALE, DURATION=${DURATION}s, $CLIENTS clients unless the name says _c<clients>, $ROUNDS alternating rounds; medians over the rounds;"
echo "latency = average ms; ratio = tessera TPS / plain TPS per round, min/median/max)"
fmt='%-24s | %10s | %16s | %11s | %18s | %14s | %22s | %s\n'
# shellcheck disable=SC2059
printf "$fmt" workload "plain TPS" "plain latency ms" "tessera TPS" "tessera latency ms" "ratio" "coordinator CPU µs/txn" "server CPU µs/txn plain/tessera"
# shellcheck disable=SC2059
printf "$fmt" "------------------------" "----------" "----------------" "-----------" "------------------" "--------------" "----------------------" "-------------------------------"
for w in "${WORKLOADS[@]}"; do
    # shellcheck disable=SC2059
    printf "$fmt" "$w" "$(cell plain "$w" tps)" "$(cell plain "$w" lat)" \
        "$(cell tessera "$w" tps)" "$(cell tessera "$w" lat)" "$(spread "$w")" "$(cell tessera "$w" coord)" "$(cell plain "$w" server)/$(cell tessera "$w" server)"
done
echo "(server CPU: every server process of the target — Tessera's coordinator, coordinator database and workers — summed, per transaction)"
echo
echo "Tessera's CPU µs/txn by server (median over the rounds):"
for w in "${WORKLOADS[@]}"; do
    echo "  $w: $(by_server tessera "$w")"
done
echo
for w in "${WORKLOADS[@]}"; do
    echo "RESULT $w plain_tps=$(cell plain "$w" tps) tessera_tps=$(cell tessera "$w" tps) ratio_min_median_max=$(spread "$w") coord_us_per_txn=$(cell tessera "$w" coord) server_us_per_txn_plain=$(cell plain "$w" server) server_us_per_txn_tessera=$(cell tessera "$w" server) tessera_us_per_txn_by_server=\"$(by_server tessera "$w")\""
done
echo
log "raw outputs: $BENCH_LOG_DIR"
