#!/usr/bin/env bash
# DDL speed as the schema grows: how long create_distributed_table,
# create_reference_table and ALTER TABLE … ADD COLUMN take on a Tessera
# cluster of two workers once LEVELS (default "100 500") distributed tables
# exist, with plain PostgreSQL's CREATE TABLE and ADD COLUMN on as many
# plain tables beside them, measured in the same run.
#
# At each level, SAMPLES (default 20) times: CREATE TABLE of an empty table
# (id bigint PRIMARY KEY, v text, n int), then timed
#   create_distributed_table   create_distributed_table(t, 'id', shard_count => 32)
#   add_column                 ALTER TABLE <that table> ADD COLUMN extra int
#   create_reference_table     create_reference_table on another such table
# Each statement is timed by psql (\timing) in one session per level, so
# connecting is not counted; the median, min and max over the samples are
# printed. The tables that fill the schema up to a level have the same
# columns, an index on n and 32 shards, and a few rows each; how long they
# took is printed too (their mean).
#
# ROUND_TRIPS=1 also logs every statement the coordinator database and the
# workers receive during one more sample of each kind (log_statement = all)
# and prints how many each node got: the round trips of that DDL.
#
# Environment:
#   LEVELS="100 500"   table counts to measure at, increasing
#   SAMPLES=20         samples per statement and level
#   ROUND_TRIPS=1      count each node's statements for one sample (0: skip)
#   BENCH_LOG_DIR, TESSERA_BIN, PG_BIN, TESSERA_START_TIMEOUT as for bench/pgbench.sh
#
# Quick smoke run:  LEVELS="5 10" SAMPLES=3 bench/ddl.sh
set -euo pipefail

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
LEVELS=${LEVELS:-100 500}
SAMPLES=${SAMPLES:-20}
ROUND_TRIPS=${ROUND_TRIPS:-1}
source "$SCRIPT_DIR/lib.sh"
require_positive SAMPLES
for level in $LEVELS; do
    is_uint "$level" || die "LEVELS must be table counts (got '$LEVELS')"
done

COLUMNS='id bigint PRIMARY KEY, v text, n int'

# timed TARGET PORT NAME: runs the psql script on stdin in one session with
# \timing; each statement to time is preceded by "\echo @ <label>". Prints
# "label ms" for each, in order; the raw output goes to the log.
timed() {
    local out=$BENCH_LOG_DIR/$1-$3.log
    { echo '\timing on'; cat; } | psql_at "$2" -At >"$out" 2>&1 || die "$1: $3 failed" "$out"
    awk '/^@ / { label = $2; next } /^Time: / && label != "" { print label, $2; label = "" }' "$out"
}

# stats LABEL: "median min max" of the times (ms) given for LABEL on stdin.
stats() {
    awk -v l="$1" '$1 == l { print $2 }' | sort -g | awk '{ v[NR] = $1 } END { if (!NR) { print "NA NA NA"; exit } printf "%.1f %.1f %.1f\n", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2, v[1], v[NR] }'
}

# fill TARGET PORT FROM TO: filler tables f<FROM+1> … f<TO>, with an index
# and 10 rows each (distributed on Tessera); prints the mean ms per table.
fill() {
    local target=$1 port=$2 from=$3 to=$4 i
    [[ $to -gt $from ]] || { echo NA; return 0; }
    for ((i = from + 1; i <= to; i++)); do
        echo "\\echo @ fill"
        echo "CREATE TABLE f$i ($COLUMNS);"
        echo "\\echo @ fill"
        echo "CREATE INDEX ON f$i (n);"
        if [[ $target == tessera ]]; then
            echo "\\echo @ fill"
            echo "SELECT create_distributed_table('f$i', 'id', shard_count => 32);"
        fi
        echo "\\echo @ fill"
        echo "INSERT INTO f$i SELECT g, 'row ' || g, g FROM generate_series(1, 10) g;"
    done | timed "$target" "$port" "fill-$to" | awk -v n=$((to - from)) '{ s += $2 } END { printf "%.1f\n", s / n }'
}

# samples TARGET PORT LEVEL: the timed statements at one level, as
# "label ms" lines.
samples() {
    local target=$1 port=$2 level=$3 s
    for ((s = 1; s <= SAMPLES; s++)); do
        echo "CREATE TABLE d${level}_$s ($COLUMNS);"
        if [[ $target == tessera ]]; then
            echo "\\echo @ create_distributed_table"
            echo "SELECT create_distributed_table('d${level}_$s', 'id', shard_count => 32);"
            echo "CREATE TABLE r${level}_$s ($COLUMNS);"
            echo "\\echo @ create_reference_table"
            echo "SELECT create_reference_table('r${level}_$s');"
        else
            echo "\\echo @ create_table"
            echo "CREATE TABLE p${level}_$s ($COLUMNS);"
        fi
        echo "\\echo @ add_column"
        echo "ALTER TABLE d${level}_$s ADD COLUMN extra int;"
    done | timed "$target" "$port" "samples-$level"
}

