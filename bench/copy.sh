#!/usr/bin/env bash
# Bulk loading with COPY: psql's \copy of the same CSV file into a plain
# PostgreSQL 15 server and, through the Tessera coordinator, into the
# distributed pgbench_accounts (32 shards on 2 workers), measured in the same
# run.
#
# The file is 1,000,000 pgbench_accounts rows (SCALE=10) exported with
# COPY ... TO from the plain server after pgbench -i (about 100 MB of CSV).
# Both targets load into an empty pgbench_accounts with its primary key, as
# pgbench -i creates it; each target loads RUNS times (TRUNCATE in between)
# and the median wall time counts. For Tessera the coordinator process's CPU
# time per load is reported too.
#
# Environment: SCALE=10, RUNS=3, BENCH_LOG_DIR, TESSERA_BIN, PG_BIN,
# TESSERA_START_TIMEOUT — as for bench/pgbench.sh.
# Quick smoke run from the repo root:  SCALE=1 RUNS=1 bench/copy.sh
set -euo pipefail

SCALE=${SCALE:-10}
RUNS=${RUNS:-3}
# shellcheck source=bench/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"
require_positive SCALE RUNS

CSV=$BENCH_LOG_DIR/pgbench_accounts.csv
declare -A MEDIAN=() COORD_CPU=()

now() { date +%s.%N; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# load TARGET PORT: \copy the file RUNS times into an empty pgbench_accounts.
load() {
    local target=$1 port=$2 out=$BENCH_LOG_DIR/$1-copy.log times=() i start end before after cpu=()
    for ((i = 1; i <= RUNS; i++)); do
        psql_at "$port" -c 'TRUNCATE pgbench_accounts' >>"$out" 2>&1 || die "$target: TRUNCATE failed" "$out"
        psql_at "$port" -c 'CHECKPOINT' >>"$out" 2>&1 || true
        before=$(coord_ticks)
        start=$(now)
        psql_at "$port" -c "\\copy pgbench_accounts FROM '$CSV' (FORMAT csv)" >>"$out" 2>&1 || die "$target: \\copy failed" "$out"
        end=$(now)
        after=$(coord_ticks)
        times+=("$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.3f", b - a }')")
        if [[ -n $before && -n $after ]]; then cpu+=("$(awk -v a="$before" -v b="$after" -v hz="$CLK_TCK" 'BEGIN { printf "%.2f", (b - a) / hz }')"); fi
        log "$target: load $i: ${times[-1]} s"
    done
    local rows
    rows=$(psql_at "$port" -At -c 'SELECT count(*) FROM pgbench_accounts')
    [[ $rows == "$ROWS" ]] || die "$target: pgbench_accounts holds $rows rows after the load, expected $ROWS" "$out"
    MEDIAN[$target]=$(printf '%s\n' "${times[@]}" | median)
    if [[ ${#cpu[@]} -gt 0 ]]; then COORD_CPU[$target]=$(printf '%s\n' "${cpu[@]}" | median); fi
}

start_plain
pgbench_init plain "$PLAIN_PORT"
log "plain: exporting pgbench_accounts to $CSV"
psql_at "$PLAIN_PORT" -c "\\copy pgbench_accounts TO '$CSV' (FORMAT csv)" >/dev/null || die "export failed"
ROWS=$(wc -l <"$CSV" | tr -d ' ')
BYTES=$(stat -c %s "$CSV")
log "file: $ROWS rows, $BYTES bytes"
load plain "$PLAIN_PORT"
stop_plain

start_tessera
out=$BENCH_LOG_DIR/tessera-schema.log
# The same tables and primary keys as pgbench -i, without data.
"$PG_BIN/pgbench" -h 127.0.0.1 -p "$TESSERA_PORT" -U postgres -i -I dtp postgres >"$out" 2>&1 || die "tessera: pgbench -i -I dtp failed" "$out"
psql_at "$TESSERA_PORT" -c "SELECT create_distributed_table('pgbench_accounts', 'aid', shard_count => 32)" >>"$out" 2>&1 ||
    die "tessera: distributing pgbench_accounts failed" "$out"
load tessera "$TESSERA_PORT"
stop_tessera

rate() { awk -v n="$1" -v t="$2" 'BEGIN { printf "%.0f", n / t }'; }
mbps() { awk -v n="$1" -v t="$2" 'BEGIN { printf "%.1f", n / 1e6 / t }'; }
echo
printf 'COPY of %s pgbench_accounts rows (%s bytes of CSV) with psql \\copy, median of %s loads\n' "$ROWS" "$BYTES" "$RUNS"
printf '%-10s %10s %12s %8s %16s\n' target seconds rows/s MB/s coordinator_cpu_s
for t in plain tessera; do
    printf '%-10s %10s %12s %8s %16s\n' "$t" "${MEDIAN[$t]}" "$(rate "$ROWS" "${MEDIAN[$t]}")" "$(mbps "$BYTES" "${MEDIAN[$t]}")" "${COORD_CPU[$t]:-}"
done
ratio=$(awk -v p="${MEDIAN[plain]}" -v t="${MEDIAN[tessera]}" 'BEGIN { printf "%.2f", p / t }')
echo "ratio (Tessera throughput / plain PostgreSQL throughput): ${ratio}x"
echo "RESULT copy plain_s=${MEDIAN[plain]} tessera_s=${MEDIAN[tessera]} plain_mb_s=$(mbps "$BYTES" "${MEDIAN[plain]}") tessera_mb_s=$(mbps "$BYTES" "${MEDIAN[tessera]}") ratio=$ratio"
echo "(Raw outputs: $BENCH_LOG_DIR)"
