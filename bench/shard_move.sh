#!/usr/bin/env bash
# Shard moves on a Tessera cluster of two workers: how fast a shard group moves
# (MB/s, logical replication, the default mode) with no load and while pgbench
# TPC-B writes to that very group, and the longest a pgbench transaction took
# meanwhile (the write stall of the cut-over), against the longest in a run of
# the same length without a move.
#
# The pgbench tables are distributed with 2 shards each, so one shard group
# holds about half the data (SCALE=140: about 1 GB). Each round moves the group
# of pgbench_accounts' first shard to the other worker and back: once idle, once
# under load. After the runs: no failed transaction, and TPC-B's balances agree
# (sum of account, teller and branch balances equal the sum of history deltas).
#
# Environment:
#   SCALE=140          pgbench scale factor
#   ROUNDS=3           rounds (each: an idle move, a loaded move, a loaded run without a move)
#   DURATION=40        seconds of each pgbench run
#   CLIENTS=8          pgbench clients
#   BENCH_LOG_DIR=DIR  where raw outputs go (default: a new temp dir, kept)
#   TESSERA_BIN, PG_BIN, TESSERA_START_TIMEOUT as for bench/pgbench.sh
#
# Quick smoke run:  SCALE=2 ROUNDS=1 DURATION=10 bench/shard_move.sh
set -euo pipefail

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
SCALE=${SCALE:-140}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-40}
CLIENTS=${CLIENTS:-8}
source "$SCRIPT_DIR/lib.sh"
require_positive SCALE ROUNDS DURATION CLIENTS
[[ -x $TESSERA_BIN ]] || die "no coordinator binary at $TESSERA_BIN (cargo build --release)"

start_tessera
P=$TESSERA_PORT
log "tessera: pgbench tables with 2 shards each, scale $SCALE"
"$PG_BIN/pgbench" -h 127.0.0.1 -p "$P" -U postgres -i -I dt postgres >"$BENCH_LOG_DIR/init-tables.log" 2>&1 || die "pgbench -i -I dt failed" "$BENCH_LOG_DIR/init-tables.log"
psql_at "$P" -c "SET citus.shard_count = 2;
    SELECT create_distributed_table('pgbench_accounts', 'aid');
    SELECT create_distributed_table('pgbench_branches', 'bid');
    SELECT create_distributed_table('pgbench_tellers', 'tid');
    SELECT create_distributed_table('pgbench_history', 'aid');" >"$BENCH_LOG_DIR/distribute.log" 2>&1 || die "distributing failed" "$BENCH_LOG_DIR/distribute.log"
"$PG_BIN/pgbench" -h 127.0.0.1 -p "$P" -U postgres -i -I gp -s "$SCALE" postgres >"$BENCH_LOG_DIR/init-data.log" 2>&1 || die "pgbench -i -I gp failed" "$BENCH_LOG_DIR/init-data.log"