# Node name and port of each server of the Tessera cluster.
nodes() {
    echo "coordinator-db $TS_COORDINATOR_DB_PORT"
    local i=0 p
    for p in $TS_WORKER_PORTS; do
        i=$((i + 1))
        echo "worker-$i $p"
    done
}

# round_trips LEVEL: one more sample of each statement with every node
# logging its statements; prints "statement node=count …" lines.
round_trips() {
    local level=$1 node port sql label
    declare -A size=()
    for label in create_distributed_table add_column create_reference_table; do
        case $label in
            create_distributed_table) psql_at "$TESSERA_PORT" -c "CREATE TABLE rt$level ($COLUMNS)"; sql="SELECT create_distributed_table('rt$level', 'id', shard_count => 32)" ;;
            add_column) sql="ALTER TABLE rt$level ADD COLUMN extra int" ;;
            create_reference_table) psql_at "$TESSERA_PORT" -c "CREATE TABLE rr$level ($COLUMNS)"; sql="SELECT create_reference_table('rr$level')" ;;
        esac
        while read -r node port; do
            psql_at "$port" -c "ALTER SYSTEM SET log_statement = 'all'" -c "SELECT pg_reload_conf()" >/dev/null
            size[$node]=$(stat -c %s "$TESSERA_DIR/$node/server.log")
        done < <(nodes)
        sleep 0.5
        psql_at "$TESSERA_PORT" -c "$sql" >/dev/null
        sleep 0.5
        local counts=""
        while read -r node port; do
            psql_at "$port" -c "ALTER SYSTEM RESET log_statement" -c "SELECT pg_reload_conf()" >/dev/null
            counts+=" $node=$(tail -c +$((size[$node] + 1)) "$TESSERA_DIR/$node/server.log" | grep -c 'LOG:  statement: ' || true)"
        done < <(nodes)
        echo "$label$counts"
    done
}

start_plain
start_tessera

declare -A RESULT=() FILL=() TRIPS=()
previous=0
for level in $LEVELS; do
    [[ $level -ge $previous ]] || die "LEVELS must increase (got '$LEVELS')"
    log "filling up to $level tables"
    FILL[plain:$level]=$(fill plain "$PLAIN_PORT" "$previous" "$level")
    FILL[tessera:$level]=$(fill tessera "$TESSERA_PORT" "$previous" "$level")
    log "$SAMPLES samples at $level tables"
    plain=$(samples plain "$PLAIN_PORT" "$level")
    tessera=$(samples tessera "$TESSERA_PORT" "$level")
    for label in create_table add_column; do RESULT[plain:$level:$label]=$(stats "$label" <<<"$plain"); done
    for label in create_distributed_table create_reference_table add_column; do RESULT[tessera:$level:$label]=$(stats "$label" <<<"$tessera"); done
    if [[ $ROUND_TRIPS == 1 ]]; then
        TRIPS[$level]=$(round_trips "$level")
    fi
    previous=$level
done

echo
echo "DDL on an empty table, ms (median / min / max of $SAMPLES), 2 workers, 32 shards"
printf '%-8s %-8s %-26s %10s %10s %10s\n' tables target statement median min max
for level in $LEVELS; do
    for key in plain:create_table plain:add_column tessera:create_distributed_table tessera:create_reference_table tessera:add_column; do
        target=${key%%:*} label=${key#*:}
        read -r med min max <<<"${RESULT[$target:$level:$label]}"
        printf '%-8s %-8s %-26s %10s %10s %10s\n' "$level" "$target" "$label" "$med" "$min" "$max"
        echo "RESULT tables=$level target=$target statement=$label median_ms=$med min_ms=$min max_ms=$max" >>"$BENCH_LOG_DIR/results"
    done
    echo "         filling to $level: plain ${FILL[plain:$level]} ms per table, tessera ${FILL[tessera:$level]} ms per table (create, index, distribute, 10 rows)"
    if [[ -n ${TRIPS[$level]:-} ]]; then
        echo "         statements received per node, one sample at $level tables:"
        sed 's/^/           /' <<<"${TRIPS[$level]}"
    fi
done
echo
cat "$BENCH_LOG_DIR/results"
echo "raw outputs in $BENCH_LOG_DIR"
