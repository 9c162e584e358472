#!/usr/bin/env bash
# What seeing the cluster costs, and how fast the dashboard answers.
#
# Stage 1: pgbench select-only (-S -M prepared -c 8 -j 2) against plain
# PostgreSQL and one Tessera cluster whose coordinator restarts between
# runs in two configurations, alternating (plain, on, off, plain, …) for
# $ROUNDS rounds:
#   on   statement and tenant statistics tracked ([stats] track = true),
#        the monitoring listener up, /metrics scraped every $SCRAPE_EVERY s
#        (15, Prometheus's usual interval; 0: not at all) and, with
#        DASHBOARD_OPEN=1, the dashboard's requests as an open page makes
#        them (/api/history every 2 s, /api/overview every 5 s)
#   off  [stats] track = false and no monitoring listener
# With BEFORE_BIN set (a `tessera` built before the statistics existed),
# a third target runs that binary on the `off` configuration: the price of
# what is always counted (latency histograms, counters).
# Prints TPS per target and round and on/off, min / median / max.
#
# Stage 2: the dashboard with $TABLES tables of $SHARDS_PER_TABLE shards
# each (1,000 shards by default): each of $LOADS loads fetches the page,
# then its two data requests at once, as the page does; prints the time of
# the whole load and of /api/overview, min / median / max.
#
# Environment: DURATION=30 ROUNDS=3 SCALE=10 TABLES=10 SHARDS_PER_TABLE=100
# LOADS=5 SCRAPE_EVERY=15 DASHBOARD_OPEN=0 BEFORE_BIN BENCH_LOG_DIR
# TESSERA_BIN PG_BIN (as bench/pgbench.sh).
set -euo pipefail

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
DURATION=${DURATION:-30}
ROUNDS=${ROUNDS:-3}
SCALE=${SCALE:-10}
TABLES=${TABLES:-10}
SHARDS_PER_TABLE=${SHARDS_PER_TABLE:-100}
LOADS=${LOADS:-5}
SCRAPE_EVERY=${SCRAPE_EVERY:-15}
DASHBOARD_OPEN=${DASHBOARD_OPEN:-0}

# shellcheck source=bench/lib.sh
source "$SCRIPT_DIR/lib.sh"
require_positive DURATION ROUNDS SCALE TABLES SHARDS_PER_TABLE LOADS

SCRAPER_PID=

# The two configurations, made from the one `tessera up` wrote.
configure_targets() {
    local config=$TESSERA_DIR/tessera.toml
    METRICS_LISTEN=$(sed -n 's/^metrics_listen = "\(.*\)"$/\1/p' "$config")
    [[ -n $METRICS_LISTEN ]] || die "tessera up wrote no metrics_listen" "$config"
    cp -- "$config" "$config.on"
    grep -v '^metrics_listen' "$config" | sed 's/^track = true$/track = false/' >"$config.off"
    grep -q '^track = false$' "$config.off" || die "no [stats] track line to turn off" "$config"
}

stop_scraper() {
    if [[ -n $SCRAPER_PID ]]; then kill "$SCRAPER_PID" 2>/dev/null || true; wait "$SCRAPER_PID" 2>/dev/null || true; SCRAPER_PID=; fi
}

# use_target on|off|before: the coordinator restarted on that configuration
# (and binary), the scraper running for `on`.
use_target() {
    local bin=$TESSERA_BIN config=$1
    stop_scraper
    [[ $1 == before ]] && { bin=$BEFORE_BIN; config=off; }
    restart_coordinator "$TESSERA_DIR/tessera.toml.$config" "$bin"
    if [[ $1 == on ]]; then
        (tick=0
        while true; do
            get() { curl -s -o /dev/null "http://$METRICS_LISTEN/$1" || true; }
            if ((SCRAPE_EVERY > 0 && tick % SCRAPE_EVERY == 0)); then get metrics; fi
            if ((DASHBOARD_OPEN && tick % 2 == 0)); then get api/history; fi
            if ((DASHBOARD_OPEN && tick % 5 == 0)); then get api/overview; fi
            sleep 1
            tick=$((tick + 1))
        done) &
        SCRAPER_PID=$!
    fi
}

trap 'rc=$?; stop_scraper; (exit $rc); cleanup' EXIT
command -v curl >/dev/null || die "curl is needed"
log "monitoring benchmark: SCALE=$SCALE DURATION=${DURATION}s ROUNDS=$ROUNDS SCRAPE_EVERY=$SCRAPE_EVERY DASHBOARD_OPEN=$DASHBOARD_OPEN cpus=$(nproc); raw outputs in $BENCH_LOG_DIR"
start_pgbench_targets
configure_targets
TARGETS=(on off)
[[ -n ${BEFORE_BIN:-} ]] && TARGETS+=(before)
for ((round = 1; round <= ROUNDS; round++)); do
    pgbench_round plain "$PLAIN_PORT" "$round" select -S
    for target in "${TARGETS[@]}"; do
        use_target "$target"
        pgbench_round "$target" "$TESSERA_PORT" "$round" select -S
    done
done

# Stage 2: the dashboard over many shards, the listener on.
use_target on
stop_scraper
log "tessera: $TABLES tables of $SHARDS_PER_TABLE shards"
for ((t = 1; t <= TABLES; t++)); do
    psql_at "$TESSERA_PORT" -c "CREATE TABLE dash_$t (id bigint PRIMARY KEY, v text)" \
        -c "SELECT create_distributed_table('dash_$t', 'id', shard_count => $SHARDS_PER_TABLE)" \
        -c "INSERT INTO dash_$t SELECT g, md5(g::text) FROM generate_series(1, 20000) g" >/dev/null
done
SHARDS=$(psql_at "$TESSERA_PORT" -Atc "SELECT count(*) FROM pg_dist_shard")
LOAD_TIMES=()
OVERVIEW_TIMES=()
for ((i = 1; i <= LOADS; i++)); do
    started=$(date +%s.%N)
    curl -s -o /dev/null "http://$METRICS_LISTEN/"
    overview=$( { curl -s -o /dev/null -w '%{time_total}\n' "http://$METRICS_LISTEN/api/overview" & curl -s -o /dev/null "http://$METRICS_LISTEN/api/history" & wait; } )
    ended=$(date +%s.%N)
    LOAD_TIMES+=("$(awk -v a="$started" -v b="$ended" 'BEGIN { printf "%.3f", b - a }')")
    OVERVIEW_TIMES+=("$overview")
    log "dashboard load $i: ${LOAD_TIMES[-1]} s (overview ${overview} s)"
done

echo
echo "pgbench select-only, scale $SCALE, 8 clients, ${DURATION} s x $ROUNDS rounds (tps by round)"
print_tps plain "${TARGETS[@]}"
echo "ratio to plain (min / median / max):"
for target in "${TARGETS[@]}"; do printf '  %-8s %s\n' "$target" "$(round_ratios "$target" plain)"; done
echo "on / off (min / median / max): $(round_ratios on off)"
[[ -n ${BEFORE_BIN:-} ]] && echo "off / before (min / median / max): $(round_ratios off before)"
echo "dashboard with $SHARDS shards: whole load $(printf '%s\n' "${LOAD_TIMES[@]}" | spread) s, /api/overview $(printf '%s\n' "${OVERVIEW_TIMES[@]}" | spread) s (min / median / max of $LOADS)"
