#!/usr/bin/env bash
# Analytical queries across shards: Tessera against a plain PostgreSQL 15
# server holding the same pgbench data, measured in the same run.
#
# Queries (RUNS runs of each per target and round, after one warm-up run;
# the median wall time of a round counts):
#   aggregates   SELECT count(*), sum(abalance), avg(aid) FROM pgbench_accounts
#   group_by     SELECT bid, count(*) FROM pgbench_accounts GROUP BY bid ORDER BY bid
#   top10        SELECT aid, bid, abalance FROM pgbench_accounts ORDER BY abalance DESC, aid DESC LIMIT 10
#   join         SELECT count(*) FROM pgbench_accounts a JOIN pgbench_tellers t ON a.bid = t.bid
#   exists       SELECT count(*) FROM pgbench_accounts a WHERE EXISTS (SELECT 1 FROM
#                pgbench_history h WHERE h.aid = a.aid AND h.delta > 0)
#   in_other     SELECT count(*) FROM pgbench_accounts WHERE bid IN (SELECT bid FROM
#                pgbench_tellers WHERE tid <= 30)
#   cte_top      WITH top AS (SELECT bid FROM pgbench_tellers GROUP BY bid ORDER BY
#                count(*) DESC, bid LIMIT 3) SELECT count(*) FROM pgbench_accounts JOIN top USING (bid)
#   distinct     SELECT count(DISTINCT bid) FROM pgbench_accounts
#   window_key   SELECT aid, abalance, rank() OVER (PARTITION BY aid ORDER BY abalance)
#                FROM pgbench_accounts ORDER BY abalance DESC, aid DESC LIMIT 10
#   window_other SELECT bid, aid, rank() OVER (PARTITION BY bid ORDER BY aid DESC) AS r
#                FROM pgbench_accounts ORDER BY r, bid LIMIT 10
#   percentile   SELECT bid, percentile_cont(0.5) WITHIN GROUP (ORDER BY aid) FROM
#                pgbench_accounts GROUP BY bid ORDER BY bid
#   rollup       SELECT bid, count(*), sum(abalance) FROM pgbench_accounts GROUP BY
#                ROLLUP (bid) ORDER BY bid
#   distinct_two SELECT count(DISTINCT bid), count(DISTINCT aid % 1000) FROM pgbench_accounts
#   stddev       SELECT bid, round(stddev(abalance::float8 + aid)::numeric, 6), var_pop(aid) FROM pgbench_accounts
#                GROUP BY bid ORDER BY bid
#   join_other   SELECT count(*), sum(o.amount) FROM bench_orders o JOIN pgbench_accounts a
#                ON a.aid = o.aid WHERE a.bid % 2 = 0
#   distinct_many SELECT count(DISTINCT aid) FROM bench_orders
#   distinct_estimate the same count, estimated: Tessera runs it after SET
#                citus.count_distinct_error_rate = 0.005, plain PostgreSQL the
#                HyperLogLog that setting makes of it, written out:
#                SELECT COALESCE(hll_cardinality(hll_add_agg(hll_hash_any(aid), 15))::int8, 0)
#                FROM bench_orders (the same estimate on both)
#
# pgbench_accounts is distributed by aid and pgbench_tellers by tid (32 shards,
# 2 workers), so the join is not co-located: Tessera sends the (small) tellers
# to every shard. The IN subquery and the WITH query over the tellers are
# computed first, each as a statement of its own, and the rest runs on the
# shards. window_other, percentile and distinct_two have no per-shard partial
# form: the shards send the columns they read and the coordinator database
# computes the rest; rollup runs in two phases (groups per shard, then the
# sets). bench_orders (40,000 rows per scale unit, distributed by its own id,
# not co-located) joins the accounts on aid: too many rows to broadcast, so
# its rows move to the accounts' shards by the hash of aid (a repartition
# join). distinct_many counts the accounts that ordered (a value in most
# shards of the orders, which are not distributed by it): its rows move
# node to node by aid, and each node counts its own.
# pgbench_history (filled with one row for every tenth account before the
# queries) is co-located with the accounts, and the EXISTS is joined to them
# on aid. The plan of each query through Tessera is logged (EXPLAIN).
#
# Both servers run side by side and the targets alternate (plain, Tessera,
# plain, …) query by query for ROUNDS rounds, so that drift of the machine
# falls on both; ratios are per round, reported as min/median/max.
#
# Environment: SCALE=10 (pgbench -i -s), ROUNDS=3, RUNS=3, BENCH_LOG_DIR,
# TESSERA_BIN, PG_BIN, TESSERA_START_TIMEOUT — as for bench/pgbench.sh.
# POOL_SIZE=N sets citus.max_adaptive_executor_pool_size for Tessera's session
# (connections per worker one read runs its shard statements on; default: the
# coordinator's). ONLY="percentile rollup" runs just those queries.
# ORDERS_PER_SCALE=40000 sets bench_orders' rows per scale unit (the
# accounts have 100,000): SCALE=50 ORDERS_PER_SCALE=100000 joins two tables
# of 5 million rows in join_other. Quick smoke
# run from the repo root:
#   SCALE=1 ROUNDS=1 RUNS=1 bench/analytics.sh
set -euo pipefail

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd -- "$SCRIPT_DIR/.." && pwd)

