#!/usr/bin/env bash
# TPC-H through Tessera against a plain PostgreSQL 15 server holding the same
# data, measured in the same run, with go-tpc (github.com/pingcap/go-tpc
# v1.0.9, an outside driver) as the data generator, the source of the 22
# query texts and the checker of the answers.
#
# 1. go-tpc generates the data as |-separated files, once per scale factor
#    (kept in TPCH_DATA_DIR), and creates its tables on the plain server;
#    their DDL (pg_dump --schema-only, kept with the files) goes to Tessera,
#    where the tables are distributed (see LAYOUT below). Both targets COPY
#    the same files and get the same indexes on the foreign keys.
# 2. Each query (the PostgreSQL texts of go-tpc's tpch/query.go, read from the
#    Go module cache at run time) runs RUNS times per round on plain and then
#    on Tessera, for ROUNDS rounds; a round's median counts. Answers of the
#    two targets are compared row for row (md5 of psql's output). For Tessera
#    the script also records each query's plan (EXPLAIN, in BENCH_LOG_DIR),
#    the bytes the nodes sent the coordinator for it (one more run, under
#    EXPLAIN ANALYZE) and the coordinator's peak RSS while loading and while
#    the queries run.
# 3. `go-tpc tpch run --check` runs every query once on each target: at scale
#    factor 1 it checks the answers against the official results. Its
#    per-query times are reported beside ours.
#
# LAYOUT (Tessera, 32 shards): lineitem and orders are distributed by their
# order key and co-located, as the Citus documentation does for TPC-H.
#   star (default): the other six tables are reference tables (the dimension
#     tables of a star schema; 170 MB at scale factor 1 copied to each node).
#   partitioned: part and partsupp are distributed by their part key and
#     co-located, customer by its customer key, and only supplier, nation
#     and region are reference tables; joins between the two groups take
#     repartition joins or the general fallback.
# Environment: SF=1 (scale factor), LAYOUT=star, ROUNDS=3, RUNS=1, ONLY="q1 q6" (subset),
# TPCH_DATA_DIR (default ${TMPDIR:-/tmp}/tessera-tpch-sf$SF), GO_TPC (the
# go-tpc binary; default: on PATH or in $(go env GOPATH)/bin, else installed
# there with `go install`), CHECK=1 (run go-tpc's checked pass; 0 skips it),
# STATEMENT_TIMEOUT=600s (per query, both targets), BENCH_LOG_DIR,
# TESSERA_BIN, PG_BIN, TESSERA_START_TIMEOUT — as for bench/pgbench.sh.
# Quick smoke run from the repo root:
#   ROUNDS=1 ONLY="q1 q3 q6" CHECK=0 bench/tpch.sh
set -euo pipefail

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd -- "$SCRIPT_DIR/.." && pwd)

SF=${SF:-1}
RUNS=${RUNS:-1}
ROUNDS=${ROUNDS:-3}
CHECK=${CHECK:-1}
STATEMENT_TIMEOUT=${STATEMENT_TIMEOUT:-600s}
LAYOUT=${LAYOUT:-star}
GO_TPC_VERSION=v1.0.9
BENCH_ONLY_PLAIN=0

# shellcheck source=bench/lib.sh
source "$SCRIPT_DIR/lib.sh"

require_positive SF RUNS ROUNDS
TPCH_DATA_DIR=${TPCH_DATA_DIR:-${TMPDIR:-/tmp}/tessera-tpch-sf$SF}
ALL_QUERIES=(q1 q2 q3 q4 q5 q6 q7 q8 q9 q10 q11 q12 q13 q14 q15 q16 q17 q18 q19 q20 q21 q22)
read -r -a QUERIES <<<"${ONLY:-${ALL_QUERIES[*]}}"
TABLES=(nation region part supplier partsupp customer orders lineitem)

# ---------------------------------------------------------------- go-tpc

find_go_tpc() {
    if [[ -n ${GO_TPC:-} ]]; then
        [[ -x $GO_TPC ]] || die "GO_TPC=$GO_TPC is not an executable"
        return 0
    fi
    command -v go >/dev/null || die "go-tpc is not on PATH and there is no Go toolchain to install it (set GO_TPC)"
    local gobin
    gobin=$(go env GOPATH)/bin
    if command -v go-tpc >/dev/null; then
        GO_TPC=$(command -v go-tpc)
    elif [[ -x $gobin/go-tpc ]]; then
        GO_TPC=$gobin/go-tpc
    else
        log "installing go-tpc $GO_TPC_VERSION into $gobin"
        go install "github.com/pingcap/go-tpc/cmd/go-tpc@$GO_TPC_VERSION" >"$BENCH_LOG_DIR/go-install.log" 2>&1 ||
            die "go install go-tpc failed" "$BENCH_LOG_DIR/go-install.log"
        GO_TPC=$gobin/go-tpc
    fi
}

