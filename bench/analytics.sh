#!/usr/bin/env bash
# Analytical queries across shards: Tessera against a plain PostgreSQL 15
# server holding the same pgbench data, measured in the same run.
#
# Queries (each run RUNS times per target after one warm-up run; the median
# wall time counts):
#   aggregates   SELECT count(*), sum(abalance), avg(aid) FROM pgbench_accounts
#   group_by     SELECT bid, count(*) FROM pgbench_accounts GROUP BY bid ORDER BY bid
#   top10        SELECT aid, bid, abalance FROM pgbench_accounts ORDER BY abalance DESC, aid DESC LIMIT 10
#   join         SELECT count(*) FROM pgbench_accounts a JOIN pgbench_tellers t ON a.bid = t.bid
#   exists       SELECT count(*) FROM pgbench_accounts a WHERE EXISTS (SELECT 1 FROM
#                pgbench_history h WHERE h.aid = a.aid AND h.delta > 0)
#
# pgbench_accounts is distributed by aid and pgbench_tellers by tid (32 shards,
# 2 workers), so the join is not co-located: Tessera runs it in its general
# fallback. pgbench_history (filled with one row for every tenth account
# before the queries) is co-located with the accounts, and the EXISTS is
# joined to them on aid. The plan of each query through Tessera is logged
# (EXPLAIN).
#
# Environment: SCALE=10 (pgbench -i -s), RUNS=7, BENCH_LOG_DIR, TESSERA_BIN,
# PG_BIN, TESSERA_START_TIMEOUT — as for bench/pgbench.sh. POOL_SIZE=N sets
# citus.max_adaptive_executor_pool_size for Tessera's session (connections per
# worker one read runs its shard statements on; default: the coordinator's).
# Quick smoke run from the repo root:  SCALE=1 RUNS=3 bench/analytics.sh
set -euo pipefail

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd -- "$SCRIPT_DIR/.." && pwd)

SCALE=${SCALE:-10}
RUNS=${RUNS:-7}
BENCH_ONLY_PLAIN=0
TESSERA_BIN=${TESSERA_BIN:-$REPO_ROOT/target/release/tessera}
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
TESSERA_START_TIMEOUT=${TESSERA_START_TIMEOUT:-180}

# shellcheck source=bench/lib.sh
source "$SCRIPT_DIR/lib.sh"

if ! is_uint "$SCALE" || [[ $SCALE -eq 0 ]]; then die "SCALE must be a positive integer (got '$SCALE')"; fi
if ! is_uint "$RUNS" || [[ $RUNS -eq 0 ]]; then die "RUNS must be a positive integer (got '$RUNS')"; fi

QUERIES=(aggregates group_by top10 join exists)
declare -A SQL=(
    [aggregates]="SELECT count(*), sum(abalance), avg(aid) FROM pgbench_accounts"
    [group_by]="SELECT bid, count(*) FROM pgbench_accounts GROUP BY bid ORDER BY bid"
    [top10]="SELECT aid, bid, abalance FROM pgbench_accounts ORDER BY abalance DESC, aid DESC LIMIT 10"
    [join]="SELECT count(*) FROM pgbench_accounts a JOIN pgbench_tellers t ON a.bid = t.bid"
    [exists]="SELECT count(*) FROM pgbench_accounts a WHERE EXISTS (SELECT 1 FROM pgbench_history h WHERE h.aid = a.aid AND h.delta > 0)"
)
# One history row for every tenth account, half of them with a positive delta.
HISTORY_SQL="INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) SELECT 1, 1, aid, CASE WHEN aid % 20 = 0 THEN 5 ELSE -5 END, now() FROM pgbench_accounts WHERE aid % 10 = 0"
POOL_SIZE=${POOL_SIZE:-}
if [[ -n $POOL_SIZE ]] && { ! is_uint "$POOL_SIZE" || [[ $POOL_SIZE -eq 0 ]]; }; then die "POOL_SIZE must be a positive integer (got '$POOL_SIZE')"; fi
declare -A MIN=() MEDIAN=() MAX=() ANSWER=()

# measure TARGET PORT QUERY: the fastest, median and slowest wall time (ms) of RUNS runs.
measure() {
    local target=$1 port=$2 name=$3 out times
    out=$BENCH_LOG_DIR/$target-$name.log
    {
        echo '\timing on'
        if [[ $target == tessera && -n $POOL_SIZE ]]; then echo "SET citus.max_adaptive_executor_pool_size = $POOL_SIZE;"; fi
        for ((i = 0; i <= RUNS; i++)); do echo "${SQL[$name]};"; done
    } | psql_at "$port" -At >"$out" 2>&1 || die "$target: $name failed" "$out"
    # The first run warms caches and connections; it does not count.
    times=$(sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' "$out" | tail -n +2 | sort -g)
    MIN[$target:$name]=$(head -n 1 <<<"$times")
    MAX[$target:$name]=$(tail -n 1 <<<"$times")
    MEDIAN[$target:$name]=$(awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }' <<<"$times")
    ANSWER[$target:$name]=$(grep -v '^Time:' "$out" | head -n 12 | md5sum | cut -c1-12)
    log "$target: $name: median ${MEDIAN[$target:$name]} ms over $RUNS runs"
}

start_plain
pgbench_init plain "$PLAIN_PORT"
psql_at "$PLAIN_PORT" -c "$HISTORY_SQL" >/dev/null
psql_at "$PLAIN_PORT" -c 'VACUUM ANALYZE' >/dev/null
for q in "${QUERIES[@]}"; do measure plain "$PLAIN_PORT" "$q"; done
stop_plain

start_tessera
pgbench_init tessera "$TESSERA_PORT"
distribute_pgbench_tables "$TESSERA_PORT"
psql_at "$TESSERA_PORT" -c "$HISTORY_SQL" >/dev/null
psql_at "$TESSERA_PORT" -c 'VACUUM ANALYZE pgbench_accounts, pgbench_tellers, pgbench_branches, pgbench_history' >/dev/null
for q in "${QUERIES[@]}"; do
    psql_at "$TESSERA_PORT" -c "EXPLAIN (COSTS OFF) ${SQL[$q]}" >"$BENCH_LOG_DIR/tessera-$q-plan.txt" 2>&1 || true
    measure tessera "$TESSERA_PORT" "$q"
done
stop_tessera

echo
printf 'Analytical queries, pgbench scale %s (32 shards, 2 workers), %s runs, citus.max_adaptive_executor_pool_size %s\n' "$SCALE" "$RUNS" "${POOL_SIZE:-default}"
printf '%-12s %14s %14s %20s %8s\n' query plain_ms tessera_ms ratio_min/med/max same
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
for q in "${QUERIES[@]}"; do
    p=${MEDIAN[plain:$q]} t=${MEDIAN[tessera:$q]}
    same=no
    [[ ${ANSWER[plain:$q]} == "${ANSWER[tessera:$q]}" ]] && same=yes
    ratios="$(ratio "${MIN[tessera:$q]}" "${MIN[plain:$q]}")/$(ratio "$t" "$p")/$(ratio "${MAX[tessera:$q]}" "${MAX[plain:$q]}")"
    printf '%-12s %14s %14s %20s %8s\n' "$q" "$p" "$t" "$ratios" "$same"
done
echo "(plain_ms, tessera_ms: medians. ratio = Tessera time / plain PostgreSQL time of the fastest, median and slowest runs; lower is better. same = identical answers. Raw outputs and plans: $BENCH_LOG_DIR)"