SCALE=${SCALE:-10}
ORDERS_PER_SCALE=${ORDERS_PER_SCALE:-40000}
RUNS=${RUNS:-3}
ROUNDS=${ROUNDS:-3}
BENCH_ONLY_PLAIN=0
TESSERA_BIN=${TESSERA_BIN:-$REPO_ROOT/target/release/tessera}
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
TESSERA_START_TIMEOUT=${TESSERA_START_TIMEOUT:-180}

# shellcheck source=bench/lib.sh
source "$SCRIPT_DIR/lib.sh"

if ! is_uint "$SCALE" || [[ $SCALE -eq 0 ]]; then die "SCALE must be a positive integer (got '$SCALE')"; fi
require_positive ORDERS_PER_SCALE
if ! is_uint "$RUNS" || [[ $RUNS -eq 0 ]]; then die "RUNS must be a positive integer (got '$RUNS')"; fi
if ! is_uint "$ROUNDS" || [[ $ROUNDS -eq 0 ]]; then die "ROUNDS must be a positive integer (got '$ROUNDS')"; fi

ALL_QUERIES=(aggregates group_by top10 join exists in_other cte_top distinct window_key window_other percentile rollup distinct_two stddev join_other distinct_many distinct_estimate)
read -r -a QUERIES <<<"${ONLY:-${ALL_QUERIES[*]}}"

