#!/usr/bin/env bash
# Bulk loading: the same CSV file into a plain PostgreSQL 15 server with psql's
# \copy, and into the distributed pgbench_accounts (32 shards on 2 workers)
# three ways: \copy through the Tessera coordinator, `tessera load` straight to
# the workers, and `tessera load --compress zstd`. Measured in the same run.
#
# The file is 1,000,000 pgbench_accounts rows (SCALE=10) exported with
# COPY ... TO from the plain server after pgbench -i (about 100 MB of CSV).
# Every target loads into an empty pgbench_accounts with its primary key, as
# pgbench -i creates it; each loads RUNS times (TRUNCATE in between) and the
# median wall time counts. For the coordinator path the coordinator process's
# CPU time per load is reported; for tessera load, the bytes it sent to the
# workers.
#
# Environment: SCALE=10, RUNS=3, LOAD_JOBS=4, BENCH_LOG_DIR, TESSERA_BIN, PG_BIN,
# TESSERA_START_TIMEOUT — as for bench/pgbench.sh.
# Quick smoke run from the repo root:  SCALE=1 RUNS=1 bench/copy.sh
set -euo pipefail

SCALE=${SCALE:-10}
RUNS=${RUNS:-3}
LOAD_JOBS=${LOAD_JOBS:-4}
# shellcheck source=bench/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"
require_positive SCALE RUNS LOAD_JOBS

CSV=$BENCH_LOG_DIR/pgbench_accounts.csv
declare -A MEDIAN=() COORD_CPU=() SENT_MB=()

now() { date +%s.%N; }

# load TARGET PORT COMMAND...: runs COMMAND (which loads the file) RUNS times
# into an empty pgbench_accounts.
load() {
    local target=$1 port=$2 out=$BENCH_LOG_DIR/$1-copy.log times=() i start end before after cpu=() sent=()
    shift 2
    for ((i = 1; i <= RUNS; i++)); do
        psql_at "$port" -c 'TRUNCATE pgbench_accounts' >>"$out" 2>&1 || die "$target: TRUNCATE failed" "$out"
        psql_at "$port" -c 'CHECKPOINT' >>"$out" 2>&1 || true
        before=$(coord_ticks)
        start=$(now)
        "$@" >"$out.last" 2>&1 || { cat "$out.last" >>"$out"; die "$target: load failed" "$out"; }
        end=$(now)
        after=$(coord_ticks)
        cat "$out.last" >>"$out"
        times+=("$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.3f", b - a }')")
        if [[ -n $before && -n $after ]]; then cpu+=("$(awk -v a="$before" -v b="$after" -v hz="$CLK_TCK" 'BEGIN { printf "%.2f", (b - a) / hz }')"); fi
        sent+=("$(sed -n 's/.*, \([0-9.]*\) MB sent to the workers.*/\1/p' "$out.last")")
        log "$target: load $i: ${times[-1]} s"
    done
    local rows
    rows=$(psql_at "$port" -At -c 'SELECT count(*) FROM pgbench_accounts')
    [[ $rows == "$ROWS" ]] || die "$target: pgbench_accounts holds $rows rows after the load, expected $ROWS" "$out"
    MEDIAN[$target]=$(printf '%s\n' "${times[@]}" | median)
    if [[ ${#cpu[@]} -gt 0 ]]; then COORD_CPU[$target]=$(printf '%s\n' "${cpu[@]}" | median); fi
    if [[ -n ${sent[0]} ]]; then SENT_MB[$target]=${sent[0]}; fi
}

copy_with_psql() { # copy_with_psql PORT
    psql_at "$1" -c "\\copy pgbench_accounts FROM '$CSV' (FORMAT csv)"
}

start_plain
pgbench_init plain "$PLAIN_PORT"
log "plain: exporting pgbench_accounts to $CSV"
psql_at "$PLAIN_PORT" -c "\\copy pgbench_accounts TO '$CSV' (FORMAT csv)" >/dev/null || die "export failed"
ROWS=$(wc -l <"$CSV" | tr -d ' ')
BYTES=$(stat -c %s "$CSV")
log "file: $ROWS rows, $BYTES bytes"
load plain "$PLAIN_PORT" copy_with_psql "$PLAIN_PORT"
stop_plain

start_tessera
out=$BENCH_LOG_DIR/tessera-schema.log
# The same tables and primary keys as pgbench -i, without data.
"$PG_BIN/pgbench" -h 127.0.0.1 -p "$TESSERA_PORT" -U postgres -i -I dtp postgres >"$out" 2>&1 || die "tessera: pgbench -i -I dtp failed" "$out"
psql_at "$TESSERA_PORT" -c "SELECT create_distributed_table('pgbench_accounts', 'aid', shard_count => 32)" >>"$out" 2>&1 ||
    die "tessera: distributing pgbench_accounts failed" "$out"
load tessera "$TESSERA_PORT" copy_with_psql "$TESSERA_PORT"
# The coordinator process is not involved in these two.
load_tool() { "$TESSERA_BIN" load "$CSV" --table pgbench_accounts --format csv --jobs "$LOAD_JOBS" --port "$TESSERA_PORT" --config "$TESSERA_DIR/tessera.toml" "$@"; }
COORD_PID_SAVED=$COORD_PID
COORD_PID=
load tessera_load "$TESSERA_PORT" load_tool
load tessera_load_zstd "$TESSERA_PORT" load_tool --compress zstd
COORD_PID=$COORD_PID_SAVED
stop_tessera

rate() { awk -v n="$1" -v t="$2" 'BEGIN { printf "%.0f", n / t }'; }
mbps() { awk -v n="$1" -v t="$2" 'BEGIN { printf "%.1f", n / 1e6 / t }'; }
echo
printf 'COPY of %s pgbench_accounts rows (%s bytes of CSV) with psql \\copy, median of %s loads\n' "$ROWS" "$BYTES" "$RUNS"
printf '%-17s %10s %12s %8s %8s %16s %12s\n' target seconds rows/s MB/s ratio coordinator_cpu_s wire_MB
for t in plain tessera tessera_load tessera_load_zstd; do
    ratio=$(awk -v p="${MEDIAN[plain]}" -v t="${MEDIAN[$t]}" 'BEGIN { printf "%.2f", p / t }')
    printf '%-17s %10s %12s %8s %7sx %16s %12s\n' "$t" "${MEDIAN[$t]}" "$(rate "$ROWS" "${MEDIAN[$t]}")" "$(mbps "$BYTES" "${MEDIAN[$t]}")" "$ratio" "${COORD_CPU[$t]:-}" "${SENT_MB[$t]:-}"
done
echo "(ratio = throughput / plain PostgreSQL's; wire_MB = row data tessera load sent to the workers, compressed with zstd in the last row)"
for t in tessera tessera_load tessera_load_zstd; do
    echo "RESULT $t plain_s=${MEDIAN[plain]} ${t}_s=${MEDIAN[$t]} ratio=$(awk -v p="${MEDIAN[plain]}" -v t="${MEDIAN[$t]}" 'BEGIN { printf "%.2f", p / t }')${SENT_MB[$t]:+ wire_mb=${SENT_MB[$t]}}"
done
echo "(Raw outputs: $BENCH_LOG_DIR)"