# The query texts come from the module source `go install` left in the
# module cache (fetched there with `go mod download` when missing).
query_source() {
    local dir
    dir=$(go env GOMODCACHE)/github.com/pingcap/go-tpc@$GO_TPC_VERSION
    if [[ ! -f $dir/tpch/query.go ]]; then
        (cd "$BENCH_LOG_DIR" && GOFLAGS=-mod=mod go mod download "github.com/pingcap/go-tpc@$GO_TPC_VERSION") >/dev/null 2>&1 ||
            die "could not download the go-tpc $GO_TPC_VERSION module source"
    fi
    echo "$dir/tpch/query.go"
}

# Writes $BENCH_LOG_DIR/queries/qN.sql for every query: the text between
# "qNpg = `" and the closing backquote.
extract_queries() {
    local src=$1 q
    mkdir -p -- "$BENCH_LOG_DIR/queries"
    for q in "${ALL_QUERIES[@]}"; do
        awk -v name="${q}pg" '
            !inside && $1 == name && $2 == "=" { inside = 1; sub(/^[^`]*`/, ""); if ($0 != "") print; next }
            inside && /`/ { sub(/`.*$/, ""); if ($0 != "") print; exit }
            inside { print }' "$src" >"$BENCH_LOG_DIR/queries/$q.sql"
        grep -qi 'select' "$BENCH_LOG_DIR/queries/$q.sql" || die "could not find the text of $q in $src"
    done
}

go_tpc_at() { # go_tpc_at PORT ARGS...
    local port=$1; shift
    # lib/pq sends keys it does not know as run-time parameters.
    "$GO_TPC" tpch "$@" -d postgres -H 127.0.0.1 -P "$port" -U postgres -D postgres --sf "$SF" \
        --conn-params "sslmode=disable&statement_timeout=$STATEMENT_TIMEOUT"
}

# ---------------------------------------------------------------- data

# The data files and go-tpc's DDL (pg_dump --schema-only of the tables it
# made on the plain server) are kept together; later runs create the tables
# from that DDL.
generate_data() {
    local schema=$TPCH_DATA_DIR/schema.sql
    if [[ -f $TPCH_DATA_DIR/complete && -f $schema ]]; then
        log "data: reusing the CSV files and DDL in $TPCH_DATA_DIR"
        psql_at "$PLAIN_PORT" -f "$schema" >"$BENCH_LOG_DIR/plain-schema.log" 2>&1 ||
            die "plain: creating the TPC-H tables failed" "$BENCH_LOG_DIR/plain-schema.log"
        return 0
    fi
    log "data: go-tpc generates scale factor $SF into $TPCH_DATA_DIR"
    rm -rf -- "$TPCH_DATA_DIR"
    mkdir -p -- "$TPCH_DATA_DIR"
    go_tpc_at "$PLAIN_PORT" prepare --output-type csv --output-dir "$TPCH_DATA_DIR" >"$BENCH_LOG_DIR/go-tpc-prepare.log" 2>&1 ||
        die "go-tpc prepare failed" "$BENCH_LOG_DIR/go-tpc-prepare.log"
    "$PG_BIN/pg_dump" -h 127.0.0.1 -p "$PLAIN_PORT" -U postgres --schema-only "${TABLES[@]/#/--table=}" postgres >"$schema" 2>"$BENCH_LOG_DIR/pg_dump.log" ||
        die "pg_dump --schema-only of the plain server failed" "$BENCH_LOG_DIR/pg_dump.log"
    touch -- "$TPCH_DATA_DIR/complete"
}

distribute_tables() { # distribute_tables PORT
    local out=$BENCH_LOG_DIR/tessera-distribute.log layout
    case $LAYOUT in
        star) layout="SELECT create_reference_table('part');
SELECT create_reference_table('partsupp');
SELECT create_reference_table('customer');" ;;
        partitioned) layout="SELECT create_distributed_table('part', 'p_partkey', colocate_with => 'none');
SELECT create_distributed_table('partsupp', 'ps_partkey', colocate_with => 'part');
SELECT create_distributed_table('customer', 'c_custkey', colocate_with => 'none');" ;;
        *) die "LAYOUT must be star or partitioned (got '$LAYOUT')" ;;
    esac
    log "tessera: distributing the tables ($LAYOUT layout)"
    psql_at "$1" -f - >"$out" 2>&1 <<SQL || die "tessera: distributing the TPC-H tables failed" "$out"