declare -A SQL=(
    [aggregates]="SELECT count(*), sum(abalance), avg(aid) FROM pgbench_accounts"
    [group_by]="SELECT bid, count(*) FROM pgbench_accounts GROUP BY bid ORDER BY bid"
    [top10]="SELECT aid, bid, abalance FROM pgbench_accounts ORDER BY abalance DESC, aid DESC LIMIT 10"
    [join]="SELECT count(*) FROM pgbench_accounts a JOIN pgbench_tellers t ON a.bid = t.bid"
    [exists]="SELECT count(*) FROM pgbench_accounts a WHERE EXISTS (SELECT 1 FROM pgbench_history h WHERE h.aid = a.aid AND h.delta > 0)"
    [in_other]="SELECT count(*) FROM pgbench_accounts WHERE bid IN (SELECT bid FROM pgbench_tellers WHERE tid <= 30)"
    [distinct]="SELECT count(DISTINCT bid) FROM pgbench_accounts"
    [cte_top]="WITH top AS (SELECT bid FROM pgbench_tellers GROUP BY bid ORDER BY count(*) DESC, bid LIMIT 3) SELECT count(*) FROM pgbench_accounts JOIN top USING (bid)"
    [window_key]="SELECT aid, abalance, rank() OVER (PARTITION BY aid ORDER BY abalance) FROM pgbench_accounts ORDER BY abalance DESC, aid DESC LIMIT 10"
    [window_other]="SELECT bid, aid, rank() OVER (PARTITION BY bid ORDER BY aid DESC) AS r FROM pgbench_accounts ORDER BY r, bid LIMIT 10"
    [percentile]="SELECT bid, percentile_cont(0.5) WITHIN GROUP (ORDER BY aid) FROM pgbench_accounts GROUP BY bid ORDER BY bid"
    [rollup]="SELECT bid, count(*), sum(abalance) FROM pgbench_accounts GROUP BY ROLLUP (bid) ORDER BY bid"
    [distinct_two]="SELECT count(DISTINCT bid), count(DISTINCT aid % 1000) FROM pgbench_accounts"
    [distinct_many]="SELECT count(DISTINCT aid) FROM bench_orders"
    [stddev]="SELECT bid, round(stddev(abalance::float8 + aid)::numeric, 6), var_pop(aid) FROM pgbench_accounts GROUP BY bid ORDER BY bid"
    [join_other]="SELECT count(*), sum(o.amount) FROM bench_orders o JOIN pgbench_accounts a ON a.aid = o.aid WHERE a.bid % 2 = 0"
    [distinct_estimate]="SELECT COALESCE(hll_cardinality(hll_add_agg(hll_hash_any(aid), 15))::int8, 0) FROM bench_orders"
)
# Where Tessera runs other SQL than plain PostgreSQL, and the session setting it runs under.
declare -A TESSERA_SQL=(
    [distinct_estimate]="SELECT count(DISTINCT aid) FROM bench_orders"
)
declare -A TESSERA_SETTING=(
    [distinct_estimate]="SET citus.count_distinct_error_rate = 0.005"
)
# Orders of random accounts, ORDERS_PER_SCALE per scale unit.
ORDERS_SQL="CREATE TABLE bench_orders (id int PRIMARY KEY, aid int, amount int); INSERT INTO bench_orders SELECT g, (1 + (g::int8 * 7919) % ($SCALE * 100000))::int, g % 1000 FROM generate_series(1, $SCALE * $ORDERS_PER_SCALE) g"
# One history row for every tenth account, half of them with a positive delta.
HISTORY_SQL="INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) SELECT 1, 1, aid, CASE WHEN aid % 20 = 0 THEN 5 ELSE -5 END, now() FROM pgbench_accounts WHERE aid % 10 = 0"
POOL_SIZE=${POOL_SIZE:-}
if [[ -n $POOL_SIZE ]] && { ! is_uint "$POOL_SIZE" || [[ $POOL_SIZE -eq 0 ]]; }; then die "POOL_SIZE must be a positive integer (got '$POOL_SIZE')"; fi
declare -A MEDIAN=() ANSWER=()

# tessera_sql QUERY: what Tessera runs for QUERY.
tessera_sql() {
    echo "${TESSERA_SQL[$1]:-${SQL[$1]}}"
}