SHARD=$(psql_at "$P" -At -c "SELECT min(shardid) FROM pg_dist_shard WHERE logicalrelid = 'pgbench_accounts'::regclass")
# The worker holding the group now, and the bytes the group takes there.
placement() { psql_at "$P" -At -c "SELECT nodeport FROM citus_shards WHERE shardid = $SHARD"; }
group_bytes() { # group_bytes PORT
    local names
    names=$(psql_at "$P" -At -c "SELECT string_agg(quote_literal(format('%s_%s', s.logicalrelid::regclass, s.shardid)), ',')
        FROM pg_dist_shard s JOIN pg_dist_partition p USING (logicalrelid)
        WHERE p.colocationid = (SELECT colocationid FROM pg_dist_partition WHERE logicalrelid = 'pgbench_accounts'::regclass)
          AND s.shardindex = (SELECT shardindex FROM pg_dist_shard WHERE shardid = $SHARD)")
    psql_at "$1" -At -c "SELECT sum(pg_total_relation_size(n::regclass)) FROM unnest(ARRAY[$names]) n"
}
other_worker() { for w in $TS_WORKER_PORTS; do [[ $w == "$1" ]] || echo "$w"; done; }

# move: moves the group to the other worker; prints seconds and MB/s.
move() {
    local from to bytes start end
    from=$(placement)
    to=$(other_worker "$from")
    bytes=$(group_bytes "$from")
    start=$(date +%s.%N)
    psql_at "$P" -c "SELECT citus_move_shard_placement($SHARD, '127.0.0.1', $from, '127.0.0.1', $to)" >>"$BENCH_LOG_DIR/moves.log" 2>&1 || die "the move failed" "$BENCH_LOG_DIR/moves.log"
    end=$(date +%s.%N)
    awk -v s="$start" -v e="$end" -v b="$bytes" 'BEGIN { printf "%.1f %.1f %.0f\n", e - s, b / 1048576 / (e - s), b / 1048576 }'
}

# pgbench_run NAME [MOVE]: a TPC-B run; with MOVE, the group moves after 5 s.
# Prints the longest transaction (ms), failed transactions and TPS.
pgbench_run() {
    local name=$1 dir=$BENCH_LOG_DIR/$1 pid moved=
    mkdir -p "$dir"
    (cd "$dir" && "$PG_BIN/pgbench" -h 127.0.0.1 -p "$P" -U postgres -M prepared -c "$CLIENTS" -j 2 -T "$DURATION" -n -l postgres >"$dir/pgbench.out" 2>&1) &
    pid=$!
    if [[ ${2:-} == move ]]; then
        sleep 5
        moved=$(move)
    fi
    wait "$pid" || die "pgbench failed" "$dir/pgbench.out"
    local max failed tps
    max=$(cat "$dir"/pgbench_log.* | awk '{ if ($3 > m) m = $3 } END { printf "%.1f", m / 1000 }')
    failed=$(awk '/number of failed transactions/ { print $5 }' "$dir/pgbench.out")
    tps=$(awk '/^tps = / { printf "%.0f", $3 }' "$dir/pgbench.out")
    echo "$max ${failed:-0} $tps $moved"
}

IDLE=() LOADED=() STALL=() BASE=() FAILED=0
for ((r = 1; r <= ROUNDS; r++)); do
    read -r secs rate mb < <(move)
    log "round $r: idle move of $mb MB in $secs s: $rate MB/s"
    IDLE+=("$rate")
    read -r max failed tps < <(pgbench_run "round$r-base")
    log "round $r: pgbench without a move: longest transaction $max ms, $failed failed, $tps tps"
    BASE+=("$max"); FAILED=$((FAILED + failed))
    read -r max failed tps secs rate mb < <(pgbench_run "round$r-move" move)
    log "round $r: move of $mb MB under load in $secs s: $rate MB/s; longest transaction $max ms, $failed failed, $tps tps"
    LOADED+=("$rate"); STALL+=("$max"); FAILED=$((FAILED + failed))
done

balances=$(psql_at "$P" -At -c "SELECT (SELECT sum(abalance) FROM pgbench_accounts) = (SELECT coalesce(sum(delta), 0) FROM pgbench_history)
    AND (SELECT sum(tbalance) FROM pgbench_tellers) = (SELECT coalesce(sum(delta), 0) FROM pgbench_history)
    AND (SELECT sum(bbalance) FROM pgbench_branches) = (SELECT coalesce(sum(delta), 0) FROM pgbench_history)")
[[ $balances == t ]] || die "TPC-B balances disagree after the moves"
[[ $FAILED -eq 0 ]] || die "$FAILED pgbench transactions failed"

stats() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { printf "%s / %s / %s", v[1], (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2, v[NR] }'; }
echo
echo "shard group move, scale $SCALE (min / median / max over $ROUNDS rounds)"
echo "  move rate, idle             MB/s  $(stats "${IDLE[@]}")"
echo "  move rate, under TPC-B      MB/s  $(stats "${LOADED[@]}")"
echo "  longest transaction, move   ms    $(stats "${STALL[@]}")"
echo "  longest transaction, none   ms    $(stats "${BASE[@]}")"
echo "  failed transactions: 0; TPC-B balances agree; raw outputs in $BENCH_LOG_DIR"