SET citus.shard_count = 32;
SELECT create_reference_table('nation');
SELECT create_reference_table('region');
SELECT create_reference_table('supplier');
SELECT create_distributed_table('orders', 'o_orderkey');
SELECT create_distributed_table('lineitem', 'l_orderkey', colocate_with => 'orders');
$layout
SQL
}

load_tables() { # load_tables TARGET PORT
    local target=$1 port=$2 table file
    for table in "${TABLES[@]}"; do
        file=$(ls -- "$TPCH_DATA_DIR"/*."$table".csv 2>/dev/null | head -n 1)
        [[ -n $file ]] || die "no CSV file for $table in $TPCH_DATA_DIR"
        log "$target: COPY $table"
        psql_at "$port" -c "\\copy $table FROM '$file' WITH (FORMAT csv, DELIMITER '|')" >>"$BENCH_LOG_DIR/$target-load.log" 2>&1 ||
            die "$target: loading $table failed" "$BENCH_LOG_DIR/$target-load.log"
    done
    # go-tpc creates primary keys only; these are the foreign-key indexes
    # TPC-H kits for PostgreSQL add (without them plain PostgreSQL runs Q17
    # and Q20 as a scan of lineitem per part, for minutes).
    log "$target: CREATE INDEX on the foreign keys"
    psql_at "$port" -f - >>"$BENCH_LOG_DIR/$target-load.log" 2>&1 <<'SQL' || die "$target: creating the indexes failed" "$BENCH_LOG_DIR/$target-load.log"
CREATE INDEX lineitem_l_partkey ON lineitem (l_partkey);
CREATE INDEX lineitem_l_suppkey ON lineitem (l_suppkey);
CREATE INDEX orders_o_custkey ON orders (o_custkey);
CREATE INDEX partsupp_ps_suppkey ON partsupp (ps_suppkey);
CREATE INDEX customer_c_nationkey ON customer (c_nationkey);
CREATE INDEX supplier_s_nationkey ON supplier (s_nationkey);
SQL
    # The whole database, every shard included on Tessera.
    psql_at "$port" -c "VACUUM ANALYZE" >>"$BENCH_LOG_DIR/$target-load.log" 2>&1 ||
        die "$target: VACUUM ANALYZE failed" "$BENCH_LOG_DIR/$target-load.log"
}

# ---------------------------------------------------------------- measuring

# Bytes the nodes sent the coordinator for query $1, as EXPLAIN ANALYZE
# reports them (rows of the shards' tasks, rows moved by a repartition); "-"
# for the general fallback, whose rows go to the coordinator database.
coord_bytes() {
    local plan=$BENCH_LOG_DIR/tessera-$1-analyze.txt
    if grep -q 'General Fallback' "$BENCH_LOG_DIR/tessera-$1-plan.txt" 2>/dev/null; then echo -; return 0; fi
    { echo "SET statement_timeout = '$STATEMENT_TIMEOUT';"; echo 'EXPLAIN (ANALYZE)'; cat -- "$BENCH_LOG_DIR/queries/$1.sql"; echo ';'; } |
        psql_at "$TESSERA_PORT" -At >"$plan" 2>&1 || { echo "?"; return 0; }
    # A repartition join's moved rows go node to node: not counted.
    awk 'match($0, /[0-9]+ bytes received from the nodes/) { split(substr($0, RSTART), w, " "); total += w[1] }
         END { print total + 0 }' "$plan"
}

coord_peak_rss_mb() {
    [[ -n $COORD_PID && -r /proc/$COORD_PID/status ]] || { echo "?"; return 0; }
    awk '$1 == "VmHWM:" { printf "%.0f", $2 / 1024 }' "/proc/$COORD_PID/status"
}

# Starts the coordinator's peak RSS over from its current RSS (Linux's
# clear_refs), so that the queries' peak is told apart from the loading's.
reset_coord_peak_rss() {
    [[ -n $COORD_PID && -w /proc/$COORD_PID/clear_refs ]] && echo 5 >"/proc/$COORD_PID/clear_refs" 2>/dev/null
}

declare -A MEDIAN=() ANSWER=() ROWSET=() BYTES=() FAILED=()

# measure TARGET PORT QUERY: the median wall time (ms) of RUNS runs in round $ROUND.
measure() {
    local target=$1 port=$2 q=$3 out times i
    out=$BENCH_LOG_DIR/$target-$q-round$ROUND.log
    {
        echo "SET statement_timeout = '$STATEMENT_TIMEOUT';"
        echo '\timing on'
        # The query's own closing semicolon is dropped: a second one would be
        # an empty statement of its own, timed and counted in the median.
        for ((i = 0; i < RUNS; i++)); do sed '$ s/;[[:space:]]*$//' -- "$BENCH_LOG_DIR/queries/$q.sql"; echo ';'; done
    } | psql_at "$port" -At >"$out" 2>&1 || {
        FAILED[$target:$q]=$(grep -m 1 'ERROR' "$out" || tail -n 1 "$out")
        log "$target: $q (round $ROUND) FAILED: ${FAILED[$target:$q]}"
        MEDIAN[$target:$q:$ROUND]=''
        return 0
    }
    times=$(sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' "$out")
    MEDIAN[$target:$q:$ROUND]=$(median <<<"$times")
    ANSWER[$target:$q:$ROUND]=$(grep -v '^Time:' "$out" | grep -v '^SET$' | md5sum | cut -c1-12)
    # Rows that tie on the ORDER BY may come in another order.
    ROWSET[$target:$q:$ROUND]=$(grep -v '^Time:' "$out" | grep -v '^SET$' | sort | md5sum | cut -c1-12)
    log "$target: $q (round $ROUND): median ${MEDIAN[$target:$q:$ROUND]} ms over $RUNS runs"
}

# go_tpc_checked TARGET PORT: one checked pass over the queries; its log.
go_tpc_checked() {
    local out=$BENCH_LOG_DIR/go-tpc-run-$1.log check=()
    [[ $SF -eq 1 ]] && check=(--check)
    log "$1: go-tpc tpch run ${check[*]} (each query once)"
    local queries
    queries=$(IFS=,; echo "${QUERIES[*]}")
    go_tpc_at "$2" run --queries "$queries" --count "${#QUERIES[@]}" --ignore-error "${check[@]}" \
        >"$out" 2>&1 || true
}

# "qN ms ok|failed" per query from a go-tpc run log: its summary lines read
# "[Summary] Q1: 1.23s"; a query whose check failed is named in a "check qN
# failed" error, and one that failed to run has no summary line.
go_tpc_summary() { # go_tpc_summary LOG
    awk '/^\[Summary\] Q[0-9]+: [0-9.]+s$/ { q = tolower($2); sub(/:$/, "", q); v = $3; sub(/s$/, "", v); ms[q] = v * 1000 }
         match($0, /check q[0-9]+ failed/) { split(substr($0, RSTART, RLENGTH), w, " "); bad[w[2]] = 1 }
         END { for (q in ms) print q, ms[q], (q in bad) ? "failed" : "ok" }' "$1"
}

find_go_tpc
extract_queries "$(query_source)"
start_plain
start_tessera
generate_data
psql_at "$TESSERA_PORT" -f "$TPCH_DATA_DIR/schema.sql" >"$BENCH_LOG_DIR/tessera-schema.log" 2>&1 ||
    die "tessera: creating the TPC-H tables failed" "$BENCH_LOG_DIR/tessera-schema.log"
distribute_tables "$TESSERA_PORT"
load_tables plain "$PLAIN_PORT"
load_tables tessera "$TESSERA_PORT"
LOAD_PEAK_RSS=$(coord_peak_rss_mb)
if reset_coord_peak_rss; then QUERY_PEAK_LABEL=queries; else QUERY_PEAK_LABEL='whole run'; fi
for q in "${QUERIES[@]}"; do
    psql_at "$TESSERA_PORT" -c "EXPLAIN (COSTS OFF) $(cat -- "$BENCH_LOG_DIR/queries/$q.sql")" >"$BENCH_LOG_DIR/tessera-$q-plan.txt" 2>&1 || true
done
for ((ROUND = 1; ROUND <= ROUNDS; ROUND++)); do
    for q in "${QUERIES[@]}"; do
        measure plain "$PLAIN_PORT" "$q"
        measure tessera "$TESSERA_PORT" "$q"
    done
done
for q in "${QUERIES[@]}"; do BYTES[$q]=$(coord_bytes "$q"); done
if [[ $CHECK -eq 1 ]]; then
    go_tpc_checked plain "$PLAIN_PORT"
    go_tpc_checked tessera "$TESSERA_PORT"
fi
PEAK_RSS=$(coord_peak_rss_mb)
stop_tessera
stop_plain

declare -A GO_MS=() GO_OK=()
if [[ $CHECK -eq 1 ]]; then
    for target in plain tessera; do
        while read -r q ms ok; do
            GO_MS[$target:$q]=$ms GO_OK[$target:$q]=$ok
        done < <(go_tpc_summary "$BENCH_LOG_DIR/go-tpc-run-$target.log")
    done
fi

echo
printf 'TPC-H scale factor %s (%s layout, 32 shards, 2 workers), %s alternating rounds of %s runs; coordinator peak RSS: loading %s MB, %s %s MB\n' \
    "$SF" "$LAYOUT" "$ROUNDS" "$RUNS" "$LOAD_PEAK_RSS" "$QUERY_PEAK_LABEL" "$PEAK_RSS"
printf '%-4s %10s %10s %18s %5s %12s %9s %16s %-13s\n' query plain_ms tessera_ms ratio_min/med/max same bytes_in fallback go-tpc_plain/tes go-tpc_checks
# "plain/tessera" outcomes of go-tpc's check of query $1.
go_checks() {
    if [[ $CHECK -ne 1 ]]; then echo -; return 0; fi
    echo "${GO_OK[plain:$1]:-failed}/${GO_OK[tessera:$1]:-failed}"
}
log_ratios=()
for q in "${QUERIES[@]}"; do
    plain_ms=() tessera_ms=() ratios=() same=yes
    for ((r = 1; r <= ROUNDS; r++)); do
        [[ -n ${MEDIAN[plain:$q:$r]:-} && -n ${MEDIAN[tessera:$q:$r]:-} ]] || { same=-; continue; }
        plain_ms+=("${MEDIAN[plain:$q:$r]}")
        tessera_ms+=("${MEDIAN[tessera:$q:$r]}")
        ratios+=("$(awk -v a="${MEDIAN[tessera:$q:$r]}" -v b="${MEDIAN[plain:$q:$r]}" 'BEGIN { printf "%.2f", a / b }')")
        if [[ ${ROWSET[plain:$q:$r]} != "${ROWSET[tessera:$q:$r]}" ]]; then
            same=no
        elif [[ ${ANSWER[plain:$q:$r]} != "${ANSWER[tessera:$q:$r]}" && $same == yes ]]; then
            same=ties
        fi
    done
    fallback=no
    grep -q 'General Fallback' "$BENCH_LOG_DIR/tessera-$q-plan.txt" 2>/dev/null && fallback=yes
    go="${GO_MS[plain:$q]:--}/${GO_MS[tessera:$q]:--}"
    if [[ ${#ratios[@]} -eq 0 ]]; then
        printf '%-4s %10s %10s %18s %5s %12s %9s %16s %-13s\n' "$q" - - "failed" - - "$fallback" "$go" "$(go_checks "$q")"
        continue
    fi
    sorted=$(printf '%s\n' "${ratios[@]}" | sort -g)
    med=$(printf '%s\n' "${ratios[@]}" | median)
    log_ratios+=("$med")
    printf '%-4s %10s %10s %18s %5s %12s %9s %16s %-13s\n' "$q" "$(printf '%s\n' "${plain_ms[@]}" | median)" "$(printf '%s\n' "${tessera_ms[@]}" | median)" \
        "$(head -n 1 <<<"$sorted")/$med/$(tail -n 1 <<<"$sorted")" "$same" "${BYTES[$q]:--}" "$fallback" "$go" "$(go_checks "$q")"
done
if [[ ${#log_ratios[@]} -gt 0 ]]; then
    printf 'geometric mean of the median ratios over %s queries: %s\n' "${#log_ratios[@]}" \
        "$(printf '%s\n' "${log_ratios[@]}" | awk '{ s += log($1) } END { printf "%.2f", exp(s / NR) }')"
fi
for q in "${QUERIES[@]}"; do
    if [[ -n ${FAILED[tessera:$q]:-} ]]; then printf 'tessera %s: %s\n' "$q" "${FAILED[tessera:$q]}"; fi
    if [[ -n ${FAILED[plain:$q]:-} ]]; then printf 'plain %s: %s\n' "$q" "${FAILED[plain:$q]}"; fi
done
echo "(ratio = Tessera time / plain PostgreSQL time per round: min/median/max, lower is better; same = identical rows in every round (ties: the same rows, but rows that tie on the ORDER BY came in another order); bytes_in = bytes the nodes sent the coordinator in one run, from EXPLAIN ANALYZE (- for the general fallback); fallback = EXPLAIN shows the general fallback; go-tpc = the per-query ms go-tpc reported on plain/Tessera, and whether its --check (scale factor 1 only) passed on each: a query that fails on both differs from the official answers in go-tpc itself. Raw outputs and plans: $BENCH_LOG_DIR)"