# measure TARGET PORT QUERY: the median wall time (ms) of RUNS runs, for round $ROUND.
measure() {
    local target=$1 port=$2 name=$3 out times sql=${SQL[$3]}
    out=$BENCH_LOG_DIR/$target-$name-round$ROUND.log
    if [[ $target == tessera ]]; then sql=$(tessera_sql "$name"); fi
    {
        if [[ $target == tessera && -n $POOL_SIZE ]]; then echo "SET citus.max_adaptive_executor_pool_size = $POOL_SIZE;"; fi
        if [[ $target == tessera && -n ${TESSERA_SETTING[$name]:-} ]]; then echo "${TESSERA_SETTING[$name]};"; fi
        echo '\timing on'
        for ((i = 0; i <= RUNS; i++)); do echo "$sql;"; done
    } | psql_at "$port" -At >"$out" 2>&1 || die "$target: $name failed" "$out"
    # The first run warms caches and connections; it does not count.
    times=$(sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' "$out" | tail -n +2)
    MEDIAN[$target:$name:$ROUND]=$(median <<<"$times")
    ANSWER[$target:$name:$ROUND]=$(grep -v '^Time:' "$out" | grep -v '^SET$' | head -n 12 | md5sum | cut -c1-12)
    log "$target: $name (round $ROUND): median ${MEDIAN[$target:$name:$ROUND]} ms over $RUNS runs"
}

start_plain
start_tessera
pgbench_init plain "$PLAIN_PORT"
psql_at "$PLAIN_PORT" -c "$HISTORY_SQL" >/dev/null
psql_at "$PLAIN_PORT" -c "$ORDERS_SQL" >/dev/null
psql_at "$PLAIN_PORT" -c 'CREATE EXTENSION hll' >/dev/null
psql_at "$PLAIN_PORT" -c 'VACUUM ANALYZE' >/dev/null
pgbench_init tessera "$TESSERA_PORT"
distribute_pgbench_tables "$TESSERA_PORT"
psql_at "$TESSERA_PORT" -c "$HISTORY_SQL" >/dev/null
psql_at "$TESSERA_PORT" -c "$ORDERS_SQL" >/dev/null
psql_at "$TESSERA_PORT" -c "SELECT create_distributed_table('bench_orders', 'id', colocate_with => 'none')" >/dev/null
psql_at "$TESSERA_PORT" -c 'CREATE EXTENSION hll' >/dev/null
psql_at "$TESSERA_PORT" -c 'VACUUM ANALYZE pgbench_accounts, pgbench_tellers, pgbench_branches, pgbench_history, bench_orders' >/dev/null
for q in "${QUERIES[@]}"; do
    setting=${TESSERA_SETTING[$q]:-}
    psql_at "$TESSERA_PORT" -c "${setting:+$setting; }EXPLAIN (COSTS OFF) $(tessera_sql "$q")" >"$BENCH_LOG_DIR/tessera-$q-plan.txt" 2>&1 || true
done
for ((ROUND = 1; ROUND <= ROUNDS; ROUND++)); do
    for q in "${QUERIES[@]}"; do
        measure plain "$PLAIN_PORT" "$q"
        measure tessera "$TESSERA_PORT" "$q"
    done
done
stop_tessera
stop_plain

echo
printf 'Analytical queries, pgbench scale %s (32 shards, 2 workers), %s alternating rounds of %s runs, citus.max_adaptive_executor_pool_size %s\n' "$SCALE" "$ROUNDS" "$RUNS" "${POOL_SIZE:-default}"
printf '%-12s %12s %12s %20s %6s\n' query plain_ms tessera_ms ratio_min/med/max same
for q in "${QUERIES[@]}"; do
    plain_ms=() tessera_ms=() ratios=() same=yes
    for ((r = 1; r <= ROUNDS; r++)); do
        plain_ms+=("${MEDIAN[plain:$q:$r]}")
        tessera_ms+=("${MEDIAN[tessera:$q:$r]}")
        ratios+=("$(awk -v a="${MEDIAN[tessera:$q:$r]}" -v b="${MEDIAN[plain:$q:$r]}" 'BEGIN { printf "%.2f", a / b }')")
        [[ ${ANSWER[plain:$q:$r]} == "${ANSWER[tessera:$q:$r]}" ]] || same=no
    done
    sorted=$(printf '%s\n' "${ratios[@]}" | sort -g)
    printf '%-12s %12s %12s %20s %6s\n' "$q" "$(printf '%s\n' "${plain_ms[@]}" | median)" "$(printf '%s\n' "${tessera_ms[@]}" | median)" \
        "$(head -n 1 <<<"$sorted")/$(printf '%s\n' "${ratios[@]}" | median)/$(tail -n 1 <<<"$sorted")" "$same"
done
echo "(plain_ms, tessera_ms: medians over the rounds of each round's median. ratio = Tessera time / plain PostgreSQL time, per round: min/median/max; lower is better. same = identical answers in every round. Raw outputs and plans: $BENCH_LOG_DIR)"
